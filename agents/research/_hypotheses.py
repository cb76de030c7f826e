"""A hypothesis tracker: hypotheses, evidence for and against, confidence, a decision table.

Confidence is updated with each piece of evidence by Bayes' rule in odds form: the posterior odds
are the prior odds times the evidence's likelihood ratio (``strength`` for evidence for, its
inverse against). Hypotheses are tested in the order of ``priority``: likelihood per unit of test
cost, highest first (the seed's "prioritize by likelihood and cost of test").
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from stratagem.agents.research._types import DecisionRow, Evidence, Hypothesis
from stratagem.planning import ExpressionError, expression

__all__ = ["HypothesisState", "HypothesisTracker"]


class HypothesisState(BaseModel):
    """A hypothesis with its evidence and its confidence now.

    Attributes:
        hypothesis: The hypothesis.
        evidence: Its evidence, in the order recorded.
        confidence: The probability it holds given the evidence.
        priority: ``confidence / test_cost``: which to test first.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    hypothesis: Hypothesis
    evidence: list[Evidence] = Field(default_factory=list)
    confidence: float = Field(ge=0.0, le=1.0)
    priority: float = Field(ge=0.0)


def _posterior(prior: float, evidence: Sequence[Evidence]) -> float:
    odds = prior / (1.0 - prior)
    for item in evidence:
        odds = odds * item.strength if item.direction == "for" else odds / item.strength
    return odds / (1.0 + odds)


class HypothesisTracker(BaseModel):
    """Hypotheses, their evidence and the decision table of one investigation.

    It is data (a plan step's output, a file, a store row): ``model_dump_json`` keeps it, and
    validation refuses evidence or a table row naming a hypothesis it does not hold, a duplicate
    id, or a ``when`` that is not a plan-language expression.

    Attributes:
        hypotheses: The hypotheses, by id order.
        evidence: All evidence, in the order recorded.
        decisions: The decision table: each test outcome and the step it leads to.
    """

    model_config = ConfigDict(extra="forbid")

    hypotheses: list[Hypothesis] = Field(default_factory=list)
    evidence: list[Evidence] = Field(default_factory=list)
    decisions: list[DecisionRow] = Field(default_factory=list)

    @model_validator(mode="after")
    def _linked(self) -> HypothesisTracker:
        ids = [h.id for h in self.hypotheses]
        if len(set(ids)) != len(ids):
            raise ValueError(f"hypotheses: duplicate id {_first_duplicate(ids)}")
        for n, item in enumerate(self.evidence):
            if item.hypothesis not in ids:
                raise ValueError(f"evidence[{n}].hypothesis: no hypothesis {item.hypothesis}")
        for n, row in enumerate(self.decisions):
            if row.hypothesis not in ids:
                raise ValueError(f"decisions[{n}].hypothesis: no hypothesis {row.hypothesis}")
            try:
                expression(row.when)
            except ExpressionError as exc:
                raise ValueError(f"decisions[{n}].when: {exc}") from exc
        return self

    def add(self, hypothesis: Hypothesis) -> None:
        """Add a hypothesis (``ValueError`` when its id is taken)."""
        if any(h.id == hypothesis.id for h in self.hypotheses):
            raise ValueError(f"hypotheses: {hypothesis.id} is already tracked")
        self.hypotheses.append(hypothesis)

    def record(self, evidence: Evidence) -> float:
        """Record evidence; return the hypothesis' confidence after it."""
        if not any(h.id == evidence.hypothesis for h in self.hypotheses):
            raise ValueError(f"evidence.hypothesis: no hypothesis {evidence.hypothesis}")
        self.evidence.append(evidence)
        return self.state(evidence.hypothesis).confidence

    def decide(self, row: DecisionRow) -> None:
        """Add a row to the decision table (checked as at validation)."""
        HypothesisTracker.model_validate(
            {"hypotheses": self.hypotheses, "decisions": [*self.decisions, row]}
        )
        self.decisions.append(row)

    def state(self, hypothesis_id: str) -> HypothesisState:
        """One hypothesis with its evidence and confidence (``KeyError`` when unknown)."""
        for hypothesis in self.hypotheses:
            if hypothesis.id == hypothesis_id:
                mine = [e for e in self.evidence if e.hypothesis == hypothesis_id]
                confidence = _posterior(hypothesis.prior, mine)
                return HypothesisState(
                    hypothesis=hypothesis,
                    evidence=mine,
                    confidence=round(confidence, 6),
                    priority=round(confidence / hypothesis.test_cost, 6),
                )
        raise KeyError(hypothesis_id)

    def ranked(self) -> list[HypothesisState]:
        """Every hypothesis, the one to test first first (priority, then id)."""
        states = [self.state(h.id) for h in self.hypotheses]
        return sorted(states, key=lambda s: (-s.priority, s.hypothesis.id))


def _first_duplicate(ids: Sequence[str]) -> str:
    seen: set[str] = set()
    for item in ids:
        if item in seen:
            return item
        seen.add(item)
    return ""
