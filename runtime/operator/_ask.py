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
    from rich.console import Group
    from rich.table import Table

WIDE: int = 120
"""The narrowest terminal the steps are shown in as a table; narrower, each step is a block."""

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


def _shown_inputs(request_json: str) -> str:
    inputs = json.loads(request_json) if request_json else {}
    return ", ".join(
        f"{k}={v['$ref'] if isinstance(v, dict) and '$ref' in v else v}" for k, v in inputs.items()
    )


def _status(status: str) -> str:
    colour = {"succeeded": "green", "dropped": "yellow", "failed": "red"}.get(status, "")
    return f"[{colour}]{status}[/]" if colour else status


def steps_table(answer: AskGoalResponse) -> Table:
    """The answer's steps: agent and capability, inputs, depends on, why, score, status."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"plan {answer.plan_id} ({answer.route})", title_justify="left")
    for column in ("step", "agent.capability", "inputs", "after", "why", "score", "status"):
        table.add_column(column, overflow="fold")
    for step in answer.steps:
        table.add_row(
            step.id,
            f"{step.agent}.{step.capability}" + (" (side effects)" if step.side_effects else ""),
            escape(_shown_inputs(step.request_json)),
            ", ".join(step.depends_on),
            escape(step.why),
            f"{step.score:.2f}",
            _status(step.status),
        )
    return table


def steps_blocks(answer: AskGoalResponse) -> Group:
    """The same as ``steps_table``, a block per step, for a terminal narrower than ``WIDE``
    (seven columns at 80 broke names mid-word): its name, agent and capability, status and score
    on one line, then its inputs, what it waits for and why, each on a line of its own."""
    from rich.console import Group
    from rich.markup import escape
    from rich.text import Text

    lines: list[Text] = [Text(f"plan {answer.plan_id} ({answer.route})", style="italic")]
    for step in answer.steps:
        effects = " (side effects)" if step.side_effects else ""
        lines.append(
            Text.from_markup(
                f"[bold]{escape(step.id)}[/]  {escape(step.agent)}.{escape(step.capability)}"
                f"{effects}  {_status(step.status)} · score {step.score:.2f}"
            )
        )
        for label, value in (
            ("inputs", _shown_inputs(step.request_json)),
            ("after", ", ".join(step.depends_on)),
            ("why", step.why),
        ):
            if value:
                line = Text(f"  {label:<7}", style="dim")
                line.append(value)
                lines.append(line)
    return Group(*lines)
