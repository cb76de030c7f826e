"""A client that knows only ``proto/`` and the documented token format is served by a deployment:
``Describe`` on every agent and one capability on each built-in agent (issue 14, "done when"); its
token is minted by the recipe of ``docs/security.md``, extracted from the page and executed."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs_blocks import token_recipe
from tests.e2e.test_cli import REPO, run

pytestmark = pytest.mark.e2e

APPRAISAL = REPO / "examples" / "extensions" / "appraisal"


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A deployment with the example extensions, one of whose values travel as a Struct and as
    the extension's own message."""
    state_dir = tmp_path_factory.mktemp("foreign")
    up = run(
        "up",
        "--json",
        state_dir=state_dir,
        STRATAGEM_EXTENSIONS="examples.extensions.word_count,examples.extensions.wire_values",
        # Where the client below reads it, whatever an integration session exported.
        STRATAGEM_SECRET_FILE=str(state_dir / "cluster.secret"),
    )
    try:
        assert up.returncode == 0, up.stderr[-2000:]
        yield state_dir
    finally:
        down = run(
            "down",
            "--json",
            state_dir=state_dir,
            STRATAGEM_SECRET_FILE=str(state_dir / "cluster.secret"),
        )
        assert down.returncode == 0, down.stderr[-2000:]


BUILT_IN = {"orchestrator", "perception", "strategic", "tactical"}


def _generate(out: Path) -> Path:
    """The Python code protoc makes from proto/ alone (as any language's build would)."""
    out.mkdir()
    protos = sorted(str(p.relative_to(REPO / "proto")) for p in (REPO / "proto").rglob("*.proto"))
    generated = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", str(REPO / "proto"), "-I", str(APPRAISAL),
         f"--python_out={out}", *protos, "appraisal.proto"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert generated.returncode == 0, generated.stderr
    # Regular packages, so that this folder, first on the client's path, wins over the installed
    # ``stratagem`` package of the test's venv.
    for folder in [out / "stratagem", out / "stratagem" / "v1"]:
        (folder / "__init__.py").write_text("")
    return out


def test_a_client_from_proto_alone_describes_every_agent_and_calls_each_built_in_one(
    deployed: Path, tmp_path: Path
) -> None:
    secret = str(deployed / "cluster.secret")
    status = json.loads(
        run("status", "--json", state_dir=deployed, STRATAGEM_SECRET_FILE=secret).stdout
    )
    endpoints = {a["role"]: a["endpoint"] for a in status["agents"]}
    assert set(endpoints) >= BUILT_IN
    endpoint_file = tmp_path / "endpoints.json"
    endpoint_file.write_text(json.dumps(endpoints))
    generated = _generate(tmp_path / "generated")
    # The token is made as docs/security.md says, by its own block (the page's text, run).
    recipe = tmp_path / "security_md_recipe.py"
    recipe.write_text(token_recipe())

    client = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("foreign_client.py")), str(generated),
         str(deployed / "operator.key"), str(endpoint_file), str(recipe)],
        capture_output=True, text=True, check=False, timeout=300, cwd=tmp_path,
    )  # fmt: skip

    assert client.returncode == 0, client.stderr[-3000:]
    result = json.loads(client.stdout)
    assert result["stratagem_modules"] == ["stratagem", "stratagem.v1", "stratagem.v1.agent_pb2"]
    # Extension values: a Struct to the strategic agent, the extension's own message in an Any to
    # the perception agent, each described by Describe.
    wire = result["wire"]
    assert wire["cards"]["RateTension"] == {"wire": "struct", "request_type": ""}
    assert wire["cards"]["Appraise"] == {
        "wire": "message",
        "request_type": "appraisal.v1.AppraiseRequest",
    }
    assert wire["rate_tension"]["words"] == ["storm", "run"]
    assert wire["appraisal"]["entityId"] == "mira"
    assert wire["appraisal_type"] == "appraisal.v1.Appraisal"
    assert wire["wrong_type"] == "INVALID_ARGUMENT"
    assert {role: card["role"] for role, card in result["cards"].items()} == {
        role: role for role in endpoints
    }
    assert "ExtractEntities" in result["cards"]["perception"]["capabilities"]
    assert "SubmitGoal" in result["cards"]["orchestrator"]["capabilities"]
    answers = result["answers"]
    assert set(answers) == BUILT_IN
    assert {"mira", "courtyard"} <= {e["id"] for e in answers["perception"]["value"]["entities"]}
    assert answers["strategic"]["value"]["protagonist"] == "mira"
    assert answers["tactical"]["body"] == "plan_execution_sequence"
    assert [a["name"] for a in answers["tactical"]["value"]["actions"]] == ["move", "take"]
    assert answers["orchestrator"]["value"]["status"] == "succeeded"
    # Each call is audited under the token's identity, accepted and answered.
    with sqlite3.connect(deployed / "audit.sqlite3") as db:
        rows = db.execute(
            "SELECT action, target, code FROM audit WHERE actor = 'operator' AND request_id = ?",
            (answers["perception"]["request_id"],),
        ).fetchall()
    assert ("call.accepted", "perception", "") in rows
    assert ("call.outcome", "perception", "OK") in rows
