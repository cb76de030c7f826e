"""A lexical scorer: Okapi BM25 over intent phrasings, normalised to 0-1 per phrasing.

Words are lowercased, split on anything but letters and digits, stripped of a few function words
and of a plural or ``-ing`` ending (``timers`` and ``timer`` match; ``setting`` and ``set``). A
phrasing's score for a query is its BM25 score divided by the score the phrasing would give itself,
capped at 1: a query that holds every content word of a phrasing scores 1, whatever the size of the
directory, so one threshold fits every deployment.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Final

__all__ = ["STOPWORDS", "Bm25", "tokens"]

STOPWORDS: Final = frozenset(
    [
        "a",
        "an",
        "the",
        "and",
        "or",
        "then",
        "also",
        "please",
        "me",
        "my",
        "i",
        "you",
        "your",
        "to",
        "for",
        "of",
        "in",
        "on",
        "at",
        "by",
        "with",
        "from",
        "is",
        "are",
        "be",
        "it",
        "its",
        "this",
        "that",
        "what",
        "whats",
        "how",
        "can",
        "could",
        "would",
        "will",
        "shall",
        "do",
        "does",
        "let",
        "lets",
        "us",
        "our",
        "some",
        "any",
        "there",
    ]
)
_WORD: Final = re.compile(r"[a-z0-9]+")


def _stem(word: str) -> str:
    if len(word) > 5 and word.endswith("ing"):
        word = word[:-3]
        if len(word) > 2 and word[-1] == word[-2]:  # setting -> sett -> set
            word = word[:-1]
        return word
    if len(word) > 3 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def tokens(text: str) -> list[str]:
    """The content words of ``text``, stemmed (see the module docstring)."""
    return [_stem(w) for w in _WORD.findall(text.lower()) if w not in STOPWORDS]


class Bm25:
    """BM25 (``k1``, ``b``) over ``documents`` (each a list of tokens).

    Args:
        documents: The phrasings' tokens, one list per phrasing.
        k1: Term-frequency saturation.
        b: Length normalisation.
    """

    def __init__(self, documents: Sequence[list[str]], *, k1: float = 1.2, b: float = 0.75) -> None:
        self._docs = [Counter(doc) for doc in documents]
        self._lengths = [len(doc) for doc in documents]
        n = len(documents)
        self._avg = (sum(self._lengths) / n) if n else 0.0
        df: Counter[str] = Counter()
        for doc in self._docs:
            df.update(doc.keys())
        self._idf = {t: math.log(1.0 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}
        self._k1, self._b = k1, b
        self._self = [self._raw(list(doc.elements()), i) for i, doc in enumerate(self._docs)]

    def _raw(self, query: list[str], index: int) -> float:
        doc, length = self._docs[index], self._lengths[index]
        norm = self._k1 * (1 - self._b + self._b * length / self._avg) if self._avg else self._k1
        score = 0.0
        for term in set(query):
            tf = doc.get(term, 0)
            if tf:
                score += self._idf[term] * tf * (self._k1 + 1) / (tf + norm)
        return score

    def scores(self, query: list[str]) -> list[float]:
        """Each document's score for ``query``, 0-1 (see the module docstring)."""
        return [
            min(1.0, self._raw(query, i) / self._self[i]) if self._self[i] > 0 else 0.0
            for i in range(len(self._docs))
        ]
