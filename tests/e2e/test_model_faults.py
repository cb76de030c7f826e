"""A model server that cannot be reached, as a user meets it: the goal fails in one line, the
request is audited, and nothing of the goal is half-applied to the world model."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from tests.e2e.test_cli import EXAMPLES, run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

# Port 9 (discard) on loopback: nothing listens, every connection is refused at once.
UNREACHABLE = {
    "STRATAGEM_PLANNERS": json.dumps({"tactical": "model"}),
    "STRATAGEM_MODEL_URL": "http://127.0.0.1:9/v1",
    "STRATAGEM_MODEL": "gemma-3-270m",
}


def _facts(state_dir: Path) -> set[tuple[str, str, str]]:
    result = run(
        "request",
        "perception",
        "FindSpatialContext",
        "--json",
        json.dumps({"entity_ids": ["mira", "silver_crown", "vault"], "world": "faults"}),
        state_dir=state_dir,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return {(f["subject"], f["predicate"], f["object"]) for f in json.loads(result.stdout)["facts"]}


def test_an_unreachable_model_fails_the_goal_in_one_line_audited_and_applies_nothing(
    tmp_path: Path,
) -> None:
    up = run("up", "--json", state_dir=tmp_path, **UNREACHABLE)
    assert up.returncode == 0, up.stderr[-2000:]
    try:
        # The goal runs in a world of its own name, read back below.
        submit = run(
            "submit",
            str(EXAMPLES / "crown.yaml"),
            "--world",
            "faults",
            state_dir=tmp_path,
            **UNREACHABLE,
        )
        # One error line (after the progress lines), naming the model server that could not be
        # reached and the step it stopped, then where it went wrong, the trace and the command to
        # see the plan (indented); no traceback.
        assert submit.returncode == 1, submit.stdout[-2000:]
        lines = submit.stderr.strip().splitlines()
        errors = [line for line in lines if line.startswith("error: ")]
        assert len(errors) == 1, submit.stderr[-3000:]
        after = lines[lines.index(errors[0]) + 1 :]
        assert after, submit.stderr[-3000:]
        assert all(line.startswith("  ") for line in after), submit.stderr[-3000:]
        assert any("where: tactical plan" in line for line in after), after
        assert any(line.strip().startswith("trace ") for line in after), after
        assert "model server http://127.0.0.1:9/v1 unreachable" in errors[0]
        assert "(transient)" in errors[0]
        # Said once: the deepest failed step, its class and why on the error line; below it only
        # where (the plan that could not be planned, the step that asked for it) and the trace.
        assert re.match(r"error: step 'beat_\d' failed \(transient\): ", errors[0]), errors[0]
        said = submit.stderr.count("unreachable: APIConnectionError")
        assert said == 1, submit.stderr[-3000:]
        [where] = [line for line in after if line.strip().startswith("where: ")]
        assert re.fullmatch(
            r"  where: tactical plan (goal-\w+)/beat_\d \(asked for by step 'beat_\d' of "
            r"orchestrator plan \1\)",
            where,
        ), where
        assert "Traceback" not in submit.stderr + submit.stdout

        # The passage was read (perception has Mira in the courtyard), but no action of the goal
        # reached the world: the crown is still in the locked vault, Mira has nothing.
        facts = _facts(tmp_path)
        assert ("mira", "at", "courtyard") in facts
        assert ("silver_crown", "in", "vault") in facts
        assert ("vault", "locked", "vault") in facts
        assert not any(s == "mira" and p == "has" for s, p, _ in facts)

        # Every call was audited: the goal's SubmitGoal and the tactical agent's refusals to plan
        # each end with a record of their failure code, and the chain verifies.
        with sqlite3.connect(tmp_path / "audit.sqlite3") as db:
            outcomes = db.execute(
                "SELECT capability, code FROM audit WHERE action = 'call.outcome'"
            ).fetchall()
        codes: dict[str, set[str]] = {}
        for capability, code in outcomes:
            codes.setdefault(capability, set()).add(code)
        assert codes["SubmitGoal"] - {"OK"}, outcomes
        assert "UNAVAILABLE" in codes["PlanExecutionSequence"], outcomes
        assert "OK" not in codes.get("UpdateWorldState", set()), outcomes
        verify = run("audit", "verify", state_dir=tmp_path)
        assert verify.returncode == 0, verify.stderr
    finally:
        down = run("down", "--json", state_dir=tmp_path)
        assert down.returncode == 0, down.stderr[-2000:]
