"""The perception world in PostgreSQL: an agent restarted on another node reads it back."""

from __future__ import annotations

from pathlib import Path

import pytest

from stratagem.agents import PerceptionAgent
from stratagem.protocol import ExtractEntitiesRequest, UpdateWorldStateRequest
from stratagem.runtime.config._settings import load_settings
from stratagem.runtime.config._stores import open_world_store
from tests.unit.agents.conftest import call, load_goal
from tests.unit.agents.test_perception import MOVE, extract, r

pytestmark = pytest.mark.postgres

# psycopg (the postgres extra, with libpq) is imported by the tests that need it, so collecting
# this module never needs it.


async def test_the_world_survives_a_restart_on_another_node(
    postgres_url: str, tmp_path: Path
) -> None:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    from stratagem.agents._world._postgres import PostgresWorldStore

    parts = conninfo_to_dict(postgres_url)
    url = f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"
    node_a = load_settings(state_dir=tmp_path / "a", store_url=url)
    store = open_world_store(node_a, "perception")
    assert isinstance(store, PostgresWorldStore)
    assert store.load() is None
    agent = PerceptionAgent(world_store=store)
    await extract(agent, load_goal("crown").passage)
    await agent.handle(
        "UpdateWorldState",
        UpdateWorldStateRequest(actions=[MOVE]),
        call("UpdateWorldState", "perception"),
    )
    facts, version = agent.world.facts(), agent.world.version
    store.close()
    # Another node: an empty state dir, the same database.
    node_b = load_settings(state_dir=tmp_path / "b", store_url=url)
    again = PerceptionAgent(world_store=open_world_store(node_b, "perception"))
    assert again.world.facts() == facts
    assert again.world.version == version
    assert again.world.holds(r("mira", "at", "garden"))
    assert not (tmp_path / "a").exists()  # nothing was written on the node
    # Each agent's worlds are rows in its own schema, one per world.
    await agent.handle(
        "ExtractEntities",
        ExtractEntitiesRequest(text="Tom waits in the hut.", world="tale"),
        call("ExtractEntities", "perception"),
    )
    with psycopg.connect(postgres_url) as conn:
        rows = conn.execute("SELECT name FROM stratagem_perception.worlds ORDER BY name").fetchall()
    assert rows == [("default",), ("tale",)]
    assert open_world_store(node_b, "perception").names() == ["default", "tale"]


def test_a_version_1_world_becomes_the_default_world(postgres_url: str) -> None:
    import psycopg

    from stratagem.agents._world._postgres import PostgresWorldStore

    # The schema as version 1 left it: one world in one row of "world".
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA stratagem_perception")
        conn.execute(
            "CREATE TABLE stratagem_perception.schema_versions "
            "(component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
        )
        conn.execute("INSERT INTO stratagem_perception.schema_versions VALUES ('world', 1)")
        conn.execute(
            "CREATE TABLE stratagem_perception.world (id SMALLINT PRIMARY KEY CHECK (id = 1), "
            "version INTEGER NOT NULL, snapshot TEXT NOT NULL, "
            "saved_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        conn.execute(
            "INSERT INTO stratagem_perception.world (id, version, snapshot) "
            """VALUES (1, 1, '{"version": 3, "facts": []}')"""
        )
    store = PostgresWorldStore(postgres_url, schema="stratagem_perception")
    assert store.load() == {"version": 3, "facts": []}
    assert store.names() == ["default"]
    store.close()


def test_a_lost_connection_is_reopened(postgres_url: str) -> None:
    import psycopg

    from stratagem.agents._world._postgres import PostgresWorldStore

    store = PostgresWorldStore(postgres_url, schema="stratagem_perception")
    store.save({"facts": [1]})
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE pid <> pg_backend_pid() AND datname = current_database()"
        )
    store.save({"facts": [2]})
    assert store.load() == {"facts": [2]}
    store.close()
