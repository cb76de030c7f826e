"""Issue 23, as a user meets it on the command line: a planted state directory is refused and its
endpoint gets nothing, a stopped agent is UNAVAILABLE by name, and ``submit`` never changes a
deployment it did not start (an agent that gave up is named, not redeployed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_cli import EXAMPLES, REPO, STRATAGEM

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

NOBODY = 65534
CROWN = str(EXAMPLES / "crown.yaml")
EXTRACT = json.dumps({"text": "Mira waits in the courtyard."})

# A gRPC server standing at a planted endpoint: it writes one JSON line per call it receives
# (method and metadata) to the file named by argv[1] and answers UNIMPLEMENTED.
RECORDER = """
import asyncio, json, sys
import grpc

class Everything(grpc.GenericRpcHandler):
    def service(self, details):
        async def handle(request, context):
            with open(sys.argv[1], "a") as out:
                out.write(json.dumps({"method": details.method,
                    "metadata": dict(details.invocation_metadata)}) + "\\n")
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "recorded")
        return grpc.unary_unary_rpc_method_handler(handle)

async def main():
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((Everything(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()

asyncio.run(main())
"""


def run(
    *args: str, cwd: Path = REPO, timeout: float = 240, **env: str
) -> subprocess.CompletedProcess[str]:
    merged = {k: v for k, v in os.environ.items() if not k.startswith("STRATAGEM_")}
    merged.pop("RAY_ADDRESS", None)
    merged.update(COLUMNS="160", RAY_AUTH_MODE="disabled", **env)
    return subprocess.run(
        [STRATAGEM, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=merged,
        check=False,
        cwd=cwd,
    )


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


# -- a planted state directory ---------------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="planting a folder of another user needs root")
def test_a_planted_state_directory_is_refused_and_its_endpoint_receives_nothing(
    tmp_path: Path,
) -> None:
    calls = tmp_path / "calls.jsonl"
    recorder = subprocess.Popen(
        [sys.executable, "-c", RECORDER, str(calls)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert recorder.stdout is not None
        port = int(recorder.stdout.readline())
        # Someone else's folder above the user's project, with everything a deployment records.
        planted = tmp_path / "shared" / ".stratagem"
        (planted / "endpoints").mkdir(parents=True)
        for role in ("perception", "strategic", "tactical", "orchestrator"):
            record = {"endpoint": f"127.0.0.1:{port}", "pid": recorder.pid}
            (planted / "endpoints" / f"{role}.json").write_text(json.dumps(record))
        (planted / "local-ray.json").write_text(
            json.dumps({"address": f"127.0.0.1:{port}", "pid": recorder.pid})
        )
        (planted / "ray.token").write_text("planted")
        for path in [planted, *planted.rglob("*")]:
            os.chown(path, NOBODY, NOBODY)
        project = tmp_path / "shared" / "project"
        project.mkdir()
        refusal = (
            f"error: refusing the state directory {planted}: it belongs to nobody, not to you "
            "(a folder someone else made can plant endpoints and Ray addresses); pass "
            "--state-dir or STRATAGEM_STATE_DIR naming a folder of your own"
        )
        for command in (
            ("request", "perception", "ExtractEntities", "--json", EXTRACT),
            ("status", "--json"),
            ("submit", CROWN),
            ("down",),
        ):
            result = run(*command, cwd=project, timeout=60)
            assert result.returncode == 2, (command, result.stderr[-2000:])
            assert _lines(result.stderr) == [refusal], command
        assert not calls.exists(), calls.read_text()  # no token, no payload, not even a call
        assert recorder.poll() is None  # down signalled nothing
    finally:
        recorder.kill()
        recorder.wait()


# -- a deployment of the test's own ---------------------------------------------------------------


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    state = tmp_path_factory.mktemp("h23")
    up = run("up", "--json", STRATAGEM_STATE_DIR=str(state), STRATAGEM_MAX_RESTARTS="1")
    try:
        assert up.returncode == 0, up.stderr[-2000:]
        yield state
    finally:
        down = run("down", "--json", STRATAGEM_STATE_DIR=str(state))
        assert down.returncode == 0, down.stderr[-2000:]


def _status(state: Path) -> tuple[int, dict[str, dict[str, object]]]:
    result = run("status", "--json", STRATAGEM_STATE_DIR=str(state), timeout=120)
    return result.returncode, {a["role"]: a for a in json.loads(result.stdout)["agents"]}


def test_a_command_without_a_deployment_says_so_and_starts_none(tmp_path: Path) -> None:
    result = run(
        "request", "perception", "ExtractEntities", "--json", EXTRACT,
        STRATAGEM_STATE_DIR=str(tmp_path), timeout=120,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-2000:]
    assert _lines(result.stderr) == [
        "error: no Stratagem deployment found: run 'stratagem up' or pass --address "
        "(--embedded runs agents of this command's own)"
    ]
    assert not (tmp_path / "audit.sqlite3").exists()  # no agent ran
    # Asked for, agents of the command's own answer it, and are gone after.
    embedded = run(
        "request", "perception", "ExtractEntities", "--json", EXTRACT, "--embedded",
        "--timeout", "200",  # starting Ray and the agents counts: CI's machine is shared
        STRATAGEM_STATE_DIR=str(tmp_path), timeout=240,
    )  # fmt: skip
    assert embedded.returncode == 0, embedded.stderr[-2000:]
    assert "mira" in {entity["id"] for entity in json.loads(embedded.stdout)["entities"]}
    assert not (tmp_path / "local-ray.json").exists()


def test_an_embedded_run_is_refused_where_a_deployment_runs(deployed: Path) -> None:
    result = run(
        "submit", CROWN, "--json", "--embedded", STRATAGEM_STATE_DIR=str(deployed), timeout=120
    )
    assert result.returncode == 1, result.stderr[-2000:]
    [line] = _lines(result.stderr)
    assert line.startswith(f"error: a deployment runs on the state directory {deployed} (local")
    assert line.endswith("use it without --embedded, or give the embedded run another --state-dir")


def test_a_stopped_agent_is_unavailable_by_name_within_the_timeout(deployed: Path) -> None:
    _, agents = _status(deployed)
    tactical = int(str(agents["tactical"]["pid"]))
    os.kill(tactical, signal.SIGSTOP)
    try:
        sequence = json.dumps(
            {
                "beat": {
                    "id": "b",
                    "title": "t",
                    "goals": [{"subject": "mira", "predicate": "at", "object": "garden"}],
                },
                "facts": [{"subject": "mira", "predicate": "at", "object": "courtyard"}],
                "max_depth": 2,
            }
        )
        request = run(
            "request", "tactical", "PlanExecutionSequence", "--json", sequence, "--timeout", "8",
            STRATAGEM_STATE_DIR=str(deployed), timeout=120,
        )  # fmt: skip
        assert request.returncode == 1, request.stderr[-2000:]
        [line] = _lines(request.stderr)  # one line: no gRPC core lines, no traceback
        assert line.startswith(
            f"error: UNAVAILABLE: agent tactical at {agents['tactical']['endpoint']} does not "
            "answer: no answer within 4 s"
        ), line
        submit = run(
            "submit", CROWN, "--json", "--timeout", "60",
            STRATAGEM_STATE_DIR=str(deployed), timeout=180,
        )  # fmt: skip
        assert submit.returncode == 1, submit.stderr[-2000:]
        [line] = _lines(submit.stderr)
        assert line == (
            "error: UNAVAILABLE: not answering: tactical (not answering, Ray: alive)"
        ), line
        assert "Failed to create channel" not in submit.stderr + request.stderr
    finally:
        os.kill(tactical, signal.SIGCONT)
    # Nothing was changed: the same agents serve, the stopped one as well once it runs again.
    code, after = _status(deployed)
    assert code == 0
    assert {role: a["pid"] for role, a in after.items()} == {
        role: a["pid"] for role, a in agents.items()
    }


def test_submit_never_changes_a_deployment_it_did_not_start(deployed: Path) -> None:
    state = str(deployed)
    # An extension named here that 'up' did not deploy: named, and nothing deployed for it.
    critic = run(
        "submit", CROWN, "--json",
        STRATAGEM_STATE_DIR=state, STRATAGEM_EXTENSIONS="examples.extensions.critic",
    )  # fmt: skip
    assert critic.returncode == 1, critic.stderr[-2000:]
    assert _lines(critic.stderr) == [
        "error: agents not deployed: critic (not deployed: its extension is named here but was "
        "not when the deployment was made ('stratagem up' deploys it)); nothing was changed "
        "(this command deploys no agent into a deployment it did not start)"
    ]
    code, before = _status(deployed)
    assert code == 0
    assert set(before) == {"orchestrator", "perception", "strategic", "tactical"}

    # The perception agent dies twice within the window: one more than its budget of one
    # restart, so it gives up.
    os.kill(int(str(before["perception"]["pid"])), signal.SIGKILL)
    for _ in range(240):
        time.sleep(0.5)
        code, agents = _status(deployed)
        now = agents["perception"]
        if now["health"] == "serving" and now["pid"] != before["perception"]["pid"]:
            break
    else:
        pytest.fail("the perception agent was not restarted")
    os.kill(int(str(now["pid"])), signal.SIGKILL)
    for _ in range(240):
        time.sleep(0.5)
        code, agents = _status(deployed)
        if agents["perception"]["health"] == "not deployed":
            break
    else:
        pytest.fail("the perception agent did not give up")
    restarts = deployed / "perception.restarts.json"
    counted = restarts.read_text()
    assert "gave up" in counted

    # status --json prints what it knows (the agent that gave up too), then exits 1.
    assert code == 1
    assert str(agents["perception"]["problem"]).startswith("gave up: restarted 2 times within")
    others = {role: a["pid"] for role, a in agents.items() if role != "perception"}

    submit = run("submit", CROWN, "--json", STRATAGEM_STATE_DIR=state)
    assert submit.returncode == 1, submit.stderr[-2000:]
    [line] = _lines(submit.stderr)
    assert line.startswith("error: agents not deployed: perception (gave up: restarted 2 times")
    assert line.endswith(
        "nothing was changed (this command deploys no agent into a deployment it did not start)"
    )
    # The deployment is as it was: the others serve in the same processes, perception is not
    # redeployed behind the operator's back, and its restart count (why it gave up) is kept.
    code, after = _status(deployed)
    assert code == 1
    assert {role: a["pid"] for role, a in after.items() if role != "perception"} == others
    assert after["perception"]["health"] == "not deployed"
    assert restarts.read_text() == counted
