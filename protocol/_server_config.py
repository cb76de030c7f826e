"""How an ``AgentServer`` listens and what it accepts: ``ServerConfig``.

Apart from the server (``_server.py``) so that the pipeline's stages (``_pipeline.py``), which the
server composes, read their limits without importing the server back.
"""

from __future__ import annotations

from dataclasses import dataclass

from stratagem.protocol._errors import ProtocolUsageError

__all__ = ["ServerConfig"]


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """How an ``AgentServer`` listens and what it accepts.

    Attributes:
        host: The address to bind.
        port: The port to bind; 0 picks a free one (``AgentServer.start`` returns it).
        max_message_bytes: The largest request (and response) accepted, in bytes.
        default_deadline_s: The handler's deadline when the client sent none.
        answer_cache_size: How many answers the default (in-memory) answer store keeps for
            duplicate ``request_id``s.
        answer_cache_bytes: The most bytes of answers the default answer store keeps.
        grace_s: How long ``aclose`` lets calls in flight finish.
        max_concurrent_requests: At most this many calls run at once (``Watch`` streams aside).
        max_queued_requests: At most this many more wait for a slot; beyond that a call is
            refused at once with ``RESOURCE_EXHAUSTED``.
        max_delegation_hops: The longest delegation chain accepted, this call's hop included.
        max_watch_streams: At most this many ``Watch`` streams are open at once; one more is
            refused at once with ``RESOURCE_EXHAUSTED``.
        refusal_audit_burst: Refusals before authentication recorded one by one per peer address
            and window; further ones are counted into one aggregate record per window
            (``protocol._refusals``).
        refusal_audit_window_s: That window, seconds.
        refusal_audit_total: Refusals before authentication recorded one by one per window from
            all addresses together (``None``: 4 x ``refusal_audit_burst``, 40 by default);
            further ones are counted into one agent-wide aggregate record (a flood from many
            addresses costs no more).
        call_streams: Also serve ``CallStreamService.CallStream`` (experimental): many ``Call``s
            multiplexed over one bidirectional stream, each through the same stages as a unary
            ``Call`` (``protocol._call_stream``), admitted as one (``RESOURCE_EXHAUSTED`` beyond
            the slots and the queue, audited). Off: the RPC is ``UNIMPLEMENTED``.
    """

    host: str = "127.0.0.1"
    port: int = 0
    max_message_bytes: int = 1 << 20
    default_deadline_s: float = 30.0
    answer_cache_size: int = 4096
    answer_cache_bytes: int = 64 << 20
    grace_s: float = 5.0
    max_concurrent_requests: int = 64
    max_queued_requests: int = 256
    max_delegation_hops: int = 8
    max_watch_streams: int = 1024
    refusal_audit_burst: int = 10
    refusal_audit_window_s: float = 10.0
    refusal_audit_total: int | None = None
    call_streams: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ProtocolUsageError(f"ServerConfig.port must be in 0..65535, not {self.port}")
        for name in ("max_message_bytes", "default_deadline_s", "answer_cache_bytes"):
            if getattr(self, name) <= 0:
                raise ProtocolUsageError(f"ServerConfig.{name} must be positive")
        if self.answer_cache_size < 0 or self.grace_s < 0 or self.max_queued_requests < 0:
            raise ProtocolUsageError(
                "ServerConfig.answer_cache_size, grace_s and max_queued_requests must be >= 0"
            )
        if (
            min(self.refusal_audit_burst, self.refusal_audit_total or 0) < 0
            or self.refusal_audit_window_s <= 0
        ):
            raise ProtocolUsageError(
                "ServerConfig.refusal_audit_burst and refusal_audit_total must be >= 0 and "
                "refusal_audit_window_s positive"
            )
        if min(self.max_concurrent_requests, self.max_delegation_hops, self.max_watch_streams) < 1:
            raise ProtocolUsageError(
                "ServerConfig.max_concurrent_requests, max_delegation_hops and max_watch_streams "
                "must be >= 1"
            )
