"""The runtime's error tree: every failure the runtime raises on purpose is a
``StratagemRuntimeError``, and says in its class how the command line ends for it.

::

    StratagemRuntimeError            exit 1 unless a subclass says otherwise
    ├── InputError                   exit 2: the user's input is wrong (one line: what and where)
    │   └── PlanNotFoundError        no agent holds the plan named
    ├── LaunchError                  exit 1: Stratagem could not be started, reached or stopped
    │   └── AgentStartError          (host._launcher) an agent did not start
    ├── BackendError                 (telemetry._backend) a trace backend did not answer as expected
    ├── WebhookRefusedError          (host._notify) a gate's webhook was refused
    └── McpSetupError                (host._mcp) an agent's MCP face could not start

The command line catches ``StratagemRuntimeError`` (and ``protocol.ProtocolError`` for the wire's
errors) instead of a list of classes: a new runtime error is one subclass here or beside the code
that raises it, and the command line turns it into one line and ``exit_code`` without a change.
This module imports nothing of the runtime, so that every package of it may take its errors here.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = ["InputError", "LaunchError", "PlanNotFoundError", "StratagemRuntimeError"]


class StratagemRuntimeError(Exception):
    """A failure the runtime raises on purpose; its message is one line for the user."""

    exit_code: ClassVar[int] = 1
    """How the ``stratagem`` command ends when this reaches it (2: the input was wrong)."""


class InputError(StratagemRuntimeError):
    """The user's input is wrong; the message says what and where, in one line."""

    exit_code: ClassVar[int] = 2


class PlanNotFoundError(InputError):
    """No agent holds the plan named (``plan_id``)."""

    def __init__(self, plan_id: str) -> None:
        super().__init__(f"no plan {plan_id!r} on any agent")
        self.plan_id = plan_id


class LaunchError(StratagemRuntimeError):
    """Stratagem could not be started, reached or stopped; the message says why in one line."""
