"""The gRPC server of one agent and its request pipeline.

Every ``AgentService`` method takes the raw request bytes, so that each refusal is the pipeline's
own, answered with one status code and audited. ``Call`` runs these stages in order:

1. authenticate: the ``Authenticator`` verifies the caller's credentials (a signed token, or the
   TLS peer certificate) and yields its identity (``UNAUTHENTICATED``); a caller named in the
   metadata other than that identity is ``PERMISSION_DENIED``, audited under the verified one;
2. authorize: the target is this agent and the policy allows the capability; the delegation chain
   (``x-stratagem-delegation``: who asked on whose behalf) is no longer than
   ``max_delegation_hops`` and names nobody twice, caller and target included
   (``PERMISSION_DENIED``); a capability this agent does not serve is ``NOT_FOUND``, told only to
   a caller the policy allowed, so a denied caller never learns the capability list; a caller
   speaking another schema version of it (``x-stratagem-capability-version``) is
   ``FAILED_PRECONDITION``;
3. admission: at most ``max_concurrent_requests`` run at once and ``max_queued_requests`` wait
   for a slot; beyond that the call is refused at once (``RESOURCE_EXHAUSTED``), so latency never
   grows without bound. ``Watch`` streams are counted apart: at most ``max_watch_streams`` open
   at once, one more is ``RESOURCE_EXHAUSTED``;
4. the size limit on the raw request (``RESOURCE_EXHAUSTED``);
5. decode and validate; the envelope must agree with the metadata, delegation chain included
   (``INVALID_ARGUMENT`` with field violations; ``FAILED_PRECONDITION`` for an extension
   capability of another version);
6. a ``request_id`` seen before from the same caller gets the stored answer (a different payload
   under the same id is ``FAILED_PRECONDITION``); a duplicate of a call still running waits for it;
7. audit ``call.accepted`` (naming the delegation chain): if the audit log cannot record it, the
   call is not served (fail closed);
8. the handler, under the remaining deadline (``DEADLINE_EXCEEDED``), with ``current_call`` set;
9. audit the outcome (``call.outcome``) with the response's digest, then answer.

An ``x-stratagem-request-id`` metadata value, when sent, names a call refused before its body is
decoded in the audit log; the envelope must then carry the same id.

The routing metadata (target, capability, delegation; Control's ``Control.<action>``) is an
optional fast path: a client generated from ``proto/`` alone sends only its credentials, and the
server then decodes the body once the caller is authenticated and within the size limit, and
routes and authorizes from it exactly as from the metadata. The .proto declares every header.

``Describe``, ``Watch``, ``Plans``, ``Revisions``, ``RunPlan`` and ``Replay`` go through stages 1-5
too, authorized as the pseudo-capabilities of the same names; their target defaults to this agent.
``Control`` (approve, reject, pause, cancel, resume or replan a plan) is authorized as
``Control.<action>``, named in the
capability metadata so authorization still precedes decoding; its audit records carry the action,
the gate, the approver (the verified caller) and the rationale (redacted) in their detail.

Answers to ``Call`` are kept in an ``AnswerStore`` (in memory by default; ``SqliteAnswerStore``
keeps them across restarts of the server), stored before the call is answered. Refusals are
audited as ``call.denied`` (``PERMISSION_DENIED``) or ``call.refused``; a stored answer as
``call.replayed``.

Errors become statuses in one place (``protocol._status``): a ``RemoteError`` keeps its code,
message and violations; anything else is logged here and answered ``INTERNAL: internal error``.
The transport's own size limit is set well above ours, so our check (audited) answers first.

A call that no credentials, no policy rule or no free slot admits is refused before any of its
body is read; every decision, allow or deny, leaves an audit record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import Span, SpanKind, TracerProvider

from stratagem.protocol._admission import (
    _Admission,
    _Budget,
    _deadline_passed,
    _interruption,
    _within,
)
from stratagem.protocol._answers import AnswerRetention, AnswerStore, InMemoryAnswerStore
from stratagem.protocol._audit import AsyncAuditLog, AuditLog, AuditRecord, digest
from stratagem.protocol._capabilities import CapabilitySpec, WireModel, capability_for
from stratagem.protocol._codec import (
    DEFAULT_PLANS_PAGE,
    IDENTITY_PATTERN,
    AgentCard,
    ControlRequest,
    PlanEvent,
    PlanSnapshot,
    ReadRpc,
    ReplayResult,
    RequestEnvelope,
    RevisionsResponse,
    control_capability,
    decode_control,
    decode_plans_query,
    decode_query,
    decode_request,
    decode_run_plan,
    encode_answer,
    encode_card,
    encode_event,
    encode_plans,
    encode_replay,
    encode_revisions,
    encode_snapshot,
)
from stratagem.protocol._context import CallContext, current_call
from stratagem.protocol._errors import (
    Code,
    FailedPreconditionError,
    FieldViolation,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ProtocolUsageError,
    RemoteError,
    ResourceExhaustedError,
    UnavailableError,
    error_for_code,
)
from stratagem.protocol._identity import Authenticator
from stratagem.protocol._metrics import RpcMetrics
from stratagem.protocol._policy import Policy
from stratagem.protocol._refusals import RefusalLimiter, peer_address
from stratagem.protocol._rpc import (
    CALLER_KEY,
    CAPABILITY_KEY,
    DELEGATION_KEY,
    REQUEST_ID_KEY,
    SERVER_KEEPALIVE_OPTIONS,
    SERVICE,
    TARGET_KEY,
    VERSION_KEY,
    end_span,
    metadata_getter,
    span_attributes,
    span_name,
    stratagem_attributes,
    text_metadata,
)
from stratagem.protocol._status import as_remote_error, grpc_status

__all__ = ["AgentBackend", "AgentServer", "ServerConfig"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

# What a Plans page leaves free of its message limit, and what a snapshot costs beside its JSON.
_PAGE_HEADROOM: Final = 4096
_SNAPSHOT_OVERHEAD: Final = 256

_IDENTITY: Final = re.compile(IDENTITY_PATTERN)
# Control is authorized as "Control.<action>" (see ``_serve_control``).
_CONTROL_PREFIX: Final = "Control."
# How much later than a client's deadline our own timer fires (see ``_Budget``).
_BACKSTOP_S: Final = 0.25
# How far above ``max_message_bytes`` the transport's own limits sit, so our check answers first.
_TRANSPORT_HEADROOM: Final = 4


class AgentBackend(Protocol):
    """What an ``AgentServer`` serves; ``agents.Agent`` satisfies it structurally."""

    @property
    def role(self) -> str:
        """The agent's role: requests must target it."""
        ...

    def card(self) -> AgentCard:
        """The agent's card, the answer to ``Describe``."""
        ...

    async def handle(self, capability: str, request: WireModel, ctx: CallContext) -> WireModel:
        """Serve one capability request; raise a ``RemoteError`` to answer with its status."""
        ...

    def watch(self, plan_id: str) -> AsyncIterator[PlanEvent]:
        """Events of the plan and its sub-plans: stored ones first, then live ones."""
        ...

    async def run_plan(self, plan_json: str, ctx: CallContext) -> PlanSnapshot:
        """Validate a user's plan against this agent's registry, run it, return its final state."""
        ...

    def plans(self, plan_id: str) -> list[PlanSnapshot]:
        """Snapshots of the plan and its sub-plans, or of every plan for ""; must not block."""
        ...

    async def control(self, request: ControlRequest, ctx: CallContext) -> PlanSnapshot:
        """Approve, reject, pause, cancel, resume or replan a plan; ``ctx.caller`` is the actor."""
        ...

    async def revisions(self, plan_id: str) -> RevisionsResponse:
        """The plan's revision history, oldest first (``NotFoundError`` for an unknown plan)."""
        ...

    async def replay(self, plan_id: str, ctx: CallContext) -> ReplayResult:
        """Re-run a finished plan from its records, with no side effects, and compare decisions."""
        ...


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
        if self.refusal_audit_burst < 0 or self.refusal_audit_window_s <= 0:
            raise ProtocolUsageError(
                "ServerConfig.refusal_audit_burst must be >= 0 and refusal_audit_window_s positive"
            )
        if min(self.max_concurrent_requests, self.max_delegation_hops, self.max_watch_streams) < 1:
            raise ProtocolUsageError(
                "ServerConfig.max_concurrent_requests, max_delegation_hops and max_watch_streams "
                "must be >= 1"
            )


@dataclass(slots=True)
class _Exchange:
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


_Stage = Callable[[_Exchange, bytes, Any, Span], Awaitable[bytes | None]]


class AgentServer:
    """A ``grpc.aio`` server for one agent: ``AgentService`` plus the standard health service.

    Args:
        backend: The agent served.
        policy: Who may call what.
        authenticator: How callers are verified (``TokenAuthenticator``, ``TlsAuthenticator``, or
            ``CallerMetadataAuthenticator`` for none).
        audit: Where every accepted, refused and finished call is recorded.
        config: Where to listen and what to accept.
        tracer_provider: The OpenTelemetry tracer provider; the global one when ``None``.
        meter_provider: Where request duration and in-flight metrics go (``RpcMetrics``); the
            global one when ``None``. Calls are labelled with their capability once authorized.
        answers: Where answers to ``Call`` are kept by (caller, request_id); an
            ``InMemoryAnswerStore`` bounded by the config's ``answer_cache_*`` by default. A
            ``SqliteAnswerStore`` keeps them across restarts of this server (the server does not
            close a store it was given).

    Use ``await server.start()`` and ``await server.aclose()``, or ``async with``.
    """

    def __init__(
        self,
        backend: AgentBackend,
        *,
        policy: Policy,
        authenticator: Authenticator,
        audit: AuditLog,
        config: ServerConfig | None = None,
        tracer_provider: TracerProvider | None = None,
        answers: AnswerStore | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        self._backend = backend
        self._role = backend.role
        self._policy = policy
        self._authenticator = authenticator
        self._audit = audit
        self._append = _appender(audit)
        self._config = config or ServerConfig()
        self._watch_streams = 0
        self._tracer = trace.get_tracer(__name__, tracer_provider=tracer_provider)
        self._metrics = RpcMetrics(meter_provider, side="server")
        self._answers: AnswerStore = answers or InMemoryAnswerStore(
            AnswerRetention(
                max_entries=self._config.answer_cache_size,
                max_bytes=self._config.answer_cache_bytes,
            )
        )
        self._running: dict[tuple[str, str], tuple[str, asyncio.Future[bytes | RemoteError]]] = {}
        self._admission = _Admission(
            self._config.max_concurrent_requests, self._config.max_queued_requests
        )
        self._refusals = RefusalLimiter(
            burst=self._config.refusal_audit_burst, window_s=self._config.refusal_audit_window_s
        )
        self._refusal_flusher: asyncio.Task[None] | None = None
        self._server: Any = None
        self._health: Any = None
        self._port = 0

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> int:
        """Bind, start serving and report ``SERVING`` on the health service.

        Returns:
            The bound port.

        Raises:
            ProtocolUsageError: When already started, or the address cannot be bound.
        """
        if self._server is not None:
            raise ProtocolUsageError("the server is already started")
        limit = _TRANSPORT_HEADROOM * self._config.max_message_bytes
        admissible = self._config.max_concurrent_requests + self._config.max_queued_requests
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
                # grpc's core cancels calls beyond these (1000 by default) before we see them:
                # kept above our admission limits, so our audited check answers first.
                ("grpc.server.max_pending_requests", 2 * admissible),
                ("grpc.server.max_pending_requests_hard_limit", 4 * admissible),
                *SERVER_KEEPALIVE_OPTIONS,
            ],
        )
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    SERVICE,
                    {
                        "Call": grpc.unary_unary_rpc_method_handler(self._call),
                        "Describe": grpc.unary_unary_rpc_method_handler(self._describe),
                        "Plans": grpc.unary_unary_rpc_method_handler(self._plans),
                        "Watch": grpc.unary_stream_rpc_method_handler(self._watch),
                        "RunPlan": grpc.unary_unary_rpc_method_handler(self._run_plan),
                        "Control": grpc.unary_unary_rpc_method_handler(self._control),
                        "Replay": grpc.unary_unary_rpc_method_handler(self._replay_plan),
                        "Revisions": grpc.unary_unary_rpc_method_handler(self._revisions),
                    },
                ),
            )
        )
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        # Server reflection: tools (grpcurl, Postman, grpcui) list and describe the services from
        # the agent itself. It tells what the public .proto tells, nothing more, so it needs no
        # credentials; every AgentService call still does.
        reflection.enable_server_reflection(
            (SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        address = f"{self._config.host}:{self._config.port}"
        credentials = self._authenticator.server_credentials()
        try:
            if credentials is None:
                port = server.add_insecure_port(address)
            else:
                port = server.add_secure_port(address, credentials)
        except RuntimeError as exc:
            raise ProtocolUsageError(f"cannot listen on {address}: {exc}") from exc
        await server.start()
        for service in ("", SERVICE):
            await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
        self._server, self._health, self._port = server, health_servicer, int(port)
        self._refusal_flusher = asyncio.create_task(
            self._flush_refusals_every_window(), name=f"stratagem-refusals-{self._role}"
        )
        logger.info(
            "agent %s serving on %s (authentication: %s)",
            self._role,
            self.endpoint,
            self._authenticator.mode,
        )
        return self._port

    async def set_serving(self, serving: bool) -> None:
        """Report ``SERVING`` or ``NOT_SERVING`` on the health service, for a problem the host
        found outside the server (its store is gone); calls are still answered."""
        if self._server is None:
            return
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in ("", SERVICE):
            await self._health.set(service, status)

    @property
    def port(self) -> int:
        """The bound port (0 before ``start``)."""
        return self._port

    @property
    def load(self) -> tuple[int, int]:
        """Calls running and calls queued for a slot, now."""
        return self._admission.running, self._admission.queued

    @property
    def endpoint(self) -> str:
        """``host:port`` to dial, e.g. ``127.0.0.1:50051``.

        Raises:
            ProtocolUsageError: Before ``start``.
        """
        if self._server is None:
            raise ProtocolUsageError("the server is not started")
        host = self._config.host
        return f"[{host}]:{self._port}" if ":" in host else f"{host}:{self._port}"

    async def aclose(self) -> None:
        """Report ``NOT_SERVING``, let calls in flight finish for ``grace_s``, then stop."""
        if self._server is None:
            return
        server, self._server = self._server, None
        await self._health.enter_graceful_shutdown()
        await server.stop(self._config.grace_s)
        if self._refusal_flusher is not None:
            self._refusal_flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refusal_flusher
            self._refusal_flusher = None
        await self._flush_refusals(everything=True)
        logger.info("agent %s stopped serving on port %s", self._role, self._port)

    async def __aenter__(self) -> AgentServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # --- the four methods -------------------------------------------------------------------

    async def _call(self, request: bytes, context: Any) -> bytes | None:
        return await self._serve("Call", request, context, self._serve_call)

    async def _describe(self, request: bytes, context: Any) -> bytes | None:
        return await self._serve("Describe", request, context, self._serve_describe)

    async def _plans(self, request: bytes, context: Any) -> bytes | None:
        return await self._serve("Plans", request, context, self._serve_plans)

    async def _run_plan(self, request: bytes, context: Any) -> bytes | None:
        return await self._serve("RunPlan", request, context, self._serve_run_plan)

    async def _control(self, request: bytes, context: Any) -> bytes | None:
        return await self._serve("Control", request, context, self._serve_control)

    async def _replay_plan(self, request: bytes, context: Any) -> bytes | None:
        return await self._serve("Replay", request, context, self._serve_replay)

    async def _revisions(self, request: bytes, context: Any) -> bytes | None:
        return await self._serve("Revisions", request, context, self._serve_revisions)

    async def _watch(self, request: bytes, context: Any) -> None:
        await self._serve("Watch", request, context, self._serve_watch)

    async def _serve(
        self, method: str, request: bytes, context: Any, stage: _Stage
    ) -> bytes | None:
        """Run one RPC's stages inside its server span; settle, audit and answer its outcome."""
        metadata = tuple(context.invocation_metadata() or ())
        exchange = _Exchange(method=method, metadata=text_metadata(metadata))
        began = time.perf_counter()
        self._metrics.started(method)
        # start_span and attach/detach rather than start_as_current_span: the same current span,
        # without two generator context managers per call.
        span = self._tracer.start_span(
            span_name(method),
            context=propagate.extract(metadata, getter=metadata_getter),
            kind=SpanKind.SERVER,
            attributes=span_attributes(method),
            record_exception=False,
            set_status_on_exception=False,
        )
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            try:
                answer = await stage(exchange, request, context, span)
            except asyncio.CancelledError:
                self._release(exchange)
                await self._settle(exchange, span, _interruption(context), None, began, context)
                raise
            except Exception as exc:
                error = as_remote_error(exc)
                if error is not exc:
                    logger.error(
                        "unexpected error serving %s %s from %r (request %r)",
                        method,
                        exchange.capability,
                        exchange.caller,
                        exchange.request_id,
                        exc_info=exc,
                    )
            else:
                self._release(exchange)
                await self._settle(exchange, span, None, answer, began)
                return answer
            self._release(exchange)
            await self._settle(exchange, span, error, None, began, context)
            if _deadline_passed(context):
                # The transport has ended the call with DEADLINE_EXCEEDED: nobody is left to answer.
                raise asyncio.CancelledError
            await context.abort_with_status(grpc_status(error))
            raise AssertionError("grpc's abort returned instead of raising")
        finally:
            otel_context.detach(token)
            span.end()

    # --- stages -----------------------------------------------------------------------------

    async def _admit(
        self,
        exchange: _Exchange,
        request: bytes,
        context: Any,
        span: Span,
        read: str | None,
        *,
        queue: bool = True,
    ) -> None:
        """Authenticate, authorize and take a slot (``queue``); a read RPC, RunPlan or Control is
        its own (pseudo-)capability and targets this agent."""
        exchange.request_digest = digest(request)
        exchange.target = exchange.metadata.get(TARGET_KEY, "") or (self._role if read else "")
        exchange.capability = read or exchange.metadata.get(CAPABILITY_KEY, "")
        exchange.request_id = exchange.metadata.get(REQUEST_ID_KEY, "")
        span.set_attributes(stratagem_attributes(capability=exchange.capability))
        exchange.caller = self._authenticator.authenticate(exchange.metadata, context)
        claimed = exchange.metadata.get(CALLER_KEY, "")
        if claimed and claimed != exchange.caller:
            raise PermissionDeniedError(
                f"the credentials are {exchange.caller!r}'s, but the call claims to come from "
                f"{claimed[:64]!r}"
            )
        if not (exchange.target and exchange.capability) and read is None:
            # The contract is complete in the .proto: without routing metadata the envelope
            # routes the call (read once the caller is authenticated, within the size limit).
            self._limit(len(request), "request")
            envelope = decode_request(request)
            exchange.envelope = envelope
            exchange.target = exchange.target or envelope.target
            exchange.capability = exchange.capability or envelope.capability
            exchange.request_id = exchange.request_id or envelope.request_id
            span.set_attributes(stratagem_attributes(capability=exchange.capability))
        if not (exchange.target and exchange.capability):
            raise InvalidArgumentError(f"a Call needs {TARGET_KEY} and {CAPABILITY_KEY} metadata")
        allowed = exchange.target == self._role and self._policy.allows(
            exchange.caller, exchange.target, exchange.capability
        )
        if not allowed:
            raise PermissionDeniedError(
                f"{exchange.caller!r} may not call {exchange.capability!r} on {exchange.target!r}"
            )
        exchange.delegation = self._delegation(exchange)
        if queue:
            await self._admission.acquire(self._role)
            exchange.slot = True

    def _delegation(self, exchange: _Exchange) -> tuple[str, ...]:
        """The call's delegation chain from its metadata: bounded and free of cycles."""
        text = exchange.metadata.get(DELEGATION_KEY, "")
        chain = tuple(text.split(",")) if text else ()
        if DELEGATION_KEY not in exchange.metadata and exchange.envelope is not None:
            chain = tuple(exchange.envelope.delegation)
        limit = self._config.max_delegation_hops
        if len(chain) + 1 > limit:
            raise PermissionDeniedError(
                f"the delegation chain is {len(chain) + 1} hops long; the limit is {limit}"
            )
        for identity in chain:
            if not _IDENTITY.fullmatch(identity):
                raise InvalidArgumentError(f"malformed identity in {DELEGATION_KEY}")
        path = (*chain, exchange.caller, exchange.target)
        if len(set(path)) < len(path):
            raise PermissionDeniedError(f"delegation cycle: {' > '.join(path)}")
        return chain

    def _release(self, exchange: _Exchange) -> None:
        if exchange.slot:
            exchange.slot = False
            self._admission.release()

    def _limit(self, size: int, what: str) -> None:
        if size > self._config.max_message_bytes:
            raise ResourceExhaustedError(
                f"the {what} is {size} bytes; the limit is {self._config.max_message_bytes}"
            )

    async def _accept(self, exchange: _Exchange, detail: str = "") -> None:
        if exchange.delegation:
            via = f"on behalf of {' > '.join(exchange.delegation)}"
            detail = f"{detail} {via}" if detail else via
        # Fail closed: a call the audit log cannot record is not served.
        await self._record(exchange, "call.accepted", "", detail, exchange.request_digest)
        exchange.accepted = True

    async def _serve_call(
        self, exchange: _Exchange, request: bytes, context: Any, span: Span
    ) -> bytes:
        await self._admit(exchange, request, context, span, read=None)
        spec = capability_for(self._role, exchange.capability)
        if spec is None:
            raise NotFoundError(f"{self._role} does not serve {exchange.capability!r}")
        spoken = exchange.metadata.get(VERSION_KEY, spec.version)
        if spoken != spec.version:
            raise FailedPreconditionError(
                f"{spec.name}: the caller speaks schema version {spoken[:32]!r}, "
                f"{self._role} speaks {spec.version!r}; update one side"
            )
        self._limit(len(request), "request")
        envelope = exchange.envelope or decode_request(request)
        span.set_attributes(
            stratagem_attributes(
                request_id=envelope.request_id, plan_id=envelope.plan_id, step_id=envelope.step_id
            )
        )
        _check_routing(envelope, exchange)
        exchange.request_id = envelope.request_id
        key = (exchange.caller, envelope.request_id)
        budget = self._budget(context)
        running = self._running.get(key)
        if running is None:
            kept = await self._answers.get(*key)
            if kept is not None:
                return await self._replay(exchange, (kept.request_digest, kept.answer), budget)
            # A duplicate may have started while the store was read.
            running = self._running.get(key)
        if running is not None:
            return await self._replay(exchange, running, budget)
        # Registered before the next await, so a duplicate arriving meanwhile waits for this one.
        outcome: asyncio.Future[bytes | RemoteError] = asyncio.get_running_loop().create_future()
        self._running[key] = (exchange.request_digest, outcome)
        try:
            await self._accept(exchange, _plan_step(envelope.plan_id, envelope.step_id))
            answer = await self._run(spec, envelope, budget)
            # Stored before the call leaves ``_running`` and before it is answered, so a repeat
            # (even after this server restarts, with a durable store) never runs the handler again.
            await asyncio.shield(self._keep(key, exchange.request_digest, answer))
        except Exception as exc:
            outcome.set_result(as_remote_error(exc))
            raise
        except BaseException:
            outcome.set_result(UnavailableError("an earlier attempt was interrupted; retry"))
            raise
        finally:
            del self._running[key]
        outcome.set_result(answer)
        return answer

    async def _keep(self, key: tuple[str, str], request_digest: str, answer: bytes) -> None:
        """Store an answer; a store that fails is logged (the handler's effect already happened)."""
        try:
            await self._answers.put(key[0], key[1], request_digest, answer)
        except Exception:
            logger.exception("cannot store the answer to request %r from %r", key[1], key[0])

    async def _replay(
        self,
        exchange: _Exchange,
        stored: tuple[str, bytes | asyncio.Future[bytes | RemoteError]],
        budget: _Budget,
    ) -> bytes:
        """Answer a duplicate ``request_id`` with the first attempt's outcome."""
        request_digest, answer = stored
        if request_digest != exchange.request_digest:
            raise FailedPreconditionError(
                f"request_id {exchange.request_id!r} was already used for a different request"
            )
        exchange.replayed = True
        if isinstance(answer, bytes):
            return answer
        result = await _within(budget, asyncio.shield(answer), "the first attempt")
        if isinstance(result, RemoteError):
            raise error_for_code(result.code, result.message, result.violations)
        return result

    async def _run(self, spec: CapabilitySpec, envelope: RequestEnvelope, budget: _Budget) -> bytes:
        """Run the handler under the remaining deadline with ``current_call`` set."""
        call = CallContext(
            caller=envelope.caller,
            target=self._role,
            capability=spec.name,
            request_id=envelope.request_id,
            plan_id=envelope.plan_id,
            step_id=envelope.step_id,
            deadline=time.monotonic() + budget.seconds,
            delegation=tuple(envelope.delegation),
        )
        token = current_call.set(call)
        try:
            response = await _within(
                budget, self._backend.handle(spec.name, envelope.body, call), spec.name
            )
        finally:
            current_call.reset(token)
        # The backend built ``response`` (a validated model) and every envelope field comes from the
        # validated request: encoded as is, without validating an envelope around it again.
        answer = encode_answer(spec, envelope.request_id, self._role, response)
        self._limit(len(answer), "response")
        return answer

    async def _admit_read(
        self, exchange: _Exchange, request: bytes, context: Any, span: Span, rpc: ReadRpc
    ) -> str:
        """Stages 1-5 and ``call.accepted`` for a read RPC; returns the plan id it asks about."""
        await self._admit(exchange, request, context, span, read=rpc, queue=rpc != "Watch")
        self._limit(len(request), "request")
        plan_id = decode_query(rpc, request)
        span.set_attributes(stratagem_attributes(plan_id=plan_id))
        await self._accept(exchange, _plan_step(plan_id, ""))
        return plan_id

    async def _serve_describe(
        self, exchange: _Exchange, request: bytes, context: Any, span: Span
    ) -> bytes:
        await self._admit_read(exchange, request, context, span, "Describe")
        answer = encode_card(self._backend.card())
        self._limit(len(answer), "response")
        return answer

    async def _serve_plans(
        self, exchange: _Exchange, request: bytes, context: Any, span: Span
    ) -> bytes:
        plan_id = await self._admit_read(exchange, request, context, span, "Plans")
        query = decode_plans_query(request)
        snapshots = self._backend.plans(plan_id)
        start = int(query.page_token or 0)
        size = query.page_size or DEFAULT_PLANS_PAGE
        # A page ends at page_size snapshots or before its bytes would pass the message limit
        # (a plan's JSON dominates its size); one snapshot too large alone is refused below.
        budget = self._config.max_message_bytes - _PAGE_HEADROOM
        page: list[PlanSnapshot] = []
        used = 0
        for snapshot in snapshots[start : start + size]:
            cost = len(snapshot.plan_json.encode()) + _SNAPSHOT_OVERHEAD
            if page and used + cost > budget:
                break
            page.append(snapshot)
            used += cost
        end = start + len(page)
        token = str(end) if end < len(snapshots) else ""
        exchange.summary = f"{len(page)} of {len(snapshots)} plans from {start}"
        answer = encode_plans(page, token)
        self._limit(len(answer), "response")
        return answer

    async def _serve_revisions(
        self, exchange: _Exchange, request: bytes, context: Any, span: Span
    ) -> bytes:
        plan_id = await self._admit_read(exchange, request, context, span, "Revisions")
        response = await _within(
            self._budget(context), self._backend.revisions(plan_id), f"revisions of {plan_id}"
        )
        exchange.summary = f"plan {plan_id}: {len(response.revisions)} revisions"
        answer = encode_revisions(response)
        self._limit(len(answer), "response")
        return answer

    async def _serve_replay(
        self, exchange: _Exchange, request: bytes, context: Any, span: Span
    ) -> bytes:
        """Replay: authorized as "Replay" (operator-only in the default policy), audited with the
        plan and, in the outcome, how many decisions diverged."""
        await self._admit(exchange, request, context, span, read="Replay")
        self._limit(len(request), "request")
        plan_id = decode_query("Replay", request)
        span.set_attributes(stratagem_attributes(plan_id=plan_id))
        await self._accept(exchange, f"plan {plan_id} replay")
        budget = self._budget(context)
        call = CallContext(
            caller=exchange.caller,
            delegation=exchange.delegation,
            target=self._role,
            capability="Replay",
            request_id=exchange.request_id,
            plan_id=plan_id,
            deadline=time.monotonic() + budget.seconds,
        )
        token = current_call.set(call)
        try:
            result = await _within(budget, self._backend.replay(plan_id, call), f"replay {plan_id}")
        finally:
            current_call.reset(token)
        exchange.summary = (
            f"plan {plan_id} revision {result.revision} replayed: {result.decisions} decisions, "
            f"{len(result.divergences)} diverged"
        )
        answer = encode_replay(result)
        self._limit(len(answer), "response")
        return answer

    async def _serve_run_plan(
        self, exchange: _Exchange, request: bytes, context: Any, span: Span
    ) -> bytes:
        await self._admit(exchange, request, context, span, read="RunPlan")
        self._limit(len(request), "request")
        plan_json = decode_run_plan(request)
        await self._accept(exchange)
        budget = self._budget(context)
        call = CallContext(
            caller=exchange.caller,
            delegation=exchange.delegation,
            target=self._role,
            capability="RunPlan",
            request_id=exchange.request_id,
            deadline=time.monotonic() + budget.seconds,
        )
        token = current_call.set(call)
        try:
            snapshot = await _within(budget, self._backend.run_plan(plan_json, call), "the plan")
        finally:
            current_call.reset(token)
        span.set_attributes(stratagem_attributes(plan_id=snapshot.plan_id))
        exchange.summary = f"plan {snapshot.plan_id} {snapshot.status}"
        answer = encode_snapshot(snapshot)
        self._limit(len(answer), "response")
        return answer

    async def _serve_control(
        self, exchange: _Exchange, request: bytes, context: Any, span: Span
    ) -> bytes:
        """Control: authorized as ``Control.<action>`` (the action named in the capability
        metadata, so authorization precedes decoding; the body must name the same action)."""
        capability = exchange.metadata.get(CAPABILITY_KEY, "")
        decoded: ControlRequest | None = None
        if not capability:
            # Without the metadata the body names the action (read once the caller is
            # authenticated, within the size limit), then authorization as above.
            exchange.caller = self._authenticator.authenticate(exchange.metadata, context)
            self._limit(len(request), "request")
            decoded = decode_control(request)
            capability = control_capability(decoded.action)
        if not capability.startswith(_CONTROL_PREFIX):
            exchange.caller = self._authenticator.authenticate(exchange.metadata, context)
            raise InvalidArgumentError(
                f"a Control call needs {CAPABILITY_KEY} metadata 'Control.<action>'"
            )
        await self._admit(exchange, request, context, span, read=capability)
        self._limit(len(request), "request")
        control = decoded or decode_control(request)
        if control_capability(control.action) != capability:
            raise InvalidArgumentError(
                "the request does not match the call metadata",
                violations=(
                    FieldViolation("action", f"{control.action!r} differs from {capability!r}"),
                ),
            )
        span.set_attributes(stratagem_attributes(plan_id=control.plan_id))
        described = f"plan {control.plan_id} {control.action}"
        if control.action in ("approve", "reject"):
            # The approver is the verified caller (the record's actor); the rationale is redacted
            # with the rest of the detail by the audit log.
            described += (
                f" gate {control.gate_id} by {exchange.caller}"
                + (" (recorded as done)" if control.output_json else "")
                + f": {control.rationale}"
            )
        elif control.action == "replan":
            described += f" by {exchange.caller}: {control.rationale}"
        await self._accept(exchange, described)
        budget = self._budget(context)
        call = CallContext(
            caller=exchange.caller,
            delegation=exchange.delegation,
            target=self._role,
            capability=capability,
            request_id=exchange.request_id,
            plan_id=control.plan_id,
            deadline=time.monotonic() + budget.seconds,
        )
        token = current_call.set(call)
        try:
            snapshot = await _within(
                budget, self._backend.control(control, call), f"{control.action} {control.plan_id}"
            )
        finally:
            current_call.reset(token)
        exchange.summary = f"{described} -> {snapshot.status}"
        answer = encode_snapshot(snapshot)
        self._limit(len(answer), "response")
        return answer

    async def _serve_watch(
        self, exchange: _Exchange, request: bytes, context: Any, span: Span
    ) -> None:
        plan_id = await self._admit_read(exchange, request, context, span, "Watch")
        limit = self._config.max_watch_streams
        if self._watch_streams >= limit:
            raise ResourceExhaustedError(
                f"{limit} Watch streams are open on this agent already; try again later"
            )
        events = self._backend.watch(plan_id)
        self._watch_streams += 1
        sent = 0
        try:
            async for event in events:
                await context.write(encode_event(event))
                sent += 1
        finally:
            self._watch_streams -= 1
            exchange.summary = f"{sent} events streamed"
            close = getattr(events, "aclose", None)
            if close is not None:
                await close()

    # --- outcome ----------------------------------------------------------------------------

    def _budget(self, context: Any) -> _Budget:
        remaining = context.time_remaining()
        if remaining is None:
            return _Budget(self._config.default_deadline_s, backstop=0.0)
        return _Budget(float(remaining), backstop=_BACKSTOP_S)

    async def _settle(
        self,
        exchange: _Exchange,
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
                if not self._refusals.admit(peer, code.value):
                    return
                detail = f"{detail} (peer {peer})"
            logger.info(
                "%s %s %s from %r: %s", action, exchange.method, code, exchange.caller, error
            )
        else:
            detail = exchange.summary or f"{len(answer or b'')} bytes answered"
        response_digest = digest(answer) if answer is not None else ""
        try:
            await self._record(
                exchange, action, code.value, detail, response_digest or exchange.request_digest
            )
        except Exception:
            logger.exception("cannot audit %s of request %r", action, exchange.request_id)

    async def _record(
        self, exchange: _Exchange, action: str, code: str, detail: str, payload_digest: str
    ) -> None:
        # A record handed to the log is written even when this call is cancelled meanwhile.
        await self._append(
            actor=exchange.caller,
            action=action,
            target=exchange.target or self._role,
            capability=exchange.capability,
            request_id=exchange.request_id,
            code=code,
            detail=detail,
            digest=payload_digest,
        )

    async def _flush_refusals_every_window(self) -> None:
        while True:
            await asyncio.sleep(self._refusals.window_s)
            await self._flush_refusals()

    async def _flush_refusals(self, *, everything: bool = False) -> None:
        """One aggregate audit record per peer whose window ended with refusals only counted."""
        for summary in self._refusals.drain(everything=everything):
            logger.warning("agent %s: %s", self._role, summary.detail)
            try:
                await self._append(
                    actor="",
                    action="call.refused.aggregate",
                    target=self._role,
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


def _check_routing(envelope: RequestEnvelope, exchange: _Exchange) -> None:
    """The envelope must name the caller, target, capability (and request id) the metadata named."""
    sent = {
        "caller": exchange.caller,
        "target": exchange.target,
        "capability": exchange.capability,
        "request_id": exchange.request_id or envelope.request_id,  # optional in metadata
        "delegation": list(exchange.delegation),
    }
    violations = tuple(
        FieldViolation(name, f"{getattr(envelope, name)!r} differs from the metadata's {value!r}")
        for name, value in sent.items()
        if getattr(envelope, name) != value
    )
    if violations:
        raise InvalidArgumentError(
            "the envelope does not match the call metadata", violations=violations
        )


def _plan_step(plan_id: str, step_id: str) -> str:
    """The accepted record's detail: which plan (and step) the call serves, if any."""
    if not plan_id:
        return ""
    return f"plan {plan_id} step {step_id}" if step_id else f"plan {plan_id}"
