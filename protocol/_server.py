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

The server registers one handler per entry of the RPC table (``protocol._service.RPCS``).
``Describe``, ``Watch``, ``Plans``, ``Revisions``, ``RunPlan`` and ``Replay`` go through stages 1-5
too, authorized as the pseudo-capabilities of the same names; their target defaults to this agent;
then the handler their entry names runs under the deadline, with ``current_call`` set.
``Control`` (approve, reject, pause, cancel, resume or replan a plan) is authorized as
``Control.<action>``, named in the
capability metadata so authorization still precedes decoding; its audit records carry the action,
the gate, the approver (the verified caller) and the rationale (redacted) in their detail.

With ``ServerConfig.call_streams`` the server also serves ``CallStreamService.CallStream``
(experimental, ``protocol._call_stream``): each frame of the stream is one ``Call`` through the
stages above (``_run`` with the call pipeline), answered by request id as it finishes.

Where the stages live: the ones every RPC shares in ``_pipeline.py`` (``Pipeline``), ``Call``'s own
in ``_calls.py`` (``CallPipeline``), slots and deadlines in ``_admission.py``; this module holds
the server's lifecycle, the registration and the dispatcher (span, errors to statuses).

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
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from functools import partial
from typing import Any, Final

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import Span, SpanKind, TracerProvider

from stratagem.protocol._admission import deadline_passed, interruption, within
from stratagem.protocol._answers import AnswerRetention, AnswerStore, InMemoryAnswerStore
from stratagem.protocol._audit import AuditLog
from stratagem.protocol._call_stream import CALL_STREAM_SERVICE, serve_call_stream
from stratagem.protocol._calls import CallPipeline
from stratagem.protocol._capabilities import WireModel
from stratagem.protocol._context import CallContext, current_call
from stratagem.protocol._errors import (
    FieldViolation,
    InvalidArgumentError,
    ProtocolUsageError,
    RemoteError,
    ResourceExhaustedError,
)
from stratagem.protocol._identity import Authenticator
from stratagem.protocol._metrics import RpcMetrics
from stratagem.protocol._pipeline import Exchange, Pipeline, Stage
from stratagem.protocol._policy import Policy
from stratagem.protocol._proof import PROOF_SERVICE, prove_handler
from stratagem.protocol._rpc import (
    CAPABILITY_KEY,
    SERVER_KEEPALIVE_OPTIONS,
    SERVICE,
    span_attributes,
    span_name,
    stratagem_attributes,
    text_metadata,
)
from stratagem.protocol._server_config import ServerConfig
from stratagem.protocol._service import CALL, RPCS, AgentBackend, RpcSpec, Serving
from stratagem.protocol._status import as_remote_error, grpc_status

__all__ = ["AgentServer", "HttpCall", "ServerConfig"]

logger = logging.getLogger(__name__)

# How far above ``max_message_bytes`` the transport's own limits sit, so our check answers first.
_TRANSPORT_HEADROOM: Final = 4
# Messages of a stream served for another transport held while its reader catches up.
_FOREIGN_STREAM_BUFFER: Final = 64


class HttpCall:
    """A call another transport (the A2A and MCP faces, over HTTP) received: what
    ``AgentServer.serve_foreign`` asks of grpc's servicer context.

    Args:
        peer: The peer as gRPC names one (``ipv4:127.0.0.1:5555``).
        deadline_s: The call's deadline, seconds from now, as a gRPC client's deadline would be
            (``None``: the server's default deadline).
    """

    def __init__(self, peer: str, *, deadline_s: float | None = None) -> None:
        self._peer = peer
        self._deadline = None if deadline_s is None else time.monotonic() + deadline_s

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None  # the server's default deadline
        return self._deadline - time.monotonic()

    def peer(self) -> str:
        return self._peer

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}  # no TLS peer certificate: the mTLS authenticator refuses the call


class _StreamSink:
    """A foreign transport's context for a stream: its deadline and peer, and a bounded queue
    where the stream's messages go (what ``_stream`` asks of grpc's servicer context)."""

    def __init__(self, context: Any, messages: asyncio.Queue[bytes]) -> None:
        self._context = context
        self._messages = messages

    def time_remaining(self) -> float | None:
        remaining: float | None = self._context.time_remaining()
        return remaining

    def peer(self) -> str:
        return str(self._context.peer())

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}  # no TLS peer certificate: the mTLS authenticator refuses the call

    async def write(self, message: bytes) -> None:
        await self._messages.put(message)


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
        refusal: Why the agent takes no work now (``""`` when it does): asked before every write
            RPC (``Call``, ``RunPlan``, ``Control``, ``Replay``) once the caller is authorized; a
            reason refuses the call with ``FAILED_PRECONDITION`` naming it (the host's plan store
            is gone, say).

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
        refusal: Callable[[], str] | None = None,
    ) -> None:
        self._backend = backend
        self._role = backend.role
        self._authenticator = authenticator
        self._config = config or ServerConfig()
        self._streams = 0
        self._tracer = trace.get_tracer(__name__, tracer_provider=tracer_provider)
        self._metrics = RpcMetrics(meter_provider, side="server")
        self._pipeline = Pipeline(
            role=self._role,
            config=self._config,
            policy=policy,
            authenticator=authenticator,
            audit=audit,
            metrics=self._metrics,
            refusal=refusal,
        )
        self._calls = CallPipeline(
            self._pipeline,
            backend,
            # Not ``answers or ...``: an empty InMemoryAnswerStore is falsy (it has a length).
            answers
            if answers is not None
            else InMemoryAnswerStore(
                AnswerRetention(
                    max_entries=self._config.answer_cache_size,
                    max_bytes=self._config.answer_cache_bytes,
                )
            ),
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
        admissible = (
            self._config.max_concurrent_requests
            + self._config.max_queued_requests
            + self._config.max_watch_streams
        )
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
                    SERVICE, {name: self._method_handler(spec) for name, spec in RPCS.items()}
                ),
            )
        )
        if self._config.call_streams:
            server.add_generic_rpc_handlers(
                (
                    grpc.method_handlers_generic_handler(
                        CALL_STREAM_SERVICE,
                        {"CallStream": grpc.stream_stream_rpc_method_handler(self._call_stream)},
                    ),
                )
            )
        # Proof of this agent's key for a client that read its endpoint from a file, before the
        # client sends credentials (``protocol._proof``): no credentials, no audit, like health.
        server.add_generic_rpc_handlers(
            (prove_handler(self._authenticator, lambda: (self._role, self.endpoint)),)
        )
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        # Server reflection: tools (grpcurl, Postman, grpcui) list and describe the services from
        # the agent itself. It tells what the public .proto tells, nothing more, so it needs no
        # credentials; every AgentService call still does.
        streams = (CALL_STREAM_SERVICE,) if self._config.call_streams else ()
        reflection.enable_server_reflection(
            (SERVICE, *streams, PROOF_SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME),
            server,
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
            self._pipeline.flush_refusals_every_window(), name=f"stratagem-refusals-{self._role}"
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
    def role(self) -> str:
        """The role of the agent served."""
        return self._role

    def authenticate(self, metadata: Mapping[str, str], context: Any) -> str:
        """The identity this server's authenticator verifies from ``metadata`` (for a transport
        that must refuse an unauthenticated request before it knows the RPC: the MCP face).

        Raises:
            UnauthenticatedError: No credentials, or credentials that do not verify.
        """
        return self._authenticator.authenticate(metadata, context)

    @property
    def port(self) -> int:
        """The bound port (0 before ``start``)."""
        return self._port

    @property
    def load(self) -> tuple[int, int]:
        """Calls running and calls queued for a slot, now."""
        return self._pipeline.admission.running, self._pipeline.admission.queued

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
        await self._pipeline.flush_refusals(everything=True)
        logger.info("agent %s stopped serving on port %s", self._role, self._port)

    async def __aenter__(self) -> AgentServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # --- the RPCs of the table ----------------------------------------------------------------

    def _method_handler(self, spec: RpcSpec[Any, Any]) -> Any:
        """The grpc handler of one RPC: ``Call`` through its pipeline, the others through
        ``_serve_rpc``; unary or server-streaming as the table says."""
        stage: Stage = self._calls.serve if spec is CALL else partial(self._serve_rpc, spec)
        name = spec.name

        if spec.streaming:

            async def streamed(request: bytes, context: Any) -> None:
                await self._serve(name, request, context, stage)

            return grpc.unary_stream_rpc_method_handler(streamed)

        async def unary(request: bytes, context: Any) -> bytes | None:
            return await self._serve(name, request, context, stage)

        return grpc.unary_unary_rpc_method_handler(unary)

    async def _call_stream(self, frames: AsyncIterator[bytes], context: Any) -> None:
        """``CallStream``: each frame's call through ``Call``'s stages (``_call_stream``)."""

        def run(
            metadata: dict[str, str], request: bytes, call: Any
        ) -> Awaitable[tuple[bytes | None, RemoteError | None]]:
            return self._run(CALL.name, metadata, request, call, self._calls.serve)

        config = self._config
        # Twice what admission takes, so that the pipeline's own (audited) RESOURCE_EXHAUSTED
        # answers a stream that asks too much; the stream's bound only caps its tasks.
        admissible = config.max_concurrent_requests + config.max_queued_requests
        try:
            await serve_call_stream(run, frames, context, max_calls=2 * admissible)
        except RemoteError as error:  # a frame that does not parse ends the stream
            await context.abort_with_status(grpc_status(error))

    async def _serve(self, method: str, request: bytes, context: Any, stage: Stage) -> bytes | None:
        """Run one RPC's stages; answer its outcome over gRPC."""
        metadata = text_metadata(tuple(context.invocation_metadata() or ()))
        answer, error = await self._run(method, metadata, request, context, stage)
        if error is None:
            return answer
        if deadline_passed(context):
            # The transport has ended the call with DEADLINE_EXCEEDED: nobody is left to answer.
            raise asyncio.CancelledError
        await context.abort_with_status(grpc_status(error))
        raise AssertionError("grpc's abort returned instead of raising")

    async def serve_foreign(
        self,
        method: str,
        request: bytes,
        metadata: Mapping[str, str],
        context: Any,
        *,
        refusal: RemoteError | None = None,
    ) -> bytes:
        """Serve a unary RPC of the table that arrived by another transport (the MCP face).

        It runs the stages a gRPC call runs (authentication from ``metadata``, policy, admission,
        decoding, the answer store, audit, the server span); only the transport differs.

        Args:
            method: The RPC's name (``"Call"``, ``"Describe"``...).
            request: Its request message's bytes.
            metadata: What a gRPC call carries as metadata (``authorization``, routing keys).
            context: Stands for grpc's servicer context: ``time_remaining()`` (``None`` for the
                server's default deadline) and ``peer()`` (``"ipv4:HOST:PORT"``).
            refusal: Refuse the call with this error once its caller is authenticated and
                authorized (a request the other transport could not turn into ``request``).

        Returns:
            The answer's bytes.

        Raises:
            RemoteError: The refusal or failure, already audited as a gRPC call's would be.
        """
        spec = RPCS[method]
        stage: Stage = self._calls.serve if spec is CALL else partial(self._serve_rpc, spec)
        if refusal is not None:
            refused = refusal

            async def stage(exchange: Exchange, data: bytes, ctx: Any, span: Span) -> bytes:
                read = None if spec is CALL else spec.authorized_as
                if read is not None and spec.action:
                    # ``Control.{action}``: the capability the request names, when it has one.
                    with contextlib.suppress(Exception):
                        read = spec.authorization(spec.decode_request(data))
                await self._pipeline.admit(exchange, data, ctx, span, read=read, queue=False)
                raise refused

        answer, error = await self._run(method, dict(metadata), request, context, stage)
        if error is not None:
            raise error
        assert answer is not None  # unary
        return answer

    async def stream_foreign(
        self, method: str, request: bytes, metadata: Mapping[str, str], context: Any
    ) -> AsyncGenerator[bytes]:
        """Serve a server-streaming RPC (``Watch``) that arrived by another transport (the A2A
        face's SSE streams), through the stages ``serve_foreign`` runs; its messages' bytes as they
        come. At most ``_FOREIGN_STREAM_BUFFER`` wait for the reader: a slow one holds the stream
        back rather than letting it queue without limit.

        Raises:
            RemoteError: The refusal or failure, before or while streaming, already audited.
        """
        spec = RPCS[method]
        messages: asyncio.Queue[bytes] = asyncio.Queue(maxsize=_FOREIGN_STREAM_BUFFER)
        sink = _StreamSink(context, messages)
        serving = asyncio.ensure_future(
            self._run(method, dict(metadata), request, sink, partial(self._serve_rpc, spec))
        )
        try:
            while True:
                if not messages.empty():
                    yield messages.get_nowait()
                    continue
                if serving.done():
                    break
                getter = asyncio.ensure_future(messages.get())
                await asyncio.wait((getter, serving), return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    yield getter.result()
                else:
                    getter.cancel()
            _, error = serving.result()
            if error is not None:
                raise error
        finally:
            if not serving.done():
                serving.cancel()
                with contextlib.suppress(BaseException):
                    await serving

    @property
    def auth_mode(self) -> str:
        """How callers are verified (``token``, ``mtls`` or ``none``)."""
        return self._authenticator.mode

    async def _run(
        self, method: str, metadata: dict[str, str], request: bytes, context: Any, stage: Stage
    ) -> tuple[bytes | None, RemoteError | None]:
        """Run one RPC's stages inside its server span; settle and audit its outcome. The span
        has ended when this returns (before the answer or status leaves)."""
        exchange = Exchange(method=method, metadata=metadata)
        pipeline = self._pipeline
        began = time.perf_counter()
        self._metrics.started(method)
        # start_span and attach/detach rather than start_as_current_span: the same current span,
        # without two generator context managers per call.
        span = self._tracer.start_span(
            span_name(method),
            context=propagate.extract(metadata),
            kind=SpanKind.SERVER,
            attributes=span_attributes(method),
            record_exception=False,
            set_status_on_exception=False,
        )
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            try:
                answer = await stage(exchange, request, context, span)
                await pipeline.confirm(exchange)
            except asyncio.CancelledError:
                pipeline.release(exchange)
                await pipeline.settle(exchange, span, interruption(context), None, began, context)
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
                pipeline.release(exchange)
                await pipeline.settle(exchange, span, None, answer, began)
                return answer, None
            pipeline.release(exchange)
            await pipeline.settle(exchange, span, error, None, began, context)
            return None, error
        finally:
            otel_context.detach(token)
            span.end()

    async def _serve_rpc(
        self, spec: RpcSpec[Any, Any], exchange: Exchange, request: bytes, context: Any, span: Span
    ) -> bytes | None:
        """Stages 1-5, ``call.accepted``, then the table's handler: an RPC other than ``Call``,
        authorized as its pseudo-capability and targeting this agent."""
        pipeline = self._pipeline
        decoded: WireModel | None = None
        capability = spec.authorized_as
        if spec.action:
            # Authorized per action: the action is named in the capability metadata, so
            # authorization precedes decoding; the body must name the same action.
            prefix = spec.authorized_as.partition("{")[0]
            capability = exchange.metadata.get(CAPABILITY_KEY, "")
            if not capability:
                # Without the metadata the body names the action (read once the caller is
                # authenticated, within the size limit), then authorization as above.
                exchange.caller = self._authenticator.authenticate(exchange.metadata, context)
                pipeline.limit(len(request), "request")
                decoded = spec.decode_request(request)
                capability = spec.authorization(decoded)
            if not capability.startswith(prefix):
                exchange.caller = self._authenticator.authenticate(exchange.metadata, context)
                raise InvalidArgumentError(
                    f"a {spec.name} call needs {CAPABILITY_KEY} metadata '{prefix}<{spec.action}>'"
                )
        await pipeline.admit(
            exchange,
            request,
            context,
            span,
            read=capability,
            queue=spec.queued,
            writes=spec.access == "write",
        )
        pipeline.limit(len(request), "request")
        body = decoded or spec.decode_request(request)
        if spec.action and spec.authorization(body) != capability:
            raise InvalidArgumentError(
                "the request does not match the call metadata",
                violations=(
                    FieldViolation(
                        spec.action,
                        f"{getattr(body, spec.action)!r} differs from {capability!r}",
                    ),
                ),
            )
        plan_id = str(getattr(body, "plan_id", ""))
        if plan_id:
            span.set_attributes(stratagem_attributes(plan_id=plan_id))
        await pipeline.accept(exchange, spec.accepted(body, exchange.caller))
        if spec.stream is not None:
            await self._stream(spec, exchange, body, context)
            return None
        assert spec.serve is not None  # every RPC but Call has a handler
        budget = pipeline.budget(context)
        call = CallContext(
            caller=exchange.caller,
            delegation=exchange.delegation,
            target=self._role,
            capability=capability,
            request_id=exchange.request_id,
            plan_id=plan_id,
            deadline=time.monotonic() + budget.seconds,
        )
        serving = Serving(self._backend, body, call, self._config.max_message_bytes)
        token = current_call.set(call)
        try:
            response, summary = await within(budget, spec.serve(serving), spec.described(body))
        finally:
            current_call.reset(token)
        answered_plan = getattr(response, "plan_id", "")
        if not plan_id and answered_plan:
            span.set_attributes(stratagem_attributes(plan_id=answered_plan))
        exchange.summary = summary
        answer: bytes = spec.encode_response(response)
        pipeline.limit(len(answer), "response")
        return answer

    async def _stream(
        self, spec: RpcSpec[Any, Any], exchange: Exchange, body: WireModel, context: Any
    ) -> None:
        """Write a server-streaming RPC's messages; at most ``max_watch_streams`` are open."""
        assert spec.stream is not None
        limit = self._config.max_watch_streams
        if self._streams >= limit:
            raise ResourceExhaustedError(
                f"{limit} {spec.name} streams are open on this agent already; try again later"
            )
        call = CallContext(
            caller=exchange.caller,
            delegation=exchange.delegation,
            target=self._role,
            capability=exchange.capability,
            request_id=exchange.request_id,
            plan_id=str(getattr(body, "plan_id", "")),
        )
        messages = spec.stream(Serving(self._backend, body, call, self._config.max_message_bytes))
        self._streams += 1
        sent = 0
        try:
            async for message in messages:
                await context.write(spec.encode_response(message))
                sent += 1
        finally:
            self._streams -= 1
            exchange.summary = f"{sent} events streamed"
            close: Callable[[], Any] | None = getattr(messages, "aclose", None)
            if close is not None:
                await close()
