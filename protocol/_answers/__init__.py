"""Answers a server keeps by (caller, request_id): the ``AnswerStore`` protocol and its stores.

``_store`` (the protocol, retention, the in-memory store), ``_sqlite`` and ``_postgres`` (imported
on first use, through ``protocol``'s lazy exports: the ``postgres`` extra).
"""

from stratagem.protocol._answers._sqlite import SqliteAnswerStore
from stratagem.protocol._answers._store import (
    AnswerRetention,
    AnswerStore,
    InMemoryAnswerStore,
    StoredAnswer,
)

__all__ = [
    "AnswerRetention",
    "AnswerStore",
    "InMemoryAnswerStore",
    "SqliteAnswerStore",
    "StoredAnswer",
]
