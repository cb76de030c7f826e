"""A goal in plain words from the operator's side: ``Operator.ask`` (and ``SyncOperator.ask``),
``stratagem ask`` and ``submit`` of a goal file without a passage.

The orchestrator plans and runs it (``AskGoal``, ``agents._goals``); this module checks the
operator's input, sends it and renders the answer: the plan's steps as a table (agent,
capability, inputs, why, score, status) and the summary.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from stratagem.protocol import AskGoalRequest, AskGoalResponse, InvalidArgumentError
from stratagem.runtime.config._errors import InputError
from stratagem.runtime.operator._agents import Agents
from stratagem.runtime.operator._input import validation_line

if TYPE_CHECKING:
    from rich.table import Table

__all__ = [
    "ASK_KEYS",
    "Ask",
    "ask_request",
    "goal_file_asks",
    "new_ask_id",
    "steps_table",
]

ASK_KEYS = frozenset(
    {
        "goal",
        "inputs",
        "plan_only",
        "approve",
        "plan_id",
        "detach",
        "deadline_s",
        "budget",
        "done_when",
    }
)
"""What a goal file without a passage may hold (``submit`` sends it as ``AskGoal``)."""


def new_ask_id() -> str:
    """A fresh plan id for a goal in plain words, ``ask-<12 hex>``."""
    return f"ask-{uuid.uuid4().hex[:12]}"


def ask_request(goal: str | AskGoalRequest | Mapping[str, Any], **fields: Any) -> AskGoalRequest:
    """``goal`` (text, a request, or a goal file's mapping) as a request with a plan id.

    Raises:
        InputError: A field the request refuses (an empty or too long goal, ...): one line
            naming it.
    """
    if isinstance(goal, AskGoalRequest):
        request = goal
    else:
        raw = {"goal": goal} if isinstance(goal, str) else dict(goal)
        raw.update({k: v for k, v in fields.items() if v is not None})
        try:
            request = AskGoalRequest.model_validate(raw)
        except ValidationError as exc:
            raise InputError(validation_line("goal", exc)) from exc
    if not request.plan_id:
        request = request.model_copy(update={"plan_id": new_ask_id()})
    return request


def goal_file_asks(raw: Mapping[str, Any]) -> bool:
    """Whether a goal file's mapping is a goal in plain words (no ``passage``: ``AskGoal``)."""
    return "passage" not in raw


class Ask:
    """Goals in plain words, through ``agents``."""

    def __init__(self, agents: Agents) -> None:
        self._agents = agents

    async def ask(
        self,
        goal: str | AskGoalRequest | Mapping[str, Any],
        *,
        inputs: Mapping[str, Any] | None = None,
        plan_only: bool = False,
        approve: bool = False,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline for the whole goal)
    ) -> AskGoalResponse:
        """Ask the orchestrator for a goal in plain words: it routes the goal over the capability
        directory, plans it (``plan_only``: and stops there), runs it, replans around a step that
        cannot succeed, and answers with each step and a summary.

        Args:
            goal: What to do (``"check the weather in Seattle and set a timer for 10 minutes"``), or
                the request, or a goal file's mapping.
            inputs: Slot values by name, for the clauses that leave them out.
            plan_only: Answer with the plan; run nothing.
            approve: Wait at a gate before the steps that have side effects (the call waits with
                it unless the request sets ``detach``: approve from elsewhere, ``stratagem approve
                PLAN approve --rationale ...``).
            timeout: The whole goal's deadline in seconds.

        Raises:
            InputError: The goal is not valid, or the orchestrator refused it (a clause nothing
                matches, an agent not deployed, a slot its schema refuses): one line, nothing ran.
        """
        request = ask_request(
            goal,
            inputs=dict(inputs) if inputs else None,
            plan_only=plan_only or None,
            approve=approve or None,
        )
        try:
            answer = await self._agents.call("orchestrator", "AskGoal", request, timeout=timeout)
        except InvalidArgumentError as exc:
            raise InputError(f"goal refused: {exc.message}") from exc
        assert isinstance(answer, AskGoalResponse)
        return answer


def steps_table(answer: AskGoalResponse) -> Table:
    """The answer's steps: agent and capability, inputs, depends on, why, score, status."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"plan {answer.plan_id} ({answer.route})", title_justify="left")
    for column in ("step", "agent.capability", "inputs", "after", "why", "score", "status"):
        table.add_column(column, overflow="fold")
    for step in answer.steps:
        inputs = json.loads(step.request_json) if step.request_json else {}
        shown = ", ".join(
            f"{k}={v['$ref'] if isinstance(v, dict) and '$ref' in v else v}"
            for k, v in inputs.items()
        )
        colour = {"succeeded": "green", "dropped": "yellow", "failed": "red"}.get(step.status, "")
        status = f"[{colour}]{step.status}[/]" if colour else step.status
        table.add_row(
            step.id,
            f"{step.agent}.{step.capability}" + (" (side effects)" if step.side_effects else ""),
            escape(shown),
            ", ".join(step.depends_on),
            escape(step.why),
            f"{step.score:.2f}",
            status,
        )
    return table
