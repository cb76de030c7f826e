"""The operator API: what the ``stratagem`` commands do to a running deployment, from Python.

``Operator`` is async (one event loop: its gRPC channels open on the loop of its first call, and a
call from another loop is ``protocol.ProtocolUsageError``);
``SyncOperator`` (``runtime.operator._operator_sync``) runs it on a loop of its own for scripts.
Both are what the CLI's commands use. Where the agents are is ``_link``'s docstring.

``Operator`` is composed (``_compose``): one part per noun, in a module of its own, each built
on first use with only the services it uses —

* ``_link.Link``: the settings, the caller, where the agents are, the clients;
* ``_agents.Agents``: ``endpoints``, ``call``, ``health``, ``describe``;
* ``_plans.Plans``: the history API (``history``, ``plan``, ``traces``, ``plans``, ``show``,
  ``owner``), ``revisions``, ``replay``;
* ``_watch.Watch``: ``watch``;
* ``_runs.Runs``: ``run_plan``;
* ``_goals.Goals``: ``submit``, ``start``;
* ``_ask.Ask``: ``ask`` (a goal in plain words);
* ``_research.Research``: ``research``;
* ``_worlds.Worlds``: ``worlds``, ``world``, ``reset_world``;
* ``_control.Control``: ``control`` and the control verbs (``CONTROL_VERBS``).

``Verbs`` is the one table of the operator's verbs, one line each; ``Operator`` and
``SyncOperator`` both take their methods from it.

Errors (what the CLI maps to its exit codes):

* ``InputError`` (exit 2): an unknown agent, capability or plan status, a payload or plan the
  models refuse, a settings value out of range, a ``caller`` the operator may not be (an agent's
  identity: see ``runtime.config._security``); ``PlanNotFoundError`` when no agent holds a plan;
* ``protocol.MissingSecretError`` (exit 2): token mode and no cluster secret at its path;
* ``protocol.RemoteError`` subclasses (exit 1): the agent refused or failed (``PERMISSION_DENIED``,
  ``FAILED_PRECONDITION``, ``DEADLINE_EXCEEDED``...);
* ``LaunchError`` (exit 1): no deployment found, or an agent not answering;
* ``protocol.UnavailableError`` (exit 1): an agent at its published endpoint does not answer;
* other ``protocol.ProtocolError`` (exit 1).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from stratagem.protocol import OPERATOR
from stratagem.runtime.config._settings import Settings
from stratagem.runtime.operator._agents import Agents
from stratagem.runtime.operator._ask import Ask
from stratagem.runtime.operator._compose import Parts, stream, verb
from stratagem.runtime.operator._control import Control
from stratagem.runtime.operator._goals import Goals
from stratagem.runtime.operator._link import (
    RAY_DIRECTORY,
    Directory,
    Link,
    capability_spec,
    check_role,
    check_status,
    operator_settings,
    ray_directory,
)
from stratagem.runtime.operator._plans import Plans
from stratagem.runtime.operator._research import Research
from stratagem.runtime.operator._runs import PlanSource, Runs
from stratagem.runtime.operator._watch import Watch
from stratagem.runtime.operator._worlds import Worlds

__all__ = [
    "RAY_DIRECTORY",
    "Directory",
    "Operator",
    "PlanSource",
    "Verbs",
    "capability_spec",
    "check_role",
    "check_status",
    "operator_settings",
    "ray_directory",
]


class Verbs:
    """The operator's verbs, declared once: ``name = verb(Part.method)``, one line each.

    Not a base over shared state: it holds no field and no method, only this table, which
    ``Operator`` (each verb its part's coroutine method) and ``SyncOperator`` (each run to
    completion) both read. A new verb is one line here (see docs/internals.md).
    """

    endpoints = verb(Agents.endpoints)
    call = verb(Agents.call)
    health = verb(Agents.health)
    describe = verb(Agents.describe)
    history = verb(Plans.history)
    plan = verb(Plans.plan)
    traces = verb(Plans.traces)
    plans = verb(Plans.plans)
    show = verb(Plans.show)
    owner = verb(Plans.owner)
    revisions = verb(Plans.revisions)
    replay = verb(Plans.replay)
    run_plan = verb(Runs.run_plan)
    submit = verb(Goals.submit)
    start = verb(Goals.start)
    ask = verb(Ask.ask)  # a goal in plain words
    research = verb(Research.research)
    worlds = verb(Worlds.worlds)
    world = verb(Worlds.world)
    reset_world = verb(Worlds.reset_world)
    control = verb(Control.control)
    approve = verb(Control.approve)
    reject = verb(Control.reject)
    pause = verb(Control.pause)
    cancel = verb(Control.cancel)
    resume = verb(Control.resume)
    replan = verb(Control.replan)
    fork = verb(Control.fork)


class Operator(Verbs):
    """A deployment's agents, as the operator (or ``caller``) sees them.

    Args:
        state_dir: The deployment's state directory (else ``STRATAGEM_STATE_DIR``, the profile's,
            the nearest ``.stratagem`` folder, ``~/.local/state/stratagem``).
        address: A Ray cluster address: endpoints then come from Ray.
        profile: A profile of the config file.
        settings: Settings made already (instead of ``state_dir``, ``address`` and ``profile``).
        caller: The identity calls are made as; its credentials follow ``STRATAGEM_AUTH``.
        timeout_s: The deadline of a call that names none (``request_timeout_s`` when ``None``).
        endpoints: Each role's ``host:port``, used as given (no published files, no Ray).
        directory: Where endpoints come from when the published ones do not serve (Ray's).

    Use ``async with Operator() as op:`` or call ``aclose``.

    Raises:
        InputError: The settings or ``timeout_s`` are out of range.
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str] | None = None,
        *,
        address: str | None = None,
        profile: str | None = None,
        settings: Settings | None = None,
        caller: str = OPERATOR,
        timeout_s: float | None = None,
        endpoints: Mapping[str, str] | None = None,
        directory: Directory | None = None,
    ) -> None:
        if settings is not None and (state_dir, address, profile) != (None, None, None):
            raise TypeError("pass settings, or state_dir/address/profile, not both")
        if settings is None:
            settings = operator_settings(state_dir, address=address, profile=profile)
        link = Link(
            settings,
            caller=caller,
            timeout_s=timeout_s,
            endpoints=endpoints,
            directory=directory,
        )
        self.settings = settings
        """The deployment's settings."""
        self.caller = caller
        """The identity calls are made as."""
        self._link = link
        self._parts = Parts(link)
        self._finish: None = None
        """How a verb's coroutine is finished: not here (the caller awaits it)."""

    async def __aenter__(self) -> Operator:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every channel, and let go of the directory (a Ray connection)."""
        await self._link.aclose()

    @property
    def roles(self) -> tuple[str, ...]:
        """Every agent's role: the built-in four, then those the settings' extensions define
        (imported on first use, as the agents import them).

        Raises:
            InputError: An extension does not load, or defines an agent badly.
        """
        return self._link.roles

    watch = stream(Watch.watch)
