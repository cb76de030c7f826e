"""``plans show`` shows an artifact output's name, version, size and digest."""

from __future__ import annotations

from datetime import UTC, datetime

from stratagem.runtime._cli import _app as cli
from stratagem.runtime.operator._history import PlanHistory, PlanView, StepView
from stratagem.runtime.operator._show import plan_details

DIGEST = "ab" * 32


def _shown(output: dict[str, object]) -> str:
    now = datetime.now(UTC)
    view = PlanView(
        plan_id="p1",
        agent="tactical",
        revision=1,
        status="succeeded",
        created=now,
        updated=now,
        steps=[
            StepView(
                id="save", kind="tool", does="artifact.save", status="succeeded", output=output
            )
        ],
    )
    with cli.console.capture() as captured:
        cli.console.print(
            plan_details(PlanHistory(plan_id="p1", status="succeeded", plans=[view]), full=True)
        )
    return " ".join(captured.get().split())  # the lines as one, however the terminal wraps


BODY = {
    "name": "report.md",
    "version": 3,
    "digest": DIGEST,
    "size": 2048,
    "media_type": "text/markdown",
    "scope": "plan",
    "scope_id": "p1",
}


def test_an_artifact_tool_output_shows_name_version_size_and_digest() -> None:
    out = _shown({"artifact": BODY})
    assert f"artifact report.md v3 · 2048 B · sha256:{DIGEST} (plan/p1/report.md@3)" in out


def test_a_claim_check_output_shows_the_same() -> None:
    assert f"report.md v3 · 2048 B · sha256:{DIGEST}" in _shown({"$artifact": BODY})


def test_an_output_that_only_looks_like_one_is_not_an_artifact() -> None:
    assert "artifact report.md" not in _shown({"artifact": {"name": "report.md"}})
