"""An example extension whose capabilities travel as general wire values, not extension JSON.

* ``RateTension`` (strategic) travels as a ``google.protobuf.Struct``: a client in any language
  sends a map, and both sides validate it against the capability's JSON Schema (``describe``
  shows it; the pydantic models below are where it comes from).
* ``Appraise`` (perception) travels as the extension's own protobuf messages,
  ``appraisal.v1.AppraiseRequest`` and ``appraisal.v1.Appraisal`` from
  ``examples/extensions/appraisal/appraisal.proto``, packed in a ``google.protobuf.Any``; a client
  compiles that .proto beside Stratagem's. ``register_capability`` refuses the capability when the
  messages' fields and the models differ.

Load it like any extension::

    STRATAGEM_EXTENSIONS=examples.extensions.wire_values stratagem up
    stratagem request strategic RateTension --json '{"text": "The storm broke. Run!"}'
    stratagem describe perception   # Appraise: wire message, appraisal.v1.AppraiseRequest

The generated ``appraisal_pb2.py`` is checked in; regenerate it with::

    python -m grpc_tools.protoc -I examples/extensions/appraisal \\
        --python_out=examples/extensions/appraisal --pyi_out=examples/extensions/appraisal \\
        examples/extensions/appraisal/appraisal.proto
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field

from examples.extensions.appraisal import appraisal_pb2
from stratagem.agents import Agent, PerceptionAgent, PerceptionPlan, StrategicPlan, tool
from stratagem.planning import PlanResult, ToolStep
from stratagem.protocol import EXTENSION_FIELD, CapabilitySpec, WireModel, register_capability


class RateTensionRequest(WireModel):
    """Rate a text's tension on a scale."""

    text: str = Field(min_length=1, max_length=20_000)
    scale: int = Field(default=10, ge=1, le=100)


class TensionRating(WireModel):
    """The rating, and the words that raised it."""

    rating: float = Field(ge=0)
    words: list[str] = Field(default_factory=list, max_length=50)


class AppraiseRequest(WireModel):
    """What the world knows about one entity (``appraisal.v1.AppraiseRequest``)."""

    entity_id: str = Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_]*$")
    predicates: list[str] = Field(default_factory=list, max_length=8)


class Appraisal(WireModel):
    """``appraisal.v1.Appraisal``."""

    entity_id: str = Field(max_length=64)
    facts: int = Field(ge=0, le=2**31 - 1)
    about: list[str] = Field(default_factory=list, max_length=200)


RATE_TENSION = CapabilitySpec(
    name="RateTension",
    role="strategic",
    field=EXTENSION_FIELD,
    request=RateTensionRequest,
    response=TensionRating,
    wire="struct",
)
APPRAISE = CapabilitySpec(
    name="Appraise",
    role="perception",
    field=EXTENSION_FIELD,
    request=AppraiseRequest,
    response=Appraisal,
    wire="message",
    messages=(appraisal_pb2.AppraiseRequest, appraisal_pb2.Appraisal),
)
register_capability(RATE_TENSION)
register_capability(APPRAISE)

_TENSE = re.compile(r"\b(storm|run|fear|dark|blood|scream|fire|danger|must|never)\b", re.I)


@tool
async def rate_tension(text: str, scale: int = 10) -> TensionRating:
    """Tension words per sentence, on ``scale``."""
    words = [w.lower() for w in _TENSE.findall(text)]
    sentences = max(1, len(re.findall(r"[.!?]+", text)) or 1)
    return TensionRating(rating=round(min(1.0, len(words) / sentences) * scale, 2), words=words)


class _OnePlan:
    """A one-step plan of the agent's plan type; the step's output is the response."""

    def __init__(self, plan_type: type[Any], owner: str, tool_name: str, response: type[Any]):
        self._plan_type, self._owner, self._tool, self._response = (
            plan_type,
            owner,
            tool_name,
            response,
        )

    def plan(self, capability: str, request: WireModel, *, plan_id: str) -> Any:
        return self._plan_type(
            id=plan_id,
            owner=self._owner,
            goal=f"answer {capability}",
            steps=[ToolStep(id="answer", tool=self._tool, input=request.model_dump())],
        )

    def respond(self, capability: str, request: WireModel, result: PlanResult[Any]) -> WireModel:
        return self._response.model_validate(result.outputs["answer"])  # type: ignore[no-any-return]


def setup(agent: Agent) -> None:
    """``RateTension`` on the strategic agent, ``Appraise`` on the perception agent."""
    if agent.role == "strategic":
        agent.registry.register(rate_tension)
        agent.add_capability(
            RATE_TENSION, _OnePlan(StrategicPlan, "strategic", "rate_tension", TensionRating)
        )
    elif isinstance(agent, PerceptionAgent):
        world = agent.world

        @tool
        async def appraise(entity_id: str, predicates: list[str]) -> Appraisal:
            """The facts of the world that involve ``entity_id``."""
            facts = [
                f
                for f in world.facts()
                if entity_id in (f.subject, f.object)
                and (not predicates or f.predicate in predicates)
            ]
            return Appraisal(
                entity_id=entity_id,
                facts=len(facts),
                about=[f"{f.subject} {f.predicate} {f.object}" for f in facts][:200],
            )

        agent.registry.register(appraise)
        agent.add_capability(
            APPRAISE, _OnePlan(PerceptionPlan, "perception", "appraise", Appraisal)
        )
