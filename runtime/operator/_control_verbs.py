"""The control verbs' table: what the commands derive from each control verb beside its method
(``_control.Control``): its one-line summary (the CLI's help of its command), whether it takes
nothing but the plan (the CLI registers one command body for those) and whether the agent's
refusal of it is about the caller's input (the CLI's exit 2).

Declared once, in the order of ``protocol.CONTROL_ACTIONS`` (a test holds it to them and to
``_operator.Verbs``). It imports nothing heavy, not even ``protocol`` (an import contract in
pyproject.toml holds it to that): the CLI reads it when it registers its commands.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

__all__ = ["CONTROL_VERBS", "ControlVerb"]


@dataclass(frozen=True, slots=True)
class ControlVerb:
    """What is declared of one control verb beside its ``Control`` method.

    Attributes:
        summary: One line: what it does (the CLI's help of its command).
        plan_only: It takes nothing but the plan (and a deadline).
        refusal_is_input: The agent's ``INVALID_ARGUMENT`` or ``FAILED_PRECONDITION`` answer to
            it is about the caller's input (a value that does not fit a gate, a closed gate, no
            such fork point): the CLI says it in one line and exits 2.
    """

    summary: str
    plan_only: bool = False
    refusal_is_input: bool = False


CONTROL_VERBS: Final[Mapping[str, ControlVerb]] = {
    # Keyed by protocol.ControlAction (a str here: protocol is not imported).
    "approve": ControlVerb(
        "Approve a gate: its plan goes on (a reconciled step is re-run, or recorded with "
        "--output; a gate that asks takes --value; a tool's approval may edit its --arguments).",
        refusal_is_input=True,
    ),
    "reject": ControlVerb(
        "Reject a gate: the gate (or reconciled step) fails, and so its plan, which is "
        "compensated.",
        refusal_is_input=True,
    ),
    "pause": ControlVerb(
        "Pause a plan: no new step starts, running ones finish; 'resume' continues it.",
        plan_only=True,
    ),
    "cancel": ControlVerb(
        "Cancel a plan for good: running steps are cancelled, completed ones compensated.",
        plan_only=True,
    ),
    "resume": ControlVerb(
        "Resume a stored, unfinished plan that is not running (paused, or left by a stop).",
        plan_only=True,
    ),
    "replan": ControlVerb(
        "Make a new revision of a stored plan that is not running (pause it first); 'resume' "
        "runs it, with the results of unchanged completed steps carried over."
    ),
    "fork": ControlVerb(
        "Fork a plan into a new one (new id, forked_from recorded) that runs on from a step or "
        "revision, with the recorded results before it carried and --set outputs substituted.",
        refusal_is_input=True,
    ),
}
