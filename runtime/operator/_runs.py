"""The operator's part that runs a plan written by hand (``run_plan``): the plan read, typed and
checked here as its owner will check it (``checked_plan``, which ``replan`` uses too), then run
on its owner."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pydantic import ValidationError

from stratagem.protocol import CAPABILITIES, MCP_SERVER_NAME_PATTERN
from stratagem.runtime.config._extensions import settings_roles
from stratagem.runtime.config._settings import Settings
from stratagem.runtime.operator._agents import Agents
from stratagem.runtime.operator._goal import root_span
from stratagem.runtime.operator._history import PlanView, plan_view
from stratagem.runtime.operator._input import (
    InputError,
    check_encoded_size,
    check_plan_steps,
    read_mapping,
    validation_line,
)
from stratagem.runtime.operator._link import Link

if TYPE_CHECKING:
    from stratagem.planning import Plan

__all__ = ["PlanSource", "Runs"]

PlanSource = Path | Mapping[str, Any]
"""A plan: a YAML or JSON file, or the mapping such a file holds (id, owner, goal, steps)."""

_MCP_TOOL: Final = re.compile(rf"{MCP_SERVER_NAME_PATTERN}\..+")
"""How an agent's registry names an MCP server's tool: ``<server>.<tool>``."""


class Runs:
    """Plans run by hand, through ``link``; ``agents`` tells the tools an owner serves."""

    def __init__(self, link: Link, agents: Agents) -> None:
        self._link = link
        self._agents = agents

    async def run_plan(
        self,
        plan: PlanSource,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
        until_blocked: bool = False,
    ) -> PlanView:
        """Have the plan's owner validate and run a plan you wrote; returns its final state.

        With ``until_blocked`` (what ``stratagem plans run`` does) it returns as soon as the plan
        waits at a gate (``status`` ``blocked``; ``approve`` lets it go on), and the deadline
        never cancels the plan: past it the call fails with ``DeadlineExceededError`` and the plan
        runs on at its owner. Without it, a plan whose call ends first is cancelled unless it
        waits at a gate.

        The plan is checked here first as its owner will (its type, tools, cycles, size).

        Raises:
            InputError: The plan is not one its owner would run (every problem named).
            protocol.RemoteError: The plan ran and failed (``AbortedError`` for a transient or
                timeout failure); a request the agent's published endpoint did not answer is sent
                again with the same request id, which runs nothing twice.
        """
        owner, plan_json = await self.checked_plan(plan)
        key = f"run-{uuid.uuid4().hex}"
        plan_id = str(json.loads(plan_json).get("id", ""))
        # The run's trace starts here, so a failure names it too (RemoteError.trace_id).
        with root_span(f"run plan {plan_id}", {"stratagem.plan.id": plan_id}):
            snapshot = await self._link.at(
                owner,
                lambda client: client.run_plan(
                    plan_json, timeout=timeout, request_id=key, until_blocked=until_blocked
                ),
            )
        return plan_view(snapshot)

    async def checked_plan(self, plan: PlanSource, *, plan_id: str = "") -> tuple[str, str]:
        """``plan`` checked as its owner will check it: its owner and the plan as JSON.

        Everything is checked here before any call but the tools an agent built here does not
        have: those named as an MCP server's (``server.tool``), which only the running owner has,
        are looked up in its Describe.
        """
        from stratagem.planning import ToolStep

        where, raw = _read_plan(plan, plan_id=plan_id)
        owner, typed, local = _typed_plan(where, raw, self._link.settings)
        named = {step.tool for step in typed.steps if isinstance(step, ToolStep)} | {
            step.compensate for step in typed.steps if step.compensate is not None
        }
        served: list[str] = []
        if any(_MCP_TOOL.fullmatch(name) for name in named - set(local)):
            served = (await self._agents.describe(owner)).tools
        return owner, _plan_json(where, typed, [*local, *served], self._link.settings)


def _read_plan(plan: PlanSource, *, plan_id: str = "") -> tuple[str, dict[str, Any]]:
    """Where a plan comes from (for messages) and its mapping; ``plan_id``, when given, replaces
    the plan's id (a new revision of that plan)."""
    where = str(plan) if isinstance(plan, Path) else "the mapping given"
    raw = (
        read_mapping(plan, "a plan's id, owner and steps") if isinstance(plan, Path) else dict(plan)
    )
    check_plan_steps(where, raw)
    if plan_id:
        raw["id"] = plan_id
    return where, raw


def _typed_plan(where: str, raw: dict[str, Any], settings: Settings) -> tuple[str, Plan, list[str]]:
    """A plan as its owner's type: its owner, the typed plan and the tools of an agent of that
    role built here (without the MCP servers' tools, which only the running agent has).

    The agents are imported here, not with the module: most calls need none.
    """
    from stratagem.agents import ExtensionError, build_agent

    owner = raw.get("owner")
    roles = settings_roles(settings)
    if owner not in roles:
        raise InputError(f"{where}: owner must be one of {', '.join(roles)}, not {owner!r}")
    try:
        agent = build_agent(owner, extensions=settings.extensions)
    except ExtensionError as exc:
        raise InputError(str(exc)) from exc
    try:
        typed = agent.plan_type.model_validate(raw)
    except ValidationError as exc:
        raise InputError(validation_line(f"plan in {where}", exc)) from exc
    return owner, typed, agent.registry.names()


def _plan_json(where: str, typed: Plan, tools: Sequence[str], settings: Settings) -> str:
    """Check a typed plan the way its owner will (``tools``: its owner's), as JSON."""
    from stratagem.planning import PlanValidationError, validate_plan

    targets: tuple[str, ...] = settings_roles(settings)
    if settings.a2a_agents:
        from stratagem.protocol._a2a._client import A2A_TARGET, register_a2a_capability

        register_a2a_capability()  # a step may then send a message to an external A2A agent
        targets = (*targets, A2A_TARGET)
    try:
        validate_plan(typed, tools=tools, roles=targets, capabilities=CAPABILITIES)
    except PlanValidationError as exc:
        raise InputError(f"plan {typed.id!r} refused: " + "; ".join(exc.problems)) from exc
    plan_json = typed.model_dump_json()
    check_encoded_size(where, plan_json, settings.max_message_bytes)
    return plan_json
