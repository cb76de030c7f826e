"""An example extension: a ``count_words`` tool and a ``CountWords`` capability for strategic.

Load it into every agent (each one calls ``setup``; only the strategic agent changes)::

    STRATAGEM_EXTENSIONS=examples.extensions.word_count stratagem demo
    stratagem request strategic CountWords --json '{"text": "Mira waits in the courtyard."}'

The capability travels in the envelope's ``extension`` body as the JSON of its own pydantic models,
validated on both sides like a built-in one. It is registered when the module is imported, so a
client process that imports this module can encode the request too.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from pydantic import Field

from stratagem.agents import Agent, StrategicPlan, tool
from stratagem.planning import PlanResult, ToolStep
from stratagem.protocol import EXTENSION_FIELD, CapabilitySpec, WireModel, register_capability


class CountWordsRequest(WireModel):
    """Count the words of a text."""

    text: str = Field(min_length=1, max_length=20_000)
    top: int = Field(default=3, ge=0, le=50)


class CountWordsResponse(WireModel):
    """How many words, how many distinct ones, and the most frequent."""

    words: int = Field(ge=0)
    distinct: int = Field(ge=0)
    most_common: list[str] = Field(default_factory=list)


COUNT_WORDS = CapabilitySpec(
    name="CountWords",
    role="strategic",
    field=EXTENSION_FIELD,
    request=CountWordsRequest,
    response=CountWordsResponse,
)
register_capability(COUNT_WORDS)

_WORD = re.compile(r"[A-Za-z']+")


@tool
async def count_words(text: str, top: int = 3) -> CountWordsResponse:
    """Count the words of a text and name the most frequent ones."""
    words = [w.lower() for w in _WORD.findall(text)]
    counts = Counter(words)
    return CountWordsResponse(
        words=len(words),
        distinct=len(counts),
        most_common=[word for word, _ in counts.most_common(top)],
    )


class CountWordsPlanner:
    """Plans ``CountWords`` as one ``count_words`` step of a strategic plan."""

    def plan(self, capability: str, request: WireModel, *, plan_id: str) -> StrategicPlan:
        """A one-step plan."""
        if not isinstance(request, CountWordsRequest):
            raise ValueError(f"cannot plan {capability!r}")
        return StrategicPlan(
            id=plan_id,
            owner="strategic",
            goal="count the words of a text",
            steps=[
                ToolStep(
                    id="count",
                    tool="count_words",
                    input={"text": request.text, "top": request.top},
                )
            ],
        )

    def respond(self, capability: str, request: WireModel, result: PlanResult[Any]) -> WireModel:
        """The count step's output is the response."""
        return CountWordsResponse.model_validate(result.outputs["count"])


def setup(agent: Agent) -> None:
    """Add the tool and the capability to the strategic agent; leave the others alone."""
    if agent.role != "strategic":
        return
    agent.registry.register(count_words)
    agent.add_capability(COUNT_WORDS, CountWordsPlanner())
