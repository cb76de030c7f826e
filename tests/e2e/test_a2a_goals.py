"""A goal file that consults an external A2A agent, submitted with the CLI: ``stratagem up`` with
``STRATAGEM_A2A_AGENTS`` naming a plain ``a2a-sdk`` agent this test serves, then ``stratagem
submit`` of a goal file with ``consult:``. The agents run in their Ray actors; the consultation
travels over A2A to the test's agent; ``submit`` shows what it answered."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.e2e.test_cli import EXAMPLES, run
from tests.integration.a2a_peer import EchoAgent

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TOKEN = "reviewer-token-not-to-be-logged"


@dataclass
class Served:
    state_dir: Path
    echo: EchoAgent


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The echo agent on an event loop of its own, and a deployment whose orchestrator knows it
    as ``reviewer`` (with a bearer token)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    echo = EchoAgent()
    url = asyncio.run_coroutine_threadsafe(echo.start(), loop).result(30)
    state_dir = tmp_path_factory.mktemp("consulting")
    agents = json.dumps({"reviewer": {"url": url, "skill": "echo", "token": TOKEN}})
    try:
        up = run("up", "--json", state_dir=state_dir, STRATAGEM_A2A_AGENTS=agents)
        assert up.returncode == 0, up.stderr[-2000:]
        try:
            yield Served(state_dir, echo)
        finally:
            down = run("down", "--json", state_dir=state_dir)
            assert down.returncode == 0, down.stderr[-2000:]
    finally:
        asyncio.run_coroutine_threadsafe(echo.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


def _goal_file(folder: Path, name: str, **fields: object) -> Path:
    goal = yaml.safe_load((EXAMPLES / "crown.yaml").read_text(encoding="utf-8"))
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**goal, **fields}), encoding="utf-8")
    return path


def test_submit_consults_the_external_agent_and_shows_its_answer(
    served: Served, tmp_path: Path
) -> None:
    goal = _goal_file(tmp_path, "consulted", consult=["reviewer"], plan_id="goal-consulted")
    result = run("submit", str(goal), "--json", state_dir=served.state_dir)
    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads(result.stdout)
    assert out["status"] == "succeeded"
    (consulted,) = out["response"]["consultations"]
    assert (consulted["agent"], consulted["status"], consulted["state"]) == (
        "reviewer",
        "answered",
        "completed",
    )
    assert consulted["text"].startswith("Goal: Mira recovers the silver crown")
    data = json.loads(consulted["data_json"])
    assert [b["id"] for b in data["beats"]] == [b["id"] for b in out["response"]["beats"]]
    assert served.echo.seen.message_ids == ["goal-consulted@1:consult_reviewer"]
    # The orchestrator's plan shows the step; the audit log has the call, never the token.
    (plan,) = [p for p in out["plans"] if p["plan_id"] == "goal-consulted"]
    steps = {s["id"]: s["status"] for s in plan["plan"]["steps"]}
    assert (steps["consult_reviewer"], steps["waive_reviewer"]) == ("succeeded", "skipped")
    with sqlite3.connect(served.state_dir / "audit.sqlite3") as db:
        rows = db.execute(
            "SELECT action, code FROM audit WHERE target = 'a2a:reviewer' ORDER BY seq"
        ).fetchall()
        everything = " ".join(str(row) for row in db.execute("SELECT * FROM audit"))
    assert rows == [("a2a.sent", ""), ("a2a.outcome", "OK")]
    assert TOKEN not in everything
    assert TOKEN not in result.stdout + result.stderr

    shown = run(
        "submit",
        str(_goal_file(tmp_path, "shown", consult=["reviewer"])),
        state_dir=served.state_dir,
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "Consultations (external A2A agents)" in shown.stdout
    # A row: the agent, its status and the start of what it said.
    assert re.search(r"reviewer\W+answered\W+Goal: Mira recovers", shown.stdout), shown.stdout


def test_an_unknown_agent_is_refused_in_one_line(served: Served, tmp_path: Path) -> None:
    goal = _goal_file(tmp_path, "unknown", consult=["oracle"], plan_id="goal-oracle")
    result = run("submit", str(goal), "--json", state_dir=served.state_dir)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: goal refused: the goal consults 'oracle': not an external A2A agent of the "
        "orchestrator (configured in STRATAGEM_A2A_AGENTS: reviewer)"
    ]
    assert "goal-oracle@1:consult_oracle" not in served.echo.seen.message_ids
