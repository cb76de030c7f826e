"""A model in the research path: it writes the sub-questions and a synthesis, both checked.

The model's sub-questions are validated like any (words to search for, acceptance criteria
derived); an answer that is not the asked JSON, or asks nothing, falls back to the deterministic
sub-questions. Its synthesis is a list of sentences, each citing passages of the report's claims;
a sentence is kept only when every passage it cites says it (half or more of its words in one
sentence of the passage: ``check_report``'s rule for a supporting citation). Refused sentences go
back to the model once as a critique naming each; what is still refused is dropped, never shown.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stratagem.agents._model import ChatMessage, ChatRequest, ModelClient, parse_json_answer
from stratagem.agents.research._findings import SUPPORT_OVERLAP, sub_questions
from stratagem.agents.research._text import overlap, sentences, terms
from stratagem.agents.research._types import Claim, SubQuestion
from stratagem.planning import LogicError, TransientError

__all__ = ["ModelResearcher", "Synthesis", "SynthesisSentence"]

logger = logging.getLogger(__name__)

MAX_SUB_QUESTIONS = 6


class _Asked(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sub_questions: list[str] = Field(min_length=1, max_length=MAX_SUB_QUESTIONS)


class SynthesisSentence(BaseModel):
    """One sentence of a synthesis and the passages (``s7:L94-102``) it rests on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str = Field(min_length=1, max_length=1000)
    cites: list[str] = Field(min_length=1, max_length=8)


class _Written(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sentences: list[SynthesisSentence] = Field(max_length=20)


@dataclass(frozen=True, slots=True)
class Synthesis:
    """A checked synthesis: the sentences kept, and one line per sentence refused."""

    sentences: tuple[SynthesisSentence, ...]
    refused: tuple[str, ...]


def _schema(model: type[BaseModel]) -> dict[str, object]:
    return model.model_json_schema()


class ModelResearcher:
    """Asks a model for sub-questions and a synthesis, and checks what it answers."""

    def __init__(self, client: ModelClient, *, max_tokens: int = 400) -> None:
        self.client = client
        self.max_tokens = max_tokens

    async def _ask(self, prompt: str, schema: type[BaseModel], name: str) -> object:
        request = ChatRequest(
            messages=(ChatMessage("user", prompt),),
            max_tokens=self.max_tokens,
            schema=_schema(schema),
            schema_name=name,
        )
        return parse_json_answer(await self.client.chat(request))

    async def sub_questions(self, question: str) -> list[SubQuestion]:
        """The model's sub-questions for ``question`` (the whole question first), else the
        deterministic ones when its answer does not do."""
        fallback = sub_questions(question)
        try:
            answer = _Asked.model_validate(
                await self._ask(
                    "Break this research question into at most "
                    f"{MAX_SUB_QUESTIONS} short, verifiable sub-questions. Answer as JSON "
                    f'{{"sub_questions": [...]}}.\nQuestion: {question}',
                    _Asked,
                    "sub_questions",
                )
            )
        except (LogicError, TransientError, ValidationError) as exc:
            logger.info("research: the model's sub-questions refused (%s): deterministic ones", exc)
            return fallback
        found = list(fallback[:1])
        for text in answer.sub_questions:
            words = list(dict.fromkeys(terms(text)))[:32]
            if not words or any(sq.terms == words for sq in found):
                continue
            found.append(
                fallback[0].model_copy(
                    update={
                        "id": f"q{len(found) + 1}",
                        "text": text.strip()[:2000],
                        "terms": words,
                        "acceptance": [
                            f"a claim cited from a passage that speaks of {', '.join(words[:6])}",
                            *fallback[0].acceptance[1:],
                        ],
                    }
                )
            )
        return found

    async def synthesize(
        self, question: str, claims: Sequence[Claim], passages: dict[str, str]
    ) -> Synthesis:
        """A synthesis of the claims, each sentence checked against the passages it cites
        (``passages``: passage id -> its text); one critique round for what is refused."""
        listing = "\n".join(f"- [{c.citations[0].passage}] {c.text}" for c in claims if c.citations)
        prompt = (
            f"Question: {question}\nClaims, each with the passage that says it:\n{listing}\n"
            'Answer the question in a few sentences as JSON {"sentences": [{"text": ..., '
            '"cites": ["s1:L3-4", ...]}]}: each sentence must say only what its cited passages say.'
        )
        kept: list[SynthesisSentence] = []
        refused: list[str] = []
        for round_ in range(2):
            try:
                written = _Written.model_validate(await self._ask(prompt, _Written, "synthesis"))
            except (LogicError, TransientError, ValidationError) as exc:
                refused.append(f"the answer was not a synthesis ({type(exc).__name__})")
                break
            refused = []
            kept = []
            for sentence in written.sentences:
                problem = _problem(sentence, passages)
                if problem:
                    refused.append(problem)
                else:
                    kept.append(sentence)
            if not refused or round_ == 1:
                break
            prompt += (
                f"\nYour answer was {json.dumps(written.model_dump())}.\nThese sentences were "
                "refused: " + "; ".join(refused) + ". Answer again with only what the passages say."
            )
        return Synthesis(tuple(kept), tuple(refused))


def _problem(sentence: SynthesisSentence, passages: dict[str, str]) -> str:
    mine = terms(sentence.text)
    for cited in sentence.cites:
        text = passages.get(cited)
        if text is None:
            return f"[{cited}] is no passage of the claims: {sentence.text[:80]}"
        if not any(overlap(mine, terms(s)) >= SUPPORT_OVERLAP for s in sentences(text)):
            return f"[{cited}] does not say: {sentence.text[:80]}"
    return ""
