"""The stages every ``AgentService`` RPC shares, and what is recorded when one ends.

``Pipeline`` authenticates, authorizes and admits a call (``admit``), bounds its size (``limit``),
records its acceptance (``accept``, fail closed), gives it a time budget (``budget``) and, when it
ends, settles its span, metrics and audit record (``settle``), counting refusals before
authentication per peer (``protocol._refusals``). What the pipeline has learned about one call
travels in its ``Exchange``. The server (``_server.py``) runs the stages in order for each RPC of
the table (``_service.py``); ``Call``'s own stages are in ``_calls.py``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from opentelemetry.trace import Span

from stratagem.protocol._admission import Admission, Budget
from stratagem.protocol._audit import (
    AsyncAuditLog,
    AuditLog,
    AuditRecord,
    HoldingAuditLog,
    digest,
)
from stratagem.protocol._capabilities import roles
from stratagem.protocol._codec import decode_request
from stratagem.protocol._errors import (
    Code,
    FailedPreconditionError,
    InvalidArgumentError,
    PermissionDeniedError,
    RemoteError,
    ResourceExhaustedError,
)
from stratagem.protocol._identity import Authenticator
from stratagem.protocol._metrics import RpcMetrics
from stratagem.protocol._models import IDENTITY_PATTERN, RequestEnvelope
from stratagem.protocol._policy import OPERATOR, Policy
from stratagem.protocol._refusals import RefusalLimiter, peer_address
from stratagem.protocol._rpc import (
    CALLER_KEY,
    CAPABILITY_KEY,
    DELEGATION_KEY,
    REQUEST_ID_KEY,
    TARGET_KEY,
    end_span,
    stratagem_attributes,
)

if TYPE_CHECKING:
    from stratagem.protocol._server_config import ServerConfig

__all__ = ["Exchange", "Pipeline", "Stage", "plan_step"]

logger = logging.getLogger(__name__)

_IDENTITY: Final = re.compile(IDENTITY_PATTERN)
# How much later than a client's deadline our own timer fires (see ``Budget``).
_BACKSTOP_S: Final = 0.25


@dataclass(slots=True)
class Exchange:
    """What the pipeline has learned about one RPC so far."""

    method: str
    metadata: dict[str, str]
    caller: str = ""
    target: str = ""
    capability: str = ""
    request_id: str = ""
    request_digest: str = ""
    delegation: tuple[str, ...] = ()
    slot: bool = False
    accepted: bool = False
    replayed: bool = False
    summary: str = ""
    envelope: RequestEnvelope | None = None  # decoded early when it, not metadata, routes the call
    # A group-committed log's records not awaited yet (see ``Pipeline.accept``, ``confirm``).
    acceptance: Awaitable[AuditRecord] | None = None
    outcome: Awaitable[AuditRecord] | None = None


Stage = Callable[[Exchange, bytes, Any, Span], Awaitable[bytes | None]]
"""One RPC's stages after the span is made: the answer's bytes (``None`` for a stream)."""


class Pipeline:
    """The stages shared by every RPC of one server.

    Args:
        role: The agent's role.
        config: The server's limits.
        policy: Who may call what.
        authenticator: How callers are verified.
        audit: Where every accepted, refused and finished call is recorded.
        metrics: The server's RPC metrics.
        refusal: Why the agent takes no work now (``""`` when it does), asked before each write
            RPC once it is authorized: a non-empty answer is ``FAILED_PRECONDITION``.
    """

    def __init__(
        self,
        *,
        role: str,
        config: ServerConfig,
        policy: Policy,
        authenticator: Authenticator,
        audit: AuditLog,
        metrics: RpcMetrics,
        refusal: Callable[[], str] | None = None,
    ) -> None:
        self.role = role
        self._refusal = refusal
        self.config = config
        self.authenticator = authenticator
        self._policy = policy
        self._append = _appender(audit)
        # A log that can hold a deferred acceptance back until the call's outcome commits.
        self._append_held = (
            audit.append_held if isinstance(audit, HoldingAuditLog) else self._append
        )
        self._metrics = metrics
        self.admission = Admission(config.max_concurrent_requests, config.max_queued_requests)
        self.refusals = RefusalLimiter(
            burst=config.refusal_audit_burst,
            window_s=config.refusal_audit_window_s,
            total=config.refusal_audit_total,
        )
        # Set when a deferred record failed to commit: acceptances are awaited again until one
        # commits, so a broken log serves no more calls.
        self._audit_failed = False

    # --- before the handler -----------------------------------------------------------------

    async def admit(
        self,
        exchange: Exchange,
        request: bytes,
        context: Any,
        span: Span,
        read: str | None,
        *,
        queue: bool = True,
        writes: bool = True,
    ) -> None:
        """Authenticate, authorize and take a slot (``queue``); a read RPC, RunPlan or Control is
        its own (pseudo-)capability and targets this agent. A call that ``writes`` is refused
        (``FAILED_PRECONDITION``) while the agent takes no work (see ``refusal``)."""
        exchange.request_digest = digest(request)
        exchange.target = exchange.metadata.get(TARGET_KEY, "") or (self.role if read else "")
        exchange.capability = read or exchange.metadata.get(CAPABILITY_KEY, "")
        exchange.request_id = exchange.metadata.get(REQUEST_ID_KEY, "")
        span.set_attributes(stratagem_attributes(capability=exchange.capability))
        exchange.caller = self.authenticator.authenticate(exchange.metadata, context)
        claimed = exchange.metadata.get(CALLER_KEY, "")
        if claimed and claimed != exchange.caller:
            raise PermissionDeniedError(
                f"the credentials are {exchange.caller!r}'s, but the call claims to come from "
                f"{claimed[:64]!r}"
            )
        if not (exchange.target and exchange.capability) and read is None:
            # The contract is complete in the .proto: without routing metadata the envelope
            # routes the call (read once the caller is authenticated, within the size limit).
            self.limit(len(request), "request")
            envelope = decode_request(request)
            exchange.envelope = envelope
            exchange.target = exchange.target or envelope.target
            exchange.capability = exchange.capability or envelope.capability
            exchange.request_id = exchange.request_id or envelope.request_id
            span.set_attributes(stratagem_attributes(capability=exchange.capability))
        if not (exchange.target and exchange.capability):
            raise InvalidArgumentError(f"a Call needs {TARGET_KEY} and {CAPABILITY_KEY} metadata")
        allowed = exchange.target == self.role and self._policy.allows(
            exchange.caller, exchange.target, exchange.capability
        )
        if not allowed:
            raise PermissionDeniedError(
                f"{exchange.caller!r} may not call {exchange.capability!r} on {exchange.target!r}"
            )
        exchange.delegation = self._delegation(exchange)
        if writes and self._refusal is not None:
            problem = self._refusal()
            if problem:
                raise FailedPreconditionError(problem)
        if queue:
            await self.admission.acquire(self.role)
            exchange.slot = True

    def _delegation(self, exchange: Exchange) -> tuple[str, ...]:
        """The call's delegation chain from its metadata: bounded, free of cycles, and naming
        only identities the deployment knows."""
        text = exchange.metadata.get(DELEGATION_KEY, "")
        chain = tuple(text.split(",")) if text else ()
        if DELEGATION_KEY not in exchange.metadata and exchange.envelope is not None:
            chain = tuple(exchange.envelope.delegation)
        limit = self.config.max_delegation_hops
        if len(chain) + 1 > limit:
            raise PermissionDeniedError(
                f"the delegation chain is {len(chain) + 1} hops long; the limit is {limit}"
            )
        for identity in chain:
            if not _IDENTITY.fullmatch(identity):
                raise InvalidArgumentError(f"malformed identity in {DELEGATION_KEY}")
        if chain:
            known = {OPERATOR, *roles(), *self._policy.callers}
            strangers = [identity for identity in chain if identity not in known]
            if strangers:
                raise PermissionDeniedError(
                    f"the delegation chain names {strangers[0]!r}, an identity this deployment "
                    "does not know (its agents, the operator and the policy's callers)"
                )
        path = (*chain, exchange.caller, exchange.target)
        if len(set(path)) < len(path):
            raise PermissionDeniedError(f"delegation cycle: {' > '.join(path)}")
        return chain

    def release(self, exchange: Exchange) -> None:
        """Give back the call's slot, if it holds one."""
        if exchange.slot:
            exchange.slot = False
            self.admission.release()

    def limit(self, size: int, what: str) -> None:
        """Refuse a request or response past the message limit (``RESOURCE_EXHAUSTED``)."""
        if size > self.config.max_message_bytes:
            raise ResourceExhaustedError(
                f"the {what} is {size} bytes; the limit is {self.config.max_message_bytes}"
            )

    async def accept(self, exchange: Exchange, detail: str = "", *, defer: bool = False) -> None:
        """Record ``call.accepted`` (naming the delegation chain); a call the audit log cannot
        record is not served.

        With ``defer``, a log that commits records in groups on the event loop (``SqliteAuditLog``)
        is not waited for here: the record is held back (``append_held``) until the call's outcome
        is appended, however long the handler awaits (up to the log's hold time), and the two
        commit in one transaction, which ``confirm`` awaits before the answer leaves (one commit
        per call instead of two). A log that stores a record on the spot is awaited here as
        without ``defer``, and so is every log once a deferred record failed.
        """
        if exchange.delegation:
            via = f"on behalf of {' > '.join(exchange.delegation)}"
            detail = f"{detail} {via}" if detail else via
        deferred = defer and not self._audit_failed
        pending = self._record(
            exchange, "call.accepted", "", detail, exchange.request_digest, hold=deferred
        )
        if deferred and isinstance(pending, asyncio.Future) and not pending.done():
            exchange.acceptance = pending
        else:
            # Fail closed: a call the audit log cannot record is not served.
            await pending
            self._audit_failed = False
        exchange.accepted = True

    def append_outcome(self, exchange: Exchange, answer: bytes) -> None:
        """Hand the ``call.outcome`` record of a served call to the log, not waiting for it
        (``confirm`` does): appended in the loop turn of a deferred acceptance, both commit in
        one transaction. Without a deferred acceptance, ``settle`` records the outcome as ever."""
        if exchange.acceptance is None:
            return
        exchange.outcome = self._record(
            exchange,
            "call.outcome",
            Code.OK.value,
            exchange.summary or f"{len(answer)} bytes answered",
            digest(answer),
        )

    async def confirm(self, exchange: Exchange) -> None:
        """Wait until the call's deferred records are committed, before its answer leaves.

        Raises:
            Exception: What kept a record from being stored; the call is then answered with an
                error (``INTERNAL``) and no further call is served before its acceptance commits.
        """
        acceptance, exchange.acceptance = exchange.acceptance, None
        outcome = exchange.outcome
        try:
            if acceptance is not None:
                try:
                    await acceptance
                except Exception:
                    exchange.accepted = False  # audited as refused, as a failed acceptance is
                    raise
            if outcome is not None:
                await outcome
        except Exception:
            exchange.outcome = None  # settle records the error instead
            if isinstance(outcome, asyncio.Future):
                # Its batch failed with the acceptance's: the error is the one raised here.
                outcome.add_done_callback(_retrieved)
            self._audit_failed = True
            raise

    def budget(self, context: Any) -> Budget:
        """The call's time: what the client's deadline leaves, or the server's default."""
        remaining = context.time_remaining()
        if remaining is None:
            return Budget(self.config.default_deadline_s, backstop=0.0)
        return Budget(float(remaining), backstop=_BACKSTOP_S)

    # --- outcome ----------------------------------------------------------------------------

    async def settle(
        self,
        exchange: Exchange,
        span: Span,
        error: RemoteError | None,
        answer: bytes | None,
        began: float = 0.0,
        context: Any = None,
    ) -> None:
        """Record the outcome on the span, in the metrics and in the audit log (a failed write is
        only logged); refusals before authentication only within the peer's budget, the rest are
        counted (``protocol._refusals``)."""
        code = Code.OK if error is None else error.code
        end_span(span, code, error.message if error else "", server=True)
        self._metrics.finished(
            exchange.method,
            exchange.capability if exchange.accepted else "",
            code,
            time.perf_counter() - began,
            started_as="",
        )
        if error is None and exchange.outcome is not None:
            return  # recorded and confirmed before the answer (``append_outcome``)
        if exchange.replayed:
            action = "call.replayed"
        elif exchange.accepted:
            action = "call.outcome"
        elif code is Code.PERMISSION_DENIED:
            action = "call.denied"
        else:
            action = "call.refused"
        if error is not None:
            detail = str(error)
            if not exchange.caller and not exchange.accepted:
                peer = peer_address(str(context.peer())) if context is not None else "unknown"
                if not self.refusals.admit(peer, code.value):
                    return
                detail = f"{detail} (peer {peer})"
            logger.info(
                "%s %s %s from %r: %s", action, exchange.method, code, exchange.caller, error
            )
        else:
            detail = exchange.summary or f"{len(answer or b'')} bytes answered"
        response_digest = digest(answer) if answer is not None else ""
        try:
            await self.record(
                exchange, action, code.value, detail, response_digest or exchange.request_digest
            )
        except Exception:
            logger.exception("cannot audit %s of request %r", action, exchange.request_id)
        if exchange.acceptance is not None:  # deferred, and the call failed before ``confirm``
            acceptance, exchange.acceptance = exchange.acceptance, None
            try:
                await acceptance
            except Exception:
                self._audit_failed = True
                logger.exception("cannot audit the acceptance of request %r", exchange.request_id)

    async def record(
        self, exchange: Exchange, action: str, code: str, detail: str, payload_digest: str
    ) -> None:
        """Append one audit record about the call."""
        # A record handed to the log is written even when this call is cancelled meanwhile.
        await self._record(exchange, action, code, detail, payload_digest)

    def _record(
        self,
        exchange: Exchange,
        action: str,
        code: str,
        detail: str,
        payload_digest: str,
        *,
        hold: bool = False,
    ) -> Awaitable[AuditRecord]:
        return (self._append_held if hold else self._append)(
            actor=exchange.caller,
            action=action,
            target=exchange.target or self.role,
            capability=exchange.capability,
            request_id=exchange.request_id,
            code=code,
            detail=detail,
            digest=payload_digest,
        )

    async def flush_refusals_every_window(self) -> None:
        """``flush_refusals`` at the end of every refusal window, until cancelled."""
        while True:
            await asyncio.sleep(self.refusals.window_s)
            await self.flush_refusals()

    async def flush_refusals(self, *, everything: bool = False) -> None:
        """One aggregate audit record per peer whose window ended with refusals only counted."""
        for summary in self.refusals.drain(everything=everything):
            logger.warning("agent %s: %s", self.role, summary.detail)
            try:
                await self._append(
                    actor="",
                    action="call.refused.aggregate",
                    target=self.role,
                    capability="",
                    request_id="",
                    code=summary.code,
                    detail=summary.detail,
                    digest="",
                )
            except Exception:
                logger.exception("cannot audit %s", summary.detail)


def _appender(audit: AuditLog) -> Callable[..., Awaitable[AuditRecord]]:
    """How the server appends to ``audit`` from its event loop.

    A log with ``append_async`` (both stock logs) is awaited directly: the in-memory one appends on
    the spot, the SQLite one through its group-committing writer thread. Any other log's blocking
    ``append`` runs in a worker thread, shielded so a cancelled call still leaves its record.
    """
    if isinstance(audit, AsyncAuditLog):
        return audit.append_async

    async def in_thread(**fields: str) -> AuditRecord:
        return await asyncio.shield(asyncio.to_thread(audit.append, **fields))

    return in_thread


def _retrieved(future: asyncio.Future[Any]) -> None:
    """Mark a future's exception as seen (asyncio logs one nobody retrieved)."""
    if not future.cancelled():
        future.exception()


def plan_step(plan_id: str, step_id: str) -> str:
    """The accepted record's detail: which plan (and step) the call serves, if any."""
    if not plan_id:
        return ""
    return f"plan {plan_id} step {step_id}" if step_id else f"plan {plan_id}"
