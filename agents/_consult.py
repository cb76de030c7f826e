"""A goal's consultations: external A2A agents the orchestrator asks about a goal.

A goal may name external A2A agents to consult (``SubmitGoalRequest.consult``): names the
orchestrator knows (``STRATAGEM_A2A_AGENTS``; ``check_consulted`` refuses another with
``INVALID_ARGUMENT`` before anything runs). Each becomes one cross-agent step of the goal's plan,
``consult_<name>``: target ``a2a``, capability ``SendA2AMessage``, once the arc is planned, the goal
and the passage as the message's text and ``{goal, passage, world, beats}`` as its JSON part. The
agent's dispatcher sends it over A2A (``runtime.A2ADispatcher``): the policy, the audit records, the
client span, the deadline and the step's request id as message id are that dispatcher's.

Consultation is best effort by default: each step has a route on failure, ``waive_<name>`` (the tool
``waive_consultation``), so a remote that fails, refuses or times out is recorded in the answer's
``consultations`` (status ``failed`` and why) and the goal goes on. With ``consult_required`` there
is no route, and the world's change (``apply``) waits for every consultation: one that fails fails
the goal before the world changes. ``consultations_of`` reads the answers back from the plan's
result. A model planner chooses which of the goal's agents to consult (``consult_schema``,
``chosen_consultations``): never one the goal does not name, and every one when they are required.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Any, Final

from pydantic import BaseModel, ConfigDict

from stratagem.agents._tool import tool
from stratagem.planning import (
    CrossAgentStep,
    PlanResult,
    RetryPolicy,
    Step,
    StepStatus,
    ToolStep,
)
from stratagem.protocol import Consultation, InvalidArgumentError, SubmitGoalRequest

__all__ = [
    "A2A_TARGET",
    "CONSULT_PREFIX",
    "check_consulted",
    "chosen_consultations",
    "consult_schema",
    "consultation_steps",
    "consultations_of",
    "required_consultations",
    "waive_consultation",
]

A2A_TARGET: Final = "a2a"
"""The target of a step that sends a message to an external A2A agent (``SendA2AMessage``)."""
CONSULT_PREFIX: Final = "consult_"
"""A consultation step's id: this prefix and the external agent's name."""
_RETRY: Final = RetryPolicy(max_attempts=2)
"""A consultation is tried twice at most: a remote that hangs costs the goal two of its attempts'
time limits (the agent's ``timeout_s`` or the step time limit, the shorter), not three."""


def check_consulted(request: SubmitGoalRequest, known: Collection[str]) -> list[str]:
    """The external agents ``request`` consults, each one of ``known``.

    Raises:
        protocol.InvalidArgumentError: A name that is not among ``known`` (one line naming the
            configured ones).
    """
    unknown = [name for name in request.consult if name not in known]
    if unknown:
        configured = ", ".join(sorted(known)) or "none"
        raise InvalidArgumentError(
            f"the goal consults {', '.join(repr(n) for n in unknown)}: not "
            + ("an external A2A agent" if len(unknown) == 1 else "external A2A agents")
            + f" of the orchestrator (configured in STRATAGEM_A2A_AGENTS: {configured})"
        )
    return list(request.consult)


class Waived(BaseModel):
    """A consultation the goal went on without."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agent: str


@tool
async def waive_consultation(agent: str) -> Waived:
    """Go on without the answer of the external agent ``agent``, whose consultation failed (the
    route on failure of a best-effort consultation; it changes nothing)."""
    return Waived(agent=agent)


def consultation_steps(
    request: SubmitGoalRequest, agents: Sequence[str], *, after: list[str], beats: Any, world: str
) -> list[Step]:
    """A ``SendA2AMessage`` step (``consult_<name>``) per agent of ``agents``, once ``after`` ran:
    the goal and the passage as its text, ``{goal, passage, world, beats}`` as its JSON part.
    Unless ``request.consult_required``, each has a route on failure (``waive_<name>``)."""
    if not agents:
        return []
    # The capability is the A2A client's (loaded only when a goal consults someone).
    from stratagem.protocol._a2a._client import register_a2a_capability

    register_a2a_capability()
    text = f"Goal: {request.goal}\n\nPassage:\n{request.passage}"
    steps: list[Step] = []
    for agent in agents:
        step_id = f"{CONSULT_PREFIX}{agent}"
        steps.append(
            CrossAgentStep(
                id=step_id,
                title=f"consult the external agent {agent}",
                target=A2A_TARGET,
                capability="SendA2AMessage",
                depends_on=after,
                retry=_RETRY,
                request={
                    "agent": agent,
                    "text": text,
                    "data": {
                        "goal": request.goal,
                        "passage": request.passage,
                        "world": world,
                        "beats": beats,
                    },
                },
            )
        )
        if not request.consult_required:
            steps.append(
                ToolStep(
                    id=f"waive_{agent}",
                    title=f"go on without {agent}'s answer",
                    tool="waive_consultation",
                    depends_on=[step_id],
                    runs_on="failure",
                    input={"agent": agent},
                )
            )
    return steps


def required_consultations(request: SubmitGoalRequest, steps: Sequence[Step]) -> list[str]:
    """The consultation steps among ``steps`` that the world's change (``apply``) waits for:
    every one when they are required, else none."""
    if not request.consult_required:
        return []
    return [s.id for s in steps if isinstance(s, CrossAgentStep) and s.target == A2A_TARGET]


def consultations_of(result: PlanResult[Any]) -> list[Consultation]:
    """What each external agent the goal's plan consulted answered, or why it did not, in plan
    order (the plan's ``a2a`` steps)."""
    failures = {f.step_id: f for f in [*result.handled, *result.failures]}
    found = []
    for step in result.submitted.steps:
        if not (isinstance(step, CrossAgentStep) and step.target == A2A_TARGET):
            continue
        agent = str(step.request.get("agent", ""))
        output = result.outputs.get(step.id)
        if isinstance(output, dict):
            data = output.get("data")
            found.append(
                Consultation(
                    agent=agent,
                    status="answered",
                    task_id=output.get("task_id", ""),
                    state=output.get("state", ""),
                    text=output.get("text", ""),
                    data_json="" if data is None else json.dumps(data, sort_keys=True),
                )
            )
        elif step.id in failures or result.statuses.get(step.id) is StepStatus.FAILED:
            failure = failures.get(step.id)
            error = failure.message if failure is not None else "the consultation failed"
            found.append(Consultation(agent=agent, status="failed", error=error[:2000]))
        else:
            found.append(Consultation(agent=agent, status="skipped"))
    return found


def consult_schema(request: SubmitGoalRequest) -> dict[str, Any] | None:
    """The JSON Schema of a model planner's choice of consultations: a list of names from the
    goal's own ``consult`` (an enum: a model cannot name another agent); ``None`` when there is
    nothing to choose (the goal consults nobody, or every one is required)."""
    if not request.consult or request.consult_required:
        return None
    return {
        "type": "array",
        "maxItems": len(request.consult),
        "uniqueItems": True,
        "items": {"type": "string", "enum": list(request.consult)},
    }


def chosen_consultations(answer: Any, request: SubmitGoalRequest) -> tuple[list[str], list[str]]:
    """The agents a model planner's ``answer`` consults (its ``consult`` list), in the goal's
    order, and the problems with it. Every one the goal names when they are required; an agent
    the goal does not name is a problem (the answer is untrusted input, whatever the schema)."""
    allowed = list(request.consult)
    named = answer.get("consult", []) if isinstance(answer, dict) else []
    if not isinstance(named, list) or not all(isinstance(n, str) for n in named):
        return [], ["'consult' must be a list of the agents' names"]
    foreign = [n for n in dict.fromkeys(named) if n not in allowed]
    if foreign:
        return [], [
            f"consult: {', '.join(repr(n)[:70] for n in foreign[:4])} "
            + ("is" if len(foreign) == 1 else "are")
            + f" not among the agents the goal allows consulting ({', '.join(allowed) or 'none'})"
        ]
    if request.consult_required:
        return allowed, []
    return [n for n in allowed if n in named], []
