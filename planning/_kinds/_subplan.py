"""The ``subplan`` kind: run a nested plan of the same agent once (per attempt) and wait."""

from __future__ import annotations

from stratagem.planning._kinds._kind import StepKind
from stratagem.planning._kinds._nested import body, refusals, validate
from stratagem.planning._plan import SubplanStep

KIND = StepKind(
    name="subplan",
    model=SubplanStep,
    what="a sub-plan",
    start="plans",
    validate=validate,
    refuses=refusals("a sub-plan"),
    body=body,
)
