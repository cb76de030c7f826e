"""A test-only extension: a side-effecting, non-idempotent tool that writes a ledger.

``ledger_append`` appends one line, ``"<plan id> <step id>"``, to the ledger file named in its
input each time it runs, so a test counts how often each step's effect happened. The tactical agent
gets the tool and a ``RecordEntry`` capability whose plan is one such step (for cross-agent
requests; ``setup`` registers it, so importing this module leaves the protocol's registry alone
and a test registers it only while it needs it). Actors load it through
``STRATAGEM_EXTENSIONS=tests.integration.ledger_extension``, with the repository's folder in
``STRATAGEM_EXTENSION_PATHS``.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from pydantic import Field

from stratagem.agents import Agent, TacticalPlan, tool
from stratagem.planning import PlanResult, ToolContext, ToolStep
from stratagem.protocol import EXTENSION_FIELD, CapabilitySpec, WireModel, register_capability


class RecordEntryRequest(WireModel):
    """Write one ledger entry, in a plan of the given id."""

    ledger: str = Field(min_length=1, max_length=1000)
    plan_id: str = Field(min_length=1, max_length=100)


class RecordEntryResponse(WireModel):
    """The line written."""

    line: str


RECORD_ENTRY = CapabilitySpec(
    name="RecordEntry",
    role="tactical",
    field=EXTENSION_FIELD,
    request=RecordEntryRequest,
    response=RecordEntryResponse,
)


@tool(name="ledger_append", idempotent=False)
async def ledger_append(ledger: str, ctx: ToolContext, pause_s: float = 0.0) -> RecordEntryResponse:
    """Wait ``pause_s``, then append ``"<plan id> <step id>"`` to the ledger (not idempotent)."""
    await asyncio.sleep(pause_s)
    line = f"{ctx.plan_id} {ctx.step_id}"
    # One write on an O_APPEND descriptor: a killed process leaves whole lines or none.
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)
    return RecordEntryResponse(line=line)


class RecordEntryPlanner:
    """Plans ``RecordEntry`` as one ``ledger_append`` step."""

    def plan(self, capability: str, request: WireModel, *, plan_id: str) -> TacticalPlan:
        """A one-step plan."""
        if not isinstance(request, RecordEntryRequest):
            raise ValueError(f"cannot plan {capability!r}")
        return TacticalPlan(
            id=plan_id,
            owner="tactical",
            goal="write one ledger entry",
            steps=[ToolStep(id="write", tool="ledger_append", input={"ledger": request.ledger})],
        )

    def respond(self, capability: str, request: WireModel, result: PlanResult[Any]) -> WireModel:
        """The write step's output is the response."""
        return RecordEntryResponse.model_validate(result.outputs["write"])


def setup(agent: Agent) -> None:
    """Give the tactical agent the ledger tool and the ``RecordEntry`` capability."""
    if agent.role != "tactical":
        return
    register_capability(RECORD_ENTRY)
    agent.registry.register(ledger_append)
    agent.add_capability(RECORD_ENTRY, RecordEntryPlanner())
