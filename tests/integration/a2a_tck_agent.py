"""The A2A TCK's scenario agent: an agent of the test SUT's own, served by the product's A2A face.

The TCK (``a2aproject/a2a-tck``, A2A 1.0) scripts what the system under test answers by the
prefix of a message's id: its ``scenarios/*.feature`` say, for instance, that a message whose id
starts with ``tck-artifact-text`` is answered with a completed task whose artifact is the text
``Generated text content``. Every SDK's test SUT implements those scenarios; this module does so
for Stratagem as an agent defined with ``define_agent`` (role ``scenarios``, one capability,
``Scenario``), so each answer goes through the product's whole path: the A2A face, the gRPC
pipeline (authentication, policy, audit), the planner, the engine and a tool.

The message id reaches the planner as the call's request id (``a2a:<messageId>``: the A2A face's
idempotency key); the plan's one step, ``play_scenario``, answers with the scenario's
``A2AReply`` (the parts of the task's artifact, or a message). A message id no scenario names is
answered with the text ``Unhandled messageId prefix: <id>``, as the SDKs' SUTs do.

``tck-input-required`` asks the task to stop in ``input-required``: its plan opens a gate that
asks (a string), which the A2A face maps to ``input-required``; the next message to the task
answers the gate (its rationale names that message's id), and that message's own scenario says
what comes next: another ``tck-input-required`` asks again (up to ``TURNS`` times), any other is
played as a first message would be. Not scripted here: the scenarios the A2A face has no way to
play (``tck-reject-task``; ``tck-stream-artifact-chunked``, an artifact sent in two chunks);
their messages get the default answer.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any, Final

from pydantic import Field

from stratagem.agents import define_agent, tool
from stratagem.planning import GateStep, Plan, PlanResult, Step, ToolStep
from stratagem.protocol import (
    EXTENSION_FIELD,
    A2APart,
    A2AReply,
    CapabilitySpec,
    WireModel,
    current_call,
)

ROLE: Final = "scenarios"
IDENTITY: Final = "tck"
"""Who the TCK is (it sends no credentials; the SUT's authenticator names every caller so)."""
_STREAMING_TIMEOUT_S: Final = 2.0  # the TCK's default TCK_STREAMING_TIMEOUT


class ScenarioRequest(WireModel):
    """A TCK message: its text (the scenario is chosen by the message's id)."""

    text: str = Field(max_length=100_000)


def _text(text: str) -> A2AReply:
    return A2AReply(parts=[A2APart(text=text)])


_FILE: Final = A2APart(
    raw=base64.b64encode(b"tck").decode(), filename="output.txt", media_type="text/plain"
)
# What each scenario answers, by message id prefix (from the TCK's scenarios/*.feature); the
# longest prefix that matches wins (``tck-artifact-file-url`` over ``tck-artifact-file``).
SCENARIOS: Final[dict[str, A2AReply]] = {
    "tck-complete-task": _text("Hello from TCK"),
    "tck-artifact-text": _text("Generated text content"),
    "tck-artifact-file": A2AReply(parts=[_FILE]),
    "tck-artifact-file-url": A2AReply(
        parts=[
            A2APart(
                url="https://example.com/output.txt",
                filename="output.txt",
                media_type="text/plain",
            )
        ]
    ),
    "tck-artifact-data": A2AReply(parts=[A2APart(data={"key": "value", "count": 42})]),
    "tck-message-response": A2AReply(parts=[A2APart(text="Direct message response")], message=True),
    "tck-stream-001": _text("Stream hello from TCK"),
    "tck-stream-002": _text("Stream completed"),
    "tck-stream-003": _text("Stream task lifecycle"),
    "tck-stream-ordering-001": _text("Ordered output"),
    "tck-stream-artifact-text": _text("Streamed text content"),
    "tck-stream-artifact-file": A2AReply(parts=[_FILE]),
    "test-resubscribe-message-id": _text("Resubscribed"),
}
# Scenarios whose task stays working a while (a resubscription test joins it meanwhile).
SLOW: Final[dict[str, float]] = {"test-resubscribe-message-id": 2 * _STREAMING_TIMEOUT_S}


def scenario_of(message_id: str) -> str:
    """The scenario a message id names ("" for none)."""
    matching = [prefix for prefix in SCENARIOS if message_id.startswith(prefix)]
    return max(matching, key=len, default="")


SCENARIO: Final = CapabilitySpec(
    name="Scenario",
    role=ROLE,
    field=EXTENSION_FIELD,
    request=ScenarioRequest,
    response=A2AReply,
)


ASKS: Final = "tck-input-required"
"""The scenario whose task waits for input."""
TURNS: Final = 4
"""How many times in a row one task asks for input."""
ANSWERED_BY: Final = "A2A message "
"""How the A2A face's approval of a gate names the message that answered it (its rationale)."""


@tool
async def play_scenario(message_id: str) -> A2AReply:
    """The scripted answer to a TCK message (by its id's prefix; a gate's rationale,
    ``A2A message <id>``, names the message that answered it)."""
    message_id = message_id.removeprefix(ANSWERED_BY)
    scenario = scenario_of(message_id)
    if scenario in SLOW:
        await asyncio.sleep(SLOW[scenario])
    if not scenario:
        return _text(f"Unhandled messageId prefix: {message_id}")
    return SCENARIOS[scenario]


class ScenarioPlan(Plan):
    """A scenario's plan: one step that plays it."""


class ScenarioPlanner:
    """Plans ``Scenario``: the message id (the call's request id, ``a2a:<messageId>``) picks it."""

    def plan(self, capability: str, request: WireModel, *, plan_id: str) -> ScenarioPlan:
        call = current_call.get()
        request_id = call.request_id if call is not None else ""
        message_id = request_id.removeprefix("a2a:")
        steps: list[Step] = [
            ToolStep(id="play", tool="play_scenario", input={"message_id": message_id})
        ]
        if message_id.startswith(ASKS):
            steps = _asking_steps()
        return ScenarioPlan(
            id=plan_id,
            owner=ROLE,
            goal=f"TCK scenario {scenario_of(message_id) or 'default'}",
            steps=steps,
        )

    def respond(self, capability: str, request: WireModel, result: PlanResult[Any]) -> WireModel:
        played = [out for step, out in result.outputs.items() if step.startswith("play") and out]
        return A2AReply.model_validate(played[-1])


def _asking_steps() -> list[Step]:
    """Gates that ask, one a turn: each answer either asks again (a message of the asking
    scenario) or is played (any other), the last one always."""
    steps: list[Step] = []
    for turn in range(1, TURNS + 1):
        ask = f"ask{turn}"
        again = f"starts_with({ask}.rationale, '{ANSWERED_BY}{ASKS}')"
        previous = f"ask{turn - 1}"
        steps.append(
            GateStep(
                id=ask,
                prompt="TCK: send the input this task needs",
                input_schema={"type": "string"},
                depends_on=[previous] if turn > 1 else [],
                when=f"starts_with({previous}.rationale, '{ANSWERED_BY}{ASKS}')"
                if turn > 1
                else None,
            )
        )
        steps.append(
            ToolStep(
                id=f"play{turn}",
                tool="play_scenario",
                depends_on=[ask],
                input={"message_id": {"$expr": f"{ask}.rationale"}},
                when=None if turn == TURNS else f"!{again}",
            )
        )
    return steps


SCENARIO_AGENT: Final = define_agent(
    ROLE,
    plan_type=ScenarioPlan,
    planner=ScenarioPlanner,
    tools=[play_scenario],
    capabilities=[SCENARIO],
    callers={IDENTITY: ["Scenario"]},
    description="Plays the A2A TCK's scripted scenarios, chosen by a message's id.",
)
