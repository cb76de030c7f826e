"""Vector recall: an embeddings endpoint, and the exact cosine scan the stores run.

When a store is given an ``Embedder``, each ``put`` embeds the item's text (``searchable_text``)
before it writes (an endpoint that fails writes nothing), and ``search`` with a query embeds the
query and ranks by cosine similarity instead of full text. ``OpenAIEmbedder`` speaks the
OpenAI-compatible ``POST /v1/embeddings`` (llama.cpp's server with ``--embeddings``, vLLM, Ollama,
OpenAI); an answer of one vector per token (llama-cpp-python's server for a model without a pooling
type, such as the embedded Gemma) is mean-pooled into one.

The scan is exact and bounded: no vector index ships here (neither sqlite-vec nor pgvector installs
from this project's package sources), so a search reads the vectors of the namespace's newest
``VECTOR_SCAN_LIMIT`` items that pass its filters and ranks them in Python; older items are not
recalled by vector (full text still finds them without an embedder). Vectors are stored
normalised, as float32.
"""

from __future__ import annotations

import asyncio
import json
import math
import urllib.error
import urllib.request
from array import array
from collections.abc import Iterable, Sequence
from typing import Any, Final, Protocol, TypeVar

from stratagem.agents._errors import AgentError

__all__ = [
    "VECTOR_SCAN_LIMIT",
    "Embedder",
    "EmbeddingError",
    "OpenAIEmbedder",
    "pack",
    "rank",
]

R = TypeVar("R")

VECTOR_SCAN_LIMIT: Final = 5000
"""The most items one vector search compares (a namespace's newest that pass the filters)."""


class EmbeddingError(AgentError):
    """The embeddings endpoint failed or answered something that is not embeddings (nothing was
    written)."""


class Embedder(Protocol):
    """Turns texts into vectors (one per text, all of one length)."""

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """The vectors of ``texts``, in order.

        Raises:
            EmbeddingError: The endpoint failed.
        """
        ...


class OpenAIEmbedder:
    """An OpenAI-compatible ``/v1/embeddings`` endpoint.

    Args:
        url: The API's base URL, such as ``http://127.0.0.1:8080/v1``.
        model: The model to ask for.
        api_key: Sent as a bearer token when given.
        timeout_s: How long one request may take.
    """

    def __init__(
        self, url: str, model: str = "default", *, api_key: str = "", timeout_s: float = 30.0
    ) -> None:
        self.url = url.rstrip("/") + "/embeddings"
        self.model = model
        self._api_key = api_key
        self._timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"OpenAIEmbedder({self.url!r}, {self.model!r})"

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return await asyncio.to_thread(self._post, list(texts))

    def _post(self, texts: list[str]) -> list[list[float]]:
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        body = json.dumps({"model": self.model, "input": texts}).encode("utf-8")
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s) as answer:
                data = json.loads(answer.read(64 * 1024 * 1024))
        except (OSError, urllib.error.URLError, ValueError) as exc:
            raise EmbeddingError(f"embeddings endpoint {self.url}: {exc}") from None
        try:
            rows = sorted(data["data"], key=lambda row: row["index"])
            vectors = [_pooled(row["embedding"]) for row in rows]
        except (KeyError, TypeError, ValueError) as exc:
            raise EmbeddingError(
                f"embeddings endpoint {self.url}: not an embeddings answer ({exc!r})"
            ) from None
        if len(vectors) != len(texts) or len({len(v) for v in vectors}) > 1 or not vectors[0]:
            raise EmbeddingError(f"embeddings endpoint {self.url}: {len(vectors)} vectors")
        return vectors


def _pooled(embedding: Sequence[Any]) -> list[float]:
    """One vector: as given, or the mean of the per-token vectors a server without pooling
    answers (llama-cpp-python's server for a model without a pooling type)."""
    if embedding and isinstance(embedding[0], list):
        size = len(embedding[0])
        if not all(isinstance(token, list) and len(token) == size for token in embedding):
            raise ValueError("per-token vectors of different lengths")
        return [
            math.fsum(float(token[i]) for token in embedding) / len(embedding) for i in range(size)
        ]
    return [float(x) for x in embedding]


def pack(vector: Sequence[float]) -> bytes:
    """``vector`` normalised to length 1, as float32 bytes (a zero vector stays zero)."""
    norm = math.sqrt(math.fsum(x * x for x in vector)) or 1.0
    return array("f", (x / norm for x in vector)).tobytes()


def rank(
    query: Sequence[float], rows: Iterable[tuple[bytes, R]], limit: int
) -> list[tuple[float, R]]:
    """The ``limit`` rows whose packed vector is most similar to ``query`` (cosine, best first).

    Rows whose vector has another length than the query's (another model wrote them) are skipped.
    """
    wanted = array("f")
    wanted.frombytes(pack(query))
    size = len(wanted)
    scored: list[tuple[float, R]] = []
    for blob, row in rows:
        vector = array("f")
        vector.frombytes(blob)
        if len(vector) != size:
            continue
        scored.append((math.fsum(map(float.__mul__, wanted, vector)), row))
    scored.sort(key=lambda pair: -pair[0])
    return scored[:limit]
