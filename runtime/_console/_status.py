"""How each agent is doing (health, node, process, recent restarts, plans running and blocked,
why one gave up), computed in the console's own process through the operator API and the state
directory: no child process and no Ray driver, so the agents page answers at once (a
``stratagem status --json`` child took 6 to 15 s a load). Answers are kept ``FRESH_S`` and one
question is asked at a time, whatever the number of browsers. Ray's own account of a dead actor
(its death cause, its node id) stays with ``stratagem status``, which joins Ray."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Final

from stratagem.protocol import MAX_PLANS_PAGE
from stratagem.runtime._console._data import READ_ERRORS, problem_line
from stratagem.runtime.config._published import read_published
from stratagem.runtime.config._restarts import gave_up_reason
from stratagem.runtime.operator._operator import Operator

__all__ = ["AgentStatus", "StatusCache", "StatusView", "agents_status"]

logger = logging.getLogger(__name__)

FRESH_S: Final = 2.0
"""How long an answer is shown before the agents are asked again."""


@dataclass(frozen=True, slots=True)
class AgentStatus:
    """One agent as the console sees it.

    Attributes:
        role: Its role.
        state: ``serving``, ``not serving`` (it answers and says its storage is not well),
            ``gave up`` (it stopped restarting: ``problem`` says why) or ``down``.
        health: Its gRPC health answer, or why there is none.
        endpoint: Where it serves (``""``: not found).
        node: The host of its endpoint.
        pid: Its process, when it published it on this machine (``None``: unknown here).
        restarts: Its recent restarts, as its restart budget counts them (``None``: no record).
        plans_running: Its plans running now (``None``: not read).
        plans_blocked: Its plans waiting at a gate (``None``: not read).
        problem: Why it does not serve, in one line.
    """

    role: str
    state: str
    health: str = ""
    endpoint: str = ""
    node: str = ""
    pid: int | None = None
    restarts: int | None = None
    plans_running: int | None = None
    plans_blocked: int | None = None
    problem: str = ""


@dataclass(frozen=True, slots=True)
class StatusView:
    """Every agent's status, or why it could not be had.

    Attributes:
        agents: Per role.
        problem: What could not be read for all of them (``""``: nothing).
        asked_at: When (wall clock).
    """

    agents: dict[str, AgentStatus] = field(default_factory=dict)
    problem: str = ""
    asked_at: float = 0.0


def _restarts(path_text: str) -> int | None:
    try:
        with open(path_text, encoding="utf-8") as source:
            data = json.load(source)
        times = data.get("restarts") if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None
    return len(times) if isinstance(times, list) else None


async def _count(operator: Operator, status: str) -> tuple[Counter[str], list[str]]:
    """How many plans of each agent are in ``status`` (every page), and what could not be read."""
    counts: Counter[str] = Counter()
    token = ""
    problems: list[str] = []
    while True:
        page = await operator.history(status=status, page_size=MAX_PLANS_PAGE, page_token=token)
        counts.update(view.agent for view in page.plans)
        problems.extend(page.unreadable)
        token = page.next_page_token
        if not token or len(page.plans) < MAX_PLANS_PAGE:
            return counts, problems


async def _one(operator: Operator, role: str) -> AgentStatus:
    settings = operator.settings
    gave_up = gave_up_reason(settings.restarts_path(role))
    restarts = _restarts(str(settings.restarts_path(role)))
    try:
        endpoint = (await operator.endpoints([role]))[role]
    except READ_ERRORS as exc:
        state = "gave up" if gave_up else "down"
        return AgentStatus(role, state, restarts=restarts, problem=gave_up or problem_line(exc))
    published = read_published(settings.state_dir, role)
    pid = published.pid if published is not None and published.endpoint == endpoint else None
    node = endpoint.rpartition(":")[0].strip("[]")
    try:
        health = await operator.health(role)
    except READ_ERRORS as exc:
        return AgentStatus(
            role,
            "gave up" if gave_up else "down",
            "no answer",
            endpoint,
            node,
            pid,
            restarts,
            problem=gave_up or problem_line(exc),
        )
    state = "serving" if health == "SERVING" else "not serving"
    return AgentStatus(role, state, health, endpoint, node, pid, restarts, problem=gave_up)


async def agents_status(operator: Operator) -> StatusView:
    """Every agent's status, asked at once through ``operator``."""
    now = time.time()
    agents = await asyncio.gather(*(_one(operator, role) for role in operator.roles))
    counts: tuple[Counter[str], Counter[str]] | None = None
    unread_lines: list[str] = []
    try:
        (running, ran), (blocked, held) = await asyncio.gather(
            _count(operator, "running"), _count(operator, "blocked")
        )
    except READ_ERRORS as exc:
        problem = f"plans not counted: {problem_line(exc)}"
    else:
        counts = (running, blocked)
        unread_lines = [line for line in (*ran, *held) if line]
        unread = "; ".join(dict.fromkeys(unread_lines))
        problem = f"plans not counted: {unread}" if unread else ""
    found: dict[str, AgentStatus] = {}
    for agent in agents:
        read = not any(line.startswith(f"{agent.role}: ") for line in unread_lines)
        if counts is not None and read and agent.state in ("serving", "not serving"):
            agent = dataclasses.replace(
                agent,
                plans_running=counts[0][agent.role],
                plans_blocked=counts[1][agent.role],
            )
        found[agent.role] = agent
    return StatusView(found, problem, now)


class StatusCache:
    """The latest ``StatusView``, asked again when older than ``FRESH_S`` (one question at a
    time).

    Args:
        operator: The console's operator API.
    """

    def __init__(self, operator: Operator) -> None:
        self._operator = operator
        self._last: StatusView | None = None
        self._lock = asyncio.Lock()

    async def view(self) -> StatusView:
        """The latest answer."""
        async with self._lock:
            last = self._last
            if last is not None and time.time() - last.asked_at < FRESH_S:
                return last
            self._last = await agents_status(self._operator)
            return self._last
