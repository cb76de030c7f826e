"""The ``loop`` kind: repeat a body (a nested plan per iteration) until a condition holds."""

from __future__ import annotations

from stratagem.planning._kinds._kind import StepKind
from stratagem.planning._kinds._nested import body, refusals, validate
from stratagem.planning._plan import LoopStep

KIND = StepKind(
    name="loop",
    model=LoopStep,
    what="a loop",
    start="plans",
    validate=validate,
    refuses=refusals("a loop"),
    body=body,
)
