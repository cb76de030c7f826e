"""What the ``loop`` and ``subplan`` kinds share: a body of steps run as nested plans, which
compensate themselves (so the step names no compensation) and hold no policy gate."""

from __future__ import annotations

from collections.abc import Sequence

from stratagem.planning._kinds._kind import Checks, Refusal
from stratagem.planning._plan import LoopStep, Step, SubplanStep


def body(step: LoopStep | SubplanStep) -> Sequence[Step]:
    """The steps ``step`` runs as a nested plan."""
    return step.steps


def refusals(what: str) -> tuple[Refusal, ...]:
    """What a kind that runs nested plans refuses (``what``: "a loop")."""
    return (
        Refusal(
            ("compensate", "compensate_input"),
            f"step {{id}} is {what}: it cannot have a compensation (its body's steps have their "
            f"own)",
        ),
        Refusal(
            ("on_policy_failure",),
            f"step {{id}} is {what}: on_policy_failure 'gate' is for tool and cross-agent steps",
        ),
    )


def validate(checks: Checks, step: LoopStep | SubplanStep) -> list[str]:
    """A loop's or a sub-plan's problems: its bound, inputs and body."""
    return checks.plans(step)
