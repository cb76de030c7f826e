"""The client side of a cross-agent request.

Every call carries a deadline: the call's own timeout, cut to what is left of the call being served
in this context (``remaining_time()``), so a nested request never outlives the one it serves. Every
call names its caller, target and capability in metadata and carries W3C trace context. A failed
call raises the ``RemoteError`` subclass of its status, converted once in ``protocol._status``.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry import propagate, trace
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import Span, SpanKind, TracerProvider
from pydantic import ValidationError

from stratagem.protocol._call_stream import CallStream
from stratagem.protocol._capabilities import CapabilitySpec, WireModel, capability_for
from stratagem.protocol._codec import decode_response, encode_call, violations_from
from stratagem.protocol._context import current_call, remaining_time
from stratagem.protocol._errors import (
    Code,
    DeadlineExceededError,
    InternalError,
    InvalidArgumentError,
    ProtocolUsageError,
    RemoteError,
)
from stratagem.protocol._identity import Credentials
from stratagem.protocol._metrics import RpcMetrics
from stratagem.protocol._models import (
    CAPABILITY_NAME_PATTERN,
    IDENTITY_PATTERN,
    NO_VALUE,
    PLAN_ID_PATTERN,
    REQUEST_ID_PATTERN,
    AgentCard,
    ControlAction,
    ControlRequest,
    NoQuery,
    PlanEvent,
    PlanSnapshot,
    PlansPage,
    PlansQuery,
    ReplayResult,
    RequestEnvelope,
    RevisionsResponse,
)
from stratagem.protocol._rpc import (
    CALLER_KEY,
    CAPABILITY_KEY,
    DELEGATION_KEY,
    KEEPALIVE_OPTIONS,
    REQUEST_ID_KEY,
    TARGET_KEY,
    VERSION_KEY,
    end_span,
    method_path,
    span_attributes,
    span_name,
)
from stratagem.protocol._service import (
    CONTROL,
    DESCRIBE,
    PLANS,
    REPLAY,
    REVISIONS,
    RUN_PLAN,
    WATCH,
    RpcSpec,
)
from stratagem.protocol._status import from_rpc_error

__all__ = ["AgentClient", "ClientConfig"]

logger = logging.getLogger(__name__)

R = TypeVar("R")
Req = TypeVar("Req", bound=WireModel)
Resp = TypeVar("Resp", bound=WireModel)

# The envelope's own patterns (see ``_call_payload``).
_IDENTITY: Final = re.compile(IDENTITY_PATTERN)
_REQUEST_ID: Final = re.compile(REQUEST_ID_PATTERN)
_PLAN_ID: Final = re.compile(PLAN_ID_PATTERN)
_CAPABILITY_NAME: Final = re.compile(CAPABILITY_NAME_PATTERN)


class _RequestIds:
    """Fresh request ids: a random per-process prefix and a counter (no syscall per id).

    The prefix is drawn again in a forked child, so two processes never share ids.
    """

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._prefix = os.urandom(12).hex()
        self._counter = itertools.count(1)

    def next(self) -> str:
        return f"{self._prefix}-{next(self._counter):x}"


_request_ids: Final = _RequestIds()


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """How an ``AgentClient`` calls.

    Attributes:
        default_timeout_s: The deadline of a call that names none.
        max_message_bytes: The largest response accepted, in bytes (larger ones fail with
            ``RESOURCE_EXHAUSTED``).
        call_stream: Send ``call`` over one long-lived ``CallStream`` to the agent (experimental;
            the server needs ``ServerConfig.call_streams``, else calls fail ``UNIMPLEMENTED``)
            instead of one unary ``Call`` each: the same request, metadata, deadline and errors.
            The other RPCs stay unary.
    """

    default_timeout_s: float = 30.0
    max_message_bytes: int = 4 << 20
    call_stream: bool = False

    def __post_init__(self) -> None:
        if self.default_timeout_s <= 0 or self.max_message_bytes <= 0:
            raise ProtocolUsageError("ClientConfig values must be positive")


class AgentClient:
    """Calls one agent's ``AgentService``.

    Args:
        endpoint: ``host:port`` of the agent's server.
        caller: This side's identity (a role, or ``OPERATOR``); ``credentials.identity`` when
            ``None``. The server refuses a caller other than the one its credentials prove.
        credentials: What proves the identity: a token sent with every call
            (``TokenCredentials``) or a client certificate (``TlsCredentials``); ``None`` sends
            only the caller's name, which only a server with authentication off accepts.
        config: Timeouts and limits.
        tracer_provider: The OpenTelemetry tracer provider; the global one when ``None``.
        meter_provider: Where call duration and in-flight metrics go; the global one when
            ``None``.

    The channel opens on the first call; close it with ``aclose`` or ``async with``.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        caller: str | None = None,
        credentials: Credentials | None = None,
        config: ClientConfig | None = None,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        caller = caller or (credentials.identity if credentials is not None else "")
        if not caller:
            raise ProtocolUsageError("an AgentClient needs a caller identity or credentials")
        self._endpoint = endpoint
        self._caller = caller
        self._credentials = credentials
        self._config = config or ClientConfig()
        self._tracer = trace.get_tracer(__name__, tracer_provider=tracer_provider)
        self._metrics = RpcMetrics(meter_provider, side="client")
        self._channel: Any = None
        self._callables: dict[str, Any] = {}
        self._stream: CallStream | None = None
        self._closed = False

    @property
    def endpoint(self) -> str:
        """The ``host:port`` called."""
        return self._endpoint

    # --- lifecycle --------------------------------------------------------------------------

    def _open(self) -> Any:
        # Opened lazily: a grpc.aio channel binds to the running event loop.
        if self._closed:
            raise ProtocolUsageError("the client is closed")
        if self._channel is None:
            options = [
                ("grpc.max_receive_message_length", self._config.max_message_bytes),
                *KEEPALIVE_OPTIONS,
            ]
            secure = None
            if self._credentials is not None:
                secure = self._credentials.channel_credentials()
                options.extend(self._credentials.channel_options())
            if secure is None:
                self._channel = grpc.aio.insecure_channel(self._endpoint, options=options)
            else:
                self._channel = grpc.aio.secure_channel(self._endpoint, secure, options=options)
            self._callables = {}
            self._stream = CallStream(self._channel) if self._config.call_stream else None
        return self._channel

    def _unary_callable(self, method: str) -> Any:
        """The channel's multicallable for ``method``, made once per channel."""
        channel = self._open()
        callable_ = self._callables.get(method)
        if callable_ is None:
            callable_ = self._callables[method] = channel.unary_unary(method_path(method))
        return callable_

    async def aclose(self) -> None:
        """Close the channel; calls in flight are cancelled."""
        self._closed = True
        if self._channel is not None:
            channel, self._channel = self._channel, None
            self._callables = {}
            if self._stream is not None:
                stream, self._stream = self._stream, None
                await stream.aclose()
            await channel.close()

    async def __aenter__(self) -> AgentClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # --- calls ------------------------------------------------------------------------------

    async def call(
        self,
        target: str,
        capability: str,
        request: WireModel,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
        request_id: str | None = None,
        plan_id: str = "",
        step_id: str = "",
    ) -> WireModel:
        """Ask ``target`` to serve ``capability``.

        Args:
            target: The role called.
            capability: The capability's name.
            request: The capability's request model.
            timeout: Seconds to wait; ``ClientConfig.default_timeout_s`` when ``None``. Always
                cut to what remains of the call being served in this context.
            request_id: The idempotency key; a fresh one when ``None``. Reuse it to retry safely.
            plan_id: The caller's plan, if any.
            step_id: The caller's step, if any.

        Returns:
            The capability's response model.

        Raises:
            ProtocolUsageError: An unknown capability, one ``target`` does not serve, a request of
                another model, or a malformed id.
            RemoteError: The subclass of the status the call ended with (``DeadlineExceededError``
                at once when no time is left; ``InternalError`` for a malformed response).
        """
        spec = capability_for(target, capability)
        if spec is None:
            raise ProtocolUsageError(f"{target!r} does not serve a capability {capability!r}")
        if not isinstance(request, spec.request):
            raise ProtocolUsageError(
                f"{capability} takes a {spec.request.__name__}, not a {type(request).__name__}"
            )
        request_id = request_id or _request_ids.next()
        serving = current_call.get()
        delegation = () if serving is None else serving.onward_delegation()
        payload = _call_payload(
            spec, self._caller, target, request, request_id, plan_id, step_id, delegation
        )

        def answer(data: bytes) -> WireModel:
            response = decode_response(data)
            if response.request_id != request_id or response.capability != capability:
                raise InvalidArgumentError("it answers another request")
            return response.body

        return await self._unary(
            "Call",
            payload,
            answer,
            timeout_s=timeout,
            target=target,
            capability=capability,
            request_id=request_id,
            extra_metadata=(
                ((VERSION_KEY, spec.version), (DELEGATION_KEY, ",".join(delegation)))
                if delegation
                else ((VERSION_KEY, spec.version),)
            ),
            plan_id=plan_id,
            step_id=step_id,
        )

    async def describe(
        self,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> AgentCard:
        """The agent's card: its role, capabilities (with their schemas) and tools."""
        return await self._rpc(DESCRIBE, NoQuery(), timeout)

    async def plans(
        self,
        plan_id: str = "",
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> list[PlanSnapshot]:
        """Snapshots of ``plan_id`` and its sub-plans, or of every plan the agent holds for "":
        every page of them (``plans_page`` reads one), each page under ``timeout``."""
        snapshots: list[PlanSnapshot] = []
        token = ""
        while True:
            page, token = await self.plans_page(plan_id, page_token=token, timeout=timeout)
            snapshots.extend(page)
            if not token:
                return snapshots

    async def plans_page(
        self,
        plan_id: str = "",
        *,
        page_size: int = 0,
        page_token: str = "",
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> tuple[list[PlanSnapshot], str]:
        """One page of ``plans``: at most ``page_size`` snapshots (0: the agent's default) from
        ``page_token`` on, and the next page's token ("" after the last page).

        Raises:
            ProtocolUsageError: A malformed ``plan_id`` or ``page_token``, or a ``page_size``
                outside 0..1000.
        """
        query = PLANS.build(plan_id=plan_id, page_size=page_size, page_token=page_token)
        page = await self._rpc(PLANS, query, timeout)
        return page.plans, page.next_page_token

    async def history(
        self,
        query: PlansQuery,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> PlansPage:
        """One page of the agent's plans from its durable store, as ``query`` asks (filters, how
        much each snapshot carries, which page), with what the agent could not read.

        Raises:
            InvalidArgumentError: The agent refused a filter (a status that is not one).
        """
        return await self._rpc(PLANS, query, timeout)

    async def run_plan(
        self,
        plan_json: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
        request_id: str | None = None,
        until_blocked: bool = False,
    ) -> PlanSnapshot:
        """Have the agent validate and run a plan written for it; returns the plan's final state
        (with ``until_blocked``, its state as soon as it waits at a gate, the plan then running on
        at its agent whatever the call's deadline).

        Raises:
            FailedPreconditionError: The plan fails the agent's validation (e.g. a cycle, a tool
                outside its registry); the message names every problem.
            InvalidArgumentError: ``plan_json`` is not a plan of the agent's type.
            RemoteError: The plan ran and failed: the subclass of its failure's code, but
                ``AbortedError`` for a transient or timeout failure. Sending the same
                ``request_id`` again runs nothing: it answers with the run the first call started.
        """
        return await self._rpc(
            RUN_PLAN,
            RUN_PLAN.build(plan_json=plan_json, until_blocked=until_blocked),
            timeout,
            request_id=request_id,
        )

    async def control(
        self,
        plan_id: str,
        action: ControlAction,
        *,
        gate_id: str = "",
        rationale: str = "",
        revision: int = 0,
        output: dict[str, Any] | None = None,
        plan_json: str = "",
        value: Any = NO_VALUE,  # none given (``None`` is a value: JSON's null)
        arguments: dict[str, Any] | None = None,
        at_step: str = "",
        at_revision: int = 0,
        outputs: dict[str, dict[str, Any]] | None = None,
        new_plan_id: str = "",
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> PlanSnapshot:
        """Approve, reject, pause, cancel, resume, replan or fork one of the agent's plans.

        Authorized as the pseudo-capability ``Control.<action>``; the approver of a gate decision
        is this client's caller identity, as the server verified it (a gate that names its
        deciders refuses anyone else: ``PermissionDeniedError``).

        Args:
            plan_id: The plan.
            action: One of ``CONTROL_ACTIONS``: ``approve``, ``reject``, ``pause``, ``cancel``,
                ``resume``, ``replan`` or ``fork``.
            gate_id: For ``approve``/``reject``: the gate step, or the step a reconcile gate names.
            rationale: For ``approve``/``reject``: why (audited, redacted).
            revision: The plan revision the decision is for; 0 for the plan's current one.
            output: For ``approve`` of a reconcile gate: the step's output to record instead of
                re-running the step (its effect was found done).
            plan_json: For ``replan``: the new revision's plan, as JSON of the agent's plan type
                (``rationale`` is required too); ``resume`` then runs it.
            value: For ``approve`` of a gate that asks: its value (any JSON value; omit it
                otherwise).
            arguments: For ``approve`` of a tool gate: the tool's arguments as edited.
            at_step: For ``fork``: the fork point ("" : the end of the revision).
            at_revision: For ``fork``: the revision forked (0: the newest).
            outputs: For ``fork``: step id -> an output substituted for its recorded one.
            new_plan_id: For ``fork``: the new plan's id ("" : the agent makes one).
            timeout: The call's deadline in seconds.

        Returns:
            The plan's state once the action took effect (for ``fork``: the new plan's).

        Raises:
            ProtocolUsageError: The arguments do not form a valid request (e.g. no ``gate_id``).
            NotFoundError: The agent has no such plan.
            InvalidArgumentError: A value or arguments that do not fit the gate, a fork point
                that does not exist or an output for a step not before it (naming the field).
            PermissionDeniedError: The gate is not for this caller.
            FailedPreconditionError: The action does not apply (a gate not open, a finished plan).
        """
        try:
            request = ControlRequest.build(
                plan_id,
                action,
                gate_id=gate_id,
                rationale=rationale,
                revision=revision,
                output=output,
                plan_json=plan_json,
                value=value,
                arguments=arguments,
                at_step=at_step,
                at_revision=at_revision,
                outputs=outputs,
                new_plan_id=new_plan_id,
            )
        except ValidationError as exc:
            problems = "; ".join(f"{v.field}: {v.description}" for v in violations_from(exc))
            raise ProtocolUsageError(f"invalid {action} of plan {plan_id!r}: {problems}") from None
        except ValueError as exc:  # a value that is not JSON, named
            raise ProtocolUsageError(f"invalid {action} of plan {plan_id!r}: {exc}") from None
        return await self._rpc(CONTROL, request, timeout)

    async def fork(
        self,
        plan_id: str,
        *,
        at_step: str = "",
        at_revision: int = 0,
        outputs: dict[str, dict[str, Any]] | None = None,
        new_plan_id: str = "",
        rationale: str = "",
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> PlanSnapshot:
        """Fork one of the agent's plans: ``control(plan_id, "fork", ...)``; the new plan's
        snapshot (it runs on from the fork point, the results before it carried)."""
        return await self.control(
            plan_id,
            "fork",
            at_step=at_step,
            at_revision=at_revision,
            outputs=outputs,
            new_plan_id=new_plan_id,
            rationale=rationale,
            timeout=timeout,
        )

    async def revisions(
        self,
        plan_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> RevisionsResponse:
        """The plan's revision history on this agent (its owner), oldest first.

        Raises:
            NotFoundError: The agent has no such plan in its store.
        """
        return await self._rpc(REVISIONS, REVISIONS.build(plan_id=plan_id), timeout)

    async def replay(
        self,
        plan_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> ReplayResult:
        """Re-run a finished plan on its owner from the recorded outputs, and compare decisions.

        Nothing outside the agent's engine runs. Authorized as the pseudo-capability ``Replay``.

        Raises:
            NotFoundError: The agent has no such plan in its store.
            FailedPreconditionError: The plan is not finished.
        """
        return await self._rpc(REPLAY, REPLAY.build(plan_id=plan_id), timeout)

    async def watch(
        self,
        plan_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> AsyncIterator[PlanEvent]:
        """Stream the events of ``plan_id`` and its sub-plans until the agent ends the stream.

        Args:
            plan_id: The plan to follow.
            timeout: A deadline for the whole stream; none unless given (or inherited).

        Yields:
            Each event as the agent sends it.

        Raises:
            RemoteError: The subclass of the status the stream ended with.
        """
        query = WATCH.encode_request(WATCH.build(plan_id=plan_id))
        inherited = remaining_time()
        deadline = self._deadline(timeout) if timeout is not None or inherited is not None else None
        span = self._tracer.start_span(
            span_name(WATCH.name),
            kind=SpanKind.CLIENT,
            attributes=span_attributes(WATCH.name, plan_id=plan_id),
        )
        # The span is not made current: a generator's context would leak into its consumer's.
        stream = self._open().unary_stream(method_path(WATCH.name))(
            query,
            timeout=deadline,
            metadata=self._metadata(WATCH.authorized_as, context=trace.set_span_in_context(span)),
            wait_for_ready=False,
        )
        try:
            async for data in stream:
                try:
                    event = WATCH.decode_response(data)
                except RemoteError as exc:
                    raise self._malformed(span, self._endpoint, exc) from exc
                yield event
            end_span(span, Code.OK, "", server=False)
        except grpc.aio.AioRpcError as exc:
            error = from_rpc_error(exc)
            end_span(span, error.code, error.message, server=False)
            raise error from exc
        finally:
            stream.cancel()
            span.end()

    async def health(
        self,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> str:
        """The agent's health status name (``SERVING``, ``NOT_SERVING``...).

        Raises:
            RemoteError: When the health service cannot be reached (``UnavailableError``).
        """
        stub = health_pb2_grpc.HealthStub(self._open())
        try:
            response = await stub.Check(
                health_pb2.HealthCheckRequest(service=""),
                timeout=self._deadline(timeout),
                wait_for_ready=False,
            )
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from exc
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))

    # --- helpers ----------------------------------------------------------------------------

    def _deadline(self, timeout: float | None) -> float:
        """The call's deadline in seconds: its timeout, cut to the inherited remaining time."""
        if timeout is not None and timeout <= 0:
            raise ProtocolUsageError(f"timeout must be positive, not {timeout}")
        seconds = self._config.default_timeout_s if timeout is None else timeout
        inherited = remaining_time()
        if inherited is not None:
            if inherited <= 0:
                raise DeadlineExceededError("no time is left of the calling request's deadline")
            seconds = min(seconds, inherited)
        return seconds

    def _metadata(
        self,
        capability: str,
        *,
        target: str | None = None,
        request_id: str = "",
        context: Any = None,
        extra: tuple[tuple[str, str], ...] = (),
    ) -> tuple[tuple[str, str], ...]:
        """Routing metadata (caller, target, capability, request id, ``extra``), the credentials'
        metadata and W3C trace context."""
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=context)
        routing = {CALLER_KEY: self._caller, CAPABILITY_KEY: capability}
        if target is not None:
            routing[TARGET_KEY] = target
        if request_id:
            routing[REQUEST_ID_KEY] = request_id
        routing.update(extra)
        if self._credentials is not None:
            routing.update(self._credentials.metadata())
        return tuple({**routing, **carrier}.items())

    async def _rpc(
        self,
        spec: RpcSpec[Req, Resp],
        request: Req,
        timeout_s: float | None,
        *,
        request_id: str | None = None,
    ) -> Resp:
        """One unary RPC of the table: authorized as the capability its entry names for
        ``request``, with a fresh request id when the entry asks for one (or ``request_id``)."""
        if not request_id and spec.request_id:
            request_id = f"{spec.request_id}-{uuid.uuid4().hex}"
        return await self._unary(
            spec.name,
            spec.encode_request(request),
            spec.decode_response,
            timeout_s=timeout_s,
            capability=spec.authorization(request),
            request_id=request_id or "",
            plan_id=str(getattr(request, "plan_id", "")),
        )

    async def _unary(
        self,
        method: str,
        request: bytes,
        decode: Callable[[bytes], R],
        *,
        timeout_s: float | None,
        target: str | None = None,
        capability: str = "",
        request_id: str = "",
        extra_metadata: tuple[tuple[str, str], ...] = (),
        **span_values: str,
    ) -> R:
        """Send one unary request under its deadline and CLIENT span; decode or map the failure."""
        deadline = self._deadline(timeout_s)
        # The span is started, not made current: nothing in this process runs under it, and the
        # metadata takes its context explicitly (cheaper than start_as_current_span).
        span = self._tracer.start_span(
            span_name(method),
            kind=SpanKind.CLIENT,
            attributes=span_attributes(
                method, capability=capability, request_id=request_id, **span_values
            ),
            record_exception=False,
            set_status_on_exception=False,
        )
        began = time.perf_counter()
        self._metrics.started(method, capability)
        code = Code.UNKNOWN
        try:
            metadata = self._metadata(
                capability or method,
                target=target,
                request_id=request_id,
                extra=extra_metadata,
                context=trace.set_span_in_context(span),
            )
            callable_ = self._unary_callable(method)
            if self._stream is not None and method == "Call":
                data = await self._stream.call(request_id, request, deadline, metadata)
            else:
                data = await callable_(
                    request, timeout=deadline, metadata=metadata, wait_for_ready=False
                )
        except (grpc.aio.AioRpcError, RemoteError) as exc:
            error = exc if isinstance(exc, RemoteError) else from_rpc_error(exc)
            code = error.code
            error.trace_id = _trace_id(span)
            end_span(span, error.code, error.message, server=False)
            logger.debug("%s %s on %s failed: %s", method, capability, self._endpoint, error)
            if error is exc:
                raise
            raise error from exc
        else:
            try:
                answer = decode(bytes(data))
            except RemoteError as exc:
                code = Code.INTERNAL
                raise self._malformed(span, target or self._endpoint, exc) from exc
            code = Code.OK
            end_span(span, Code.OK, "", server=False)
            return answer
        finally:
            self._metrics.finished(method, capability, code, time.perf_counter() - began)
            span.end()

    def _malformed(self, span: Span, target: str, exc: RemoteError) -> InternalError:
        error = InternalError(f"malformed response from {target}: {exc}")
        end_span(span, error.code, error.message, server=False)
        logger.warning("%s", error)
        return error


def _trace_id(span: Span) -> str:
    """The trace id of ``span`` as 32 hex characters ("" when it has none)."""
    context = span.get_span_context()
    return f"{context.trace_id:032x}" if context.is_valid else ""


def _call_payload(
    spec: CapabilitySpec,
    caller: str,
    target: str,
    request: WireModel,
    request_id: str,
    plan_id: str,
    step_id: str,
    delegation: tuple[str, ...],
) -> bytes:
    """A ``Call``'s ``AgentRequest`` bytes; a malformed id is a ``ProtocolUsageError`` naming it.

    The envelope's patterns are checked here, so a well-formed call skips building (and
    validating) a ``RequestEnvelope``; a call failing one of them builds it, for its exact error.
    """
    capability = spec.name
    well_formed = (
        _REQUEST_ID.fullmatch(request_id)
        and _IDENTITY.fullmatch(caller)
        and _IDENTITY.fullmatch(target)
        and _CAPABILITY_NAME.fullmatch(capability)
        and (not plan_id or _PLAN_ID.fullmatch(plan_id))
        and (not step_id or _PLAN_ID.fullmatch(step_id))
    )
    if not well_formed:
        try:
            RequestEnvelope(
                request_id=request_id,
                caller=caller,
                target=target,
                plan_id=plan_id,
                step_id=step_id,
                capability=capability,
                body=request,
                delegation=list(delegation),
            )
        except ValidationError as exc:
            problems = "; ".join(f"{v.field}: {v.description}" for v in violations_from(exc))
            raise ProtocolUsageError(f"invalid call to {target}.{capability}: {problems}") from None
    return encode_call(
        spec,
        request_id=request_id,
        caller=caller,
        target=target,
        plan_id=plan_id,
        step_id=step_id,
        body=request,
        delegation=delegation,
    )
