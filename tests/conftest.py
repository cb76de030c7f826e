"""Shared test set-up: keep Ray and every state file inside the test session's temporary folders."""

from __future__ import annotations

import os
import socket
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from tests.unit._registry import registries_kept

# Ray started by tests runs without token authentication and without usage reporting.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# A deployment a test makes (in this process or in a CLI subprocess, which inherits this) waits up
# to 5 minutes for its agents to serve: `make test` runs three workers on two cores, each with Ray
# and agents of its own, and CI's machine is shared, so an agent's start took over the default
# 60 s there (four processes importing the stack at once). The default is for a machine doing one
# thing; a test of the timeout itself sets its own.
os.environ.setdefault("STRATAGEM_DEPLOY_TIMEOUT_S", "300")


@pytest.fixture(autouse=True)
def _registries_unchanged() -> Iterator[None]:
    """What a test's extensions register in this process (roles, capabilities, agents, imported
    extension modules) is undone after it: an extension imported by one test (say the critic, to
    read its capability) must not make every later test's deployment expect a fifth agent."""
    with registries_kept():
        yield


# --- Kinds of test -------------------------------------------------------------------------------
# A test's kind is the folder it sits in: tests/unit (no sockets, no Ray: tests/unit/conftest.py
# guards that), tests/integration (real gRPC on 127.0.0.1, real Ray), tests/e2e (the CLI as a
# subprocess), tests/cluster (a Ray cluster of three nodes: integration). The marker of that kind is
# added here, so `-m unit`, `-m integration` and `-m e2e` select by folder; a test marked with
# another kind than its folder's stops the run, naming it.

KINDS = ("unit", "integration", "e2e")
_KIND_OF_FOLDER = {
    "unit": "unit",
    "integration": "integration",
    "e2e": "e2e",
    "cluster": "integration",
}
_TESTS = Path(__file__).resolve().parent


def kind_of(path: Path, tests: Path = _TESTS) -> str | None:
    """The kind of the tests in ``path`` (under ``tests``), or None outside the kinds' folders."""
    try:
        folder = path.resolve().relative_to(tests.resolve()).parts[0]
    except (ValueError, IndexError):
        return None
    return _KIND_OF_FOLDER.get(folder)


def mark_kinds(items: list[pytest.Item], tests: Path = _TESTS) -> list[str]:
    """Add each item's kind marker (its folder under ``tests``); return the misfiled tests."""
    misfiled: list[str] = []
    for item in items:
        kind = kind_of(item.path, tests)
        if kind is None:
            continue
        declared = {mark.name for mark in item.iter_markers() if mark.name in KINDS} - {kind}
        if declared:
            misfiled.append(
                f"{item.nodeid} is marked {', '.join(sorted(declared))} ({kind} folder)"
            )
        item.add_marker(kind)
    return misfiled


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    misfiled = mark_kinds(items)
    if misfiled:
        raise pytest.UsageError(
            "tests marked with another kind than their folder's (move them):\n  "
            + "\n  ".join(misfiled)
        )


# --- PostgreSQL ---------------------------------------------------------------------------------
# Tests marked ``postgres`` run the stores against a real server: STRATAGEM_TEST_PG_URL when set,
# otherwise a throwaway cluster from scripts/postgres.sh, started once per session and stopped at
# its end (unless it was running already). Each test gets a database of its own.

_POSTGRES_SH = Path(__file__).resolve().parent.parent / "scripts" / "postgres.sh"


def _reachable(url: str) -> bool:
    try:
        psycopg.connect(url, connect_timeout=3).close()
    except psycopg.Error:
        return False
    return True


def _no_postgres(reason: str) -> None:
    message = f"PostgreSQL is not available: {reason}"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The URL of a PostgreSQL server whose user may create databases."""
    url = os.environ.get("STRATAGEM_TEST_PG_URL")
    if url:
        if not _reachable(url):
            _no_postgres(f"STRATAGEM_TEST_PG_URL={url} cannot be reached")
        yield url
        return
    script = ["bash", str(_POSTGRES_SH)]
    url = subprocess.run([*script, "url"], capture_output=True, text=True).stdout.strip()
    if url and _reachable(url):  # someone else's cluster: use it, leave it running
        yield url
        return
    try:
        started = subprocess.run(
            [*script, "start"], capture_output=True, text=True, timeout=600, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        _no_postgres(f"scripts/postgres.sh start failed: {exc}")
    if started.returncode != 0:
        _no_postgres(f"scripts/postgres.sh start failed: {started.stderr.strip()[-800:]}")
    url = started.stdout.strip().splitlines()[-1]
    try:
        yield url
    finally:
        subprocess.run([*script, "stop"], capture_output=True, timeout=120, check=False)


@contextmanager
def fresh_database(server: str) -> Iterator[str]:
    """A new, empty database on ``server`` (its connection string), dropped afterwards."""
    name = f"stratagem_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_conninfo(server, dbname=name)
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    """A connection string to a fresh, empty database, dropped after the test."""
    with fresh_database(postgres_server) as url:
        yield url


_MODEL_SH = Path(__file__).resolve().parents[1] / "scripts" / "model_server.sh"


def _no_model_server(reason: str) -> None:
    message = f"the embedded model server is not available: {reason}"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def model_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The embedded model server (llama.cpp's OpenAI-compatible server, Gemma 3 270M): its
    ``url`` and ``model``. ``STRATAGEM_TEST_MODEL_URL`` names one already running; otherwise
    scripts/model_server.sh installs it (built once per machine under ~/.cache/stratagem) and
    starts one on a free port for this session, stopped by its PID at the end."""
    url = os.environ.get("STRATAGEM_TEST_MODEL_URL")
    if url:
        yield {"url": url, "model": os.environ.get("STRATAGEM_TEST_MODEL", "gemma-3-270m")}
        return
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        **os.environ,
        "MODEL_SERVER_DIR": str(tmp_path_factory.mktemp("model-server")),
        "MODEL_SERVER_PORT": str(port),
    }
    script = ["bash", str(_MODEL_SH)]
    try:
        started = subprocess.run(
            [*script, "start"], capture_output=True, text=True, timeout=1800, env=env, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        _no_model_server(f"scripts/model_server.sh start failed: {exc}")
    if started.returncode != 0:
        _no_model_server(f"scripts/model_server.sh start failed: {started.stderr.strip()[-800:]}")
    try:
        yield {"url": f"http://127.0.0.1:{port}/v1", "model": "gemma-3-270m"}
    finally:
        subprocess.run([*script, "stop"], capture_output=True, timeout=120, env=env, check=False)
