"""The history API's models and page tokens (no agents: the wire models converted by hand)."""

from __future__ import annotations

import pytest

from stratagem.planning import PlanStatus
from stratagem.protocol import PlanSnapshot, StepRecord
from stratagem.runtime import HistoryFilter, InputError
from stratagem.runtime.operator._history import (
    decode_page_token,
    encode_page_token,
    plan_history,
    plan_view,
    trace_summaries,
)
from stratagem.runtime.operator._plans import FINAL


def test_the_operator_knows_which_statuses_end_a_plan() -> None:
    assert {status.value for status in PlanStatus if status.is_final} == FINAL


def test_a_page_token_names_its_filter_and_each_agents_cursor() -> None:
    query = HistoryFilter(status="failed")
    token = encode_page_token(query, {"strategic": "12", "tactical": None, "perception": ""})
    assert decode_page_token(token, query) == {
        "strategic": "12",
        "tactical": None,
        "perception": "",
    }
    assert encode_page_token(query, {"strategic": None}) == ""
    with pytest.raises(InputError, match="made for other filters"):
        decode_page_token(token, HistoryFilter(status="succeeded"))
    for bad in ("x", token[:-3] + "!!!", "eyJ2IjoyfQ"):
        with pytest.raises(InputError, match="is malformed"):
            decode_page_token(bad, query)


def test_a_page_token_whose_cursor_is_past_two_to_the_63_is_malformed() -> None:
    # Before: it reached every agent, which answered INTERNAL, and `plans list` exited 0.
    query = HistoryFilter()
    for cursor in (str(2**63), "9" * 20, "9" * 40):
        token = encode_page_token(query, {"strategic": cursor})
        with pytest.raises(InputError, match="is malformed"):
            decode_page_token(token, query)
    token = encode_page_token(query, {"strategic": str(2**63 - 1)})
    assert decode_page_token(token, query) == {"strategic": str(2**63 - 1)}


def _snapshot(plan_id: str, agent: str, status: str, **fields: object) -> PlanSnapshot:
    return PlanSnapshot(plan_id=plan_id, agent=agent, status=status, **fields)  # type: ignore[arg-type]


def test_a_failed_goal_names_its_deepest_failed_step() -> None:
    top = _snapshot(
        "g",
        "orchestrator",
        "failed",
        message="step 'extract' failed (logic): ExtractEntities failed",
        trace_id="a" * 32,
        created=2.0,
        steps=[
            StepRecord(
                step_id="extract", kind="cross_agent", status="failed", failure_class="logic"
            )
        ],
    )
    sub = _snapshot(
        "g/extract",
        "perception",
        "failed",
        message="step 'read' failed (logic): nothing found",
        trace_id="a" * 32,
        created=3.0,
        steps=[
            StepRecord(
                step_id="read",
                kind="tool",
                status="failed",
                failure_class="logic",
                message="nothing found",
                output_json='{"n": 1}',
            )
        ],
    )
    history = plan_history("g", [plan_view(sub), plan_view(top)], [])
    assert [v.plan_id for v in history.plans] == ["g", "g/extract"]
    assert history.failure == "perception plan g/extract: step 'read' failed (logic): nothing found"
    assert history.failed_at == "perception plan g/extract"
    assert history.cause == "step 'read' failed (logic): nothing found"
    assert history.plans[1].steps[0].output == {"n": 1}
    assert history.plans[0].steps[0].sub_plan == "g/extract"
    (trace,) = trace_summaries(history.plans, 5)
    assert (trace.plan_id, trace.plans, trace.agents) == ("g", 2, ["orchestrator", "perception"])


def test_a_sub_plan_that_could_not_be_planned_is_named_after_the_step_that_asked_for_it() -> None:
    top = _snapshot(
        "g",
        "orchestrator",
        "failed",
        message="step 'beat_1' failed (transient): UNAVAILABLE: cannot plan 'g/beat_1': down",
        steps=[
            StepRecord(
                step_id="beat_1",
                kind="cross_agent",
                status="failed",
                failure_class="transient",
                message="UNAVAILABLE: PlanExecutionSequence: cannot plan 'g/beat_1': down",
            )
        ],
    )
    sub = _snapshot("g/beat_1", "tactical", "failed", message="cannot plan 'g/beat_1': down")
    history = plan_history("g", [plan_view(top), plan_view(sub)], [])
    # The reason once, with the class of the step that failed on it; the place below it.
    assert history.cause == "step 'beat_1' failed (transient): cannot plan 'g/beat_1': down"
    assert history.failed_at == (
        "tactical plan g/beat_1 (asked for by step 'beat_1' of orchestrator plan g)"
    )
    assert history.failure == f"{history.failed_at}: {history.cause}"
