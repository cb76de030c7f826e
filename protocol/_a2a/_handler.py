"""A2A's JSON-RPC methods answered by the agent's own RPCs, through the agent's gRPC pipeline.

Each method becomes the RPC of the table it means, encoded as a gRPC client would encode it, and is
served by ``AgentServer.serve_foreign`` / ``stream_foreign``: the same authentication (the HTTP
``Authorization`` header is the call's ``authorization`` metadata), authorization, admission,
limits, validation, audit records, span and metrics as the same call over gRPC.

| A2A method | the agent's RPC | authorized as |
|---|---|---|
| ``SendMessage`` | ``Call`` (a message when its ``A2AReply`` asks) | the skill's capability |
| ``SendMessage`` to a task asking | ``Control`` ``approve`` of its gate | ``Control.approve`` |
| ``SendStreamingMessage`` | ``Call``, with ``Watch`` on its plan | the capability, and ``Watch`` |
| ``GetTask`` | ``Plans`` of the task's plan | ``Plans`` |
| ``CancelTask`` | ``Control`` ``cancel`` | ``Control.cancel`` |
| ``SubscribeToTask`` | ``Plans``, then ``Watch`` | ``Plans``, ``Watch`` |

A message that cannot become a request (no usable part, a request breaking the capability's model,
an unknown skill) is refused through the pipeline too (``AgentServer.serve_foreign`` with a
``refusal``), after the authentication and authorization a ``Call`` gets. Push notifications are not
offered (``PushNotificationNotSupportedError``).

A plan that comes to wait at a gate that asks (``input_schema`` or ``choices``) makes its task
``input-required`` (``GateWatch`` sees it through ``Watch``); its call
goes on, and the next message naming the task answers the gate (``_answer_gate``).
``ListTasks`` lists the caller's own tasks among those the agent answered over A2A lately
(authorized and audited as ``Plans``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from a2a.server.context import ServerCallContext
from a2a.server.events import Event
from a2a.server.request_handlers import RequestHandler
from a2a.types import (
    AgentCard as A2ACard,
)
from a2a.types import (
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskPushNotificationConfig,
    TaskState,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import (
    A2AError,
    ExtendedAgentCardNotConfiguredError,
    InvalidParamsError,
    PushNotificationNotSupportedError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from pydantic import ValidationError

from stratagem.protocol._a2a._asking import GateWatch, asked_at
from stratagem.protocol._a2a._reply import A2AReply, parts_of
from stratagem.protocol._a2a._tasks import (
    FINAL_STATES,
    TaskBook,
    a2a_error,
    failed_task,
    is_refusal,
    request_body,
    request_id_for,
    skill_of,
    state_of,
    task_id_for,
    task_of,
    value_of,
)
from stratagem.protocol._capabilities import CapabilitySpec, WireModel, capability_for
from stratagem.protocol._codec import decode_response, encode_call
from stratagem.protocol._errors import (
    InvalidArgumentError,
    NotFoundError,
    ProtocolUsageError,
    RemoteError,
)
from stratagem.protocol._models import (
    MAX_PLANS_PAGE,
    ControlRequest,
    GateInfo,
    PlanQuery,
    PlanSnapshot,
)
from stratagem.protocol._rpc import CAPABILITY_KEY, REQUEST_ID_KEY, TARGET_KEY
from stratagem.protocol._server import AgentServer, HttpCall
from stratagem.protocol._service import CONTROL, PLANS, WATCH

__all__ = ["HTTP_STATUS_KEY", "StratagemRequestHandler", "call_of"]

logger = logging.getLogger(__name__)

HTTP_STATUS_KEY: Final = "stratagem.a2a.http_status"
"""Where a handler leaves the HTTP status its refusal deserves (401, 403) for the route."""
# Headers that travel on as call metadata: credentials and W3C trace context. The caller's claimed
# identity only matters when authentication is off (the tests' ``CallerMetadataAuthenticator``).
_FORWARDED: Final = ("authorization", "traceparent", "tracestate", "x-stratagem-caller")
_HTTP_STATUS: Final = {"UNAUTHENTICATED": 401, "PERMISSION_DENIED": 403}
_LIST_LIMIT: Final = 100


@dataclass(frozen=True, slots=True)
class _Call:
    """A JSON-RPC request as the agent's RPCs see it: metadata and a transport context."""

    metadata: dict[str, str]
    context: HttpCall


def call_of(state: Mapping[str, Any], routing: Mapping[str, str] | None = None) -> _Call:
    """The call of a JSON-RPC request whose SDK context state is ``state``, with the routing
    metadata a gRPC client would send (``x-stratagem-target``, ...)."""
    headers: Mapping[str, str] = state.get("headers", {})
    metadata = {key: str(headers[key]) for key in _FORWARDED if key in headers}
    metadata.update({key: value for key, value in (routing or {}).items() if value})
    return _Call(metadata, HttpCall(str(state.get("peer", "unknown"))))


class StratagemRequestHandler(RequestHandler):
    """Serves one agent's A2A methods through its ``AgentServer``.

    Args:
        server: The agent's gRPC server (its pipeline serves every method).
        role: The agent's role.
        card: The agent's A2A card (its skills are the capabilities a message may name).
        tasks: The tasks answered lately (their artifacts for ``GetTask``).
        task_deadline_s: The deadline of a ``returnImmediately`` task's ``Call``, seconds.
    """

    def __init__(
        self,
        server: AgentServer,
        role: str,
        card: A2ACard,
        tasks: TaskBook,
        *,
        task_deadline_s: float = 3600.0,
    ) -> None:
        self._task_deadline_s = task_deadline_s
        self._server = server
        self._role = role
        self._card = card
        self._skills = [skill.id for skill in card.skills]
        self._tasks = tasks
        self._background: set[asyncio.Future[Task | Message]] = set()
        # The Call of each task whose plan waits at a gate that asks (``input-required``): a
        # follow-up message answers the gate and waits on it for what comes next.
        self._waiting: dict[str, _Waiting] = {}
        self._gates = GateWatch(server)

    # --- messages -----------------------------------------------------------------------------

    async def on_message_send(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> Task | Message:
        if params.message.task_id:
            answered = await self._answer_gate(params.message, context)
            if answered is not None:
                return answered
        prepared = await self._prepare(params.message, context)
        if params.configuration.return_immediately:
            # Nobody waits for the answer: the call runs under the task's own deadline, not the
            # one the server gives a caller that waits (the default, ~30 s).
            call = prepared.call
            prepared.call = _Call(
                call.metadata,
                HttpCall(call.context.peer(), deadline_s=self._task_deadline_s),
            )
            if self._tasks.get(prepared.task_id) is None:  # a repeat keeps the answer it has
                self._tasks.keep(
                    task_of(
                        prepared.task_id,
                        prepared.context_id,
                        TaskState.TASK_STATE_SUBMITTED,
                        history=prepared.history,
                    ),
                    prepared.caller,
                )
            finishing = asyncio.ensure_future(self._finish(prepared, context, background=True))
            self._background.add(finishing)
            finishing.add_done_callback(self._background.discard)
            return task_of(
                prepared.task_id,
                prepared.context_id,
                TaskState.TASK_STATE_SUBMITTED,
                history=[params.message],
            )
        return await self._finish(prepared, context)

    async def _finish(
        self, prepared: _Prepared, context: ServerCallContext, *, background: bool = False
    ) -> Task | Message:
        """The outcome of a message's ``Call``: its task, or the message an ``A2AReply`` asks
        to be answered with (its task is kept all the same, for ``GetTask``)."""
        calling = asyncio.ensure_future(self._call("Call", prepared.request, prepared.call))
        waiting = _Waiting(calling, prepared)
        call = call_of(context.state)
        gate = await self._gates.until_asked(prepared.task_id, call.metadata, call.context, calling)
        if gate is not None:
            return self._input_required(waiting, gate)
        return await self._outcome(waiting, context, background=background)

    async def _outcome(
        self, waiting: _Waiting, context: ServerCallContext, *, background: bool = False
    ) -> Task | Message:
        """The task (or message) a finished ``Call`` answers."""
        prepared = waiting.prepared
        result: WireModel | None = None
        try:
            answer = await waiting.calling
        except RemoteError as error:
            if is_refusal(error) and not background:
                _remember_status(context, error)
                raise a2a_error(error) from None
            # In the background nobody gets the error: the task keeps it (a refusal: rejected).
            task = failed_task(prepared.task_id, prepared.context_id, error, prepared.history)
            if is_refusal(error):
                task.status.state = TaskState.TASK_STATE_REJECTED
        else:
            result = decode_response(answer).body
            task = task_of(
                prepared.task_id,
                prepared.context_id,
                TaskState.TASK_STATE_COMPLETED,
                skill=prepared.spec.name,
                result=result,
                history=prepared.history,
            )
        self._tasks.keep(task, prepared.caller)
        if isinstance(result, A2AReply) and result.message:
            return Message(
                message_id=f"{task.id}:reply",
                context_id=task.context_id,
                task_id=task.id,
                role=Role.ROLE_AGENT,
                parts=parts_of(result),
            )
        return task

    def _input_required(self, waiting: _Waiting, gate: GateInfo) -> Task:
        """The task of a plan waiting at a gate that asks: ``input-required``, saying what the
        gate asks; its Call goes on, and the next message to the task answers the gate."""
        prepared = waiting.prepared
        task_id = prepared.task_id
        self._waiting[task_id] = waiting
        waiting.calling.add_done_callback(lambda _: self._forget(task_id, waiting))
        waiting.calling.add_done_callback(_retrieved)
        task = task_of(
            task_id,
            prepared.context_id,
            TaskState.TASK_STATE_INPUT_REQUIRED,
            note=gate.prompt or f"the plan waits for input at gate {gate.gate_id}",
            history=prepared.history,
        )
        self._tasks.keep(task, prepared.caller)
        return task

    def _forget(self, task_id: str, waiting: _Waiting) -> None:
        if self._waiting.get(task_id) is waiting:
            del self._waiting[task_id]

    async def _asking_gate(self, task_id: str, context: ServerCallContext) -> GateInfo | None:
        """The gate that asks at which the task's plan waits now (its snapshot, through
        ``Plans``), if any."""
        snapshot = await self._snapshot(task_id, context)
        return asked_at(snapshot)

    async def _answer_gate(
        self, message: Message, context: ServerCallContext
    ) -> Task | Message | None:
        """A message to a task whose plan waits at a gate that asks: the gate approved with the
        message's content as its value (through ``Control``, authorized as ``Control.approve``
        and checked against the gate's schema and deciders as the CLI's approval is), then what
        the task does next (``None``: the task waits for no input; the message is refused as
        before)."""
        task_id = message.task_id
        await self._hide_others(task_id, PLANS.name, _plans_query(task_id), context)
        gate = await self._asking_gate(task_id, context)
        if gate is None:
            return None
        if not message.message_id:
            raise InvalidParamsError(message="the message needs a messageId")
        try:
            control = ControlRequest.build(
                task_id,
                "approve",
                gate_id=gate.gate_id,
                value=value_of(message),
                rationale=f"A2A message {message.message_id}",
            )
        except ValueError as exc:  # a pydantic ValidationError, or a value that is not JSON
            raise InvalidParamsError(message=f"the answer does not fit: {exc}"[:500]) from None
        call = call_of(context.state, {CAPABILITY_KEY: "Control.approve"})
        try:
            await self._call(CONTROL.name, CONTROL.encode_request(control), call)
        except RemoteError as error:
            _remember_status(context, error)
            raise a2a_error(error, task_id=task_id) from None
        kept = self._tasks.get(task_id)
        history = [*(kept.history if kept is not None else []), message]
        waiting = self._waiting.get(task_id)
        if waiting is None:  # its Call is not here (answered in the background, or gone)
            task = await self.on_get_task(GetTaskRequest(id=task_id), context)
            assert task is not None
            del task.history[:]
            task.history.extend(history)
            return task
        waiting.prepared.history = history
        plain = call_of(context.state)
        asked = await self._gates.until_asked(
            task_id, plain.metadata, plain.context, waiting.calling, answered=gate.gate_id
        )
        if asked is not None:
            return self._input_required(waiting, asked)
        return await self._outcome(waiting, context)

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        prepared = await self._prepare(params.message, context)
        task_id, context_id = prepared.task_id, prepared.context_id
        calling = asyncio.ensure_future(self._call("Call", prepared.request, prepared.call))
        try:
            yield task_of(
                task_id, context_id, TaskState.TASK_STATE_SUBMITTED, history=prepared.history
            )
            async for event in self._progress(task_id, context_id, context, until=calling):
                yield event
            try:
                answer = await calling
            except RemoteError as error:
                if is_refusal(error):
                    raise a2a_error(error) from None
                task = failed_task(task_id, context_id, error, prepared.history)
            else:
                task = task_of(
                    task_id,
                    context_id,
                    TaskState.TASK_STATE_COMPLETED,
                    skill=prepared.spec.name,
                    result=decode_response(answer).body,
                    history=prepared.history,
                )
                for artifact in task.artifacts:
                    yield TaskArtifactUpdateEvent(
                        task_id=task_id, context_id=context_id, artifact=artifact, last_chunk=True
                    )
            self._tasks.keep(task, prepared.caller)
            yield TaskStatusUpdateEvent(task_id=task_id, context_id=context_id, status=task.status)
        finally:
            if not calling.done():
                # The reader went away: the request goes on (as a gRPC call whose client left
                # would not), so its outcome is still stored and a repeat is answered from it.
                calling.add_done_callback(_retrieved)

    async def _progress(
        self,
        task_id: str,
        context_id: str,
        context: ServerCallContext,
        *,
        until: asyncio.Future[Any] | None = None,
    ) -> AsyncIterator[TaskStatusUpdateEvent]:
        """The plan's events as working-status updates (through ``Watch``), until the plan ends
        or ``until`` is done; a caller the policy denies ``Watch`` gets none."""
        call = call_of(context.state)
        events = self._server.stream_foreign(
            WATCH.name,
            WATCH.encode_request(PlanQuery(plan_id=task_id)),
            call.metadata,
            call.context,
        )
        upcoming: asyncio.Future[bytes] | None = None
        try:
            while True:
                if upcoming is None:
                    upcoming = asyncio.ensure_future(anext(events))
                waiting: set[asyncio.Future[Any]] = {upcoming}
                if until is not None:
                    waiting.add(until)
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if not upcoming.done():
                    break  # the call ended: its outcome is the final event
                try:
                    raw = upcoming.result()
                except (StopAsyncIteration, RemoteError):
                    break
                upcoming = None
                event = WATCH.decode_response(raw)
                state = (
                    state_of(event.status) if not event.step_id else TaskState.TASK_STATE_WORKING
                )
                if state in FINAL_STATES:
                    break  # said by the final status update, with the result
                what = f"step {event.step_id} {event.status}" if event.step_id else event.status
                note = f"{what}: {event.message}" if event.message else what
                yield TaskStatusUpdateEvent(
                    task_id=task_id,
                    context_id=context_id,
                    # When the plan's event happened: every reader of it is told the same.
                    status=task_of(
                        task_id, context_id, state, note=note, at=event.timestamp
                    ).status,
                )
        finally:
            if upcoming is not None and not upcoming.done():
                upcoming.cancel()
                with contextlib.suppress(BaseException):
                    await upcoming
            await events.aclose()

    # --- tasks --------------------------------------------------------------------------------

    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        await self._hide_others(params.id, PLANS.name, _plans_query(params.id), context)
        kept = self._tasks.get(params.id)
        try:
            snapshot: PlanSnapshot | None = await self._snapshot(params.id, context)
        except TaskNotFoundError:
            if kept is None:
                raise
            snapshot = None  # not started yet, or rejected before its plan existed
        if snapshot is None or (
            kept is not None and kept.status.state == state_of(snapshot.status)
        ):
            assert kept is not None
            task = Task()
            task.CopyFrom(kept)
        else:
            state = state_of(snapshot.status)
            context_id = kept.context_id if kept is not None else params.id
            history = list(kept.history) if kept is not None else []
            task = task_of(
                params.id, context_id, state, note=_why(state, snapshot, kept), history=history
            )
        if params.HasField("history_length"):
            keep = max(0, params.history_length)
            del task.history[: max(0, len(task.history) - keep)]
        return task

    async def _snapshot(self, task_id: str, context: ServerCallContext) -> PlanSnapshot:
        try:
            if not task_id:
                raise ProtocolUsageError("no task id")
            query = PLANS.build(plan_id=task_id, page_size=1)
        except ProtocolUsageError:
            raise TaskNotFoundError(message=f"no task {task_id[:200]!r} on this agent") from None
        try:
            answer = await self._call(
                PLANS.name, PLANS.encode_request(query), call_of(context.state)
            )
        except RemoteError as error:
            _remember_status(context, error)
            raise a2a_error(error, task_id=task_id) from None
        for snapshot in PLANS.decode_response(answer).plans:
            if snapshot.plan_id == task_id:
                return snapshot
        raise TaskNotFoundError(message=f"no task {task_id[:200]!r} on this agent")

    async def on_cancel_task(
        self, params: CancelTaskRequest, context: ServerCallContext
    ) -> Task | None:
        try:
            control = ControlRequest(plan_id=params.id, action="cancel")
        except ValidationError:
            raise TaskNotFoundError(message=f"no task {params.id[:200]!r} on this agent") from None
        await self._hide_others(params.id, CONTROL.name, CONTROL.encode_request(control), context)
        call = call_of(context.state, {CAPABILITY_KEY: "Control.cancel"})
        try:
            answer = await self._call(CONTROL.name, CONTROL.encode_request(control), call)
        except RemoteError as error:
            _remember_status(context, error)
            raise a2a_error(error, task_id=params.id) from None
        snapshot = CONTROL.decode_response(answer)
        kept = self._tasks.get(params.id)
        context_id = kept.context_id if kept is not None else params.id
        state = state_of(snapshot.status)
        note = ""
        if state == TaskState.TASK_STATE_CANCELED:
            note = f"cancelled by {self._caller_of(call) or 'a caller'} (CancelTask)"
        task = task_of(
            params.id,
            context_id,
            state,
            note=note,
            history=list(kept.history) if kept is not None else [],
        )
        self._tasks.keep(task)
        return task

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        task = await self.on_get_task(GetTaskRequest(id=params.id), context)
        assert task is not None
        if task.status.state in FINAL_STATES:
            raise UnsupportedOperationError(
                message=f"task {params.id!r} has ended ({TaskState.Name(task.status.state)})"
            )
        yield task
        async for event in self._progress(task.id, task.context_id, context):
            yield event
        final = await self.on_get_task(GetTaskRequest(id=params.id), context)
        assert final is not None
        yield TaskStatusUpdateEvent(
            task_id=final.id, context_id=final.context_id, status=final.status
        )

    async def on_list_tasks(
        self, params: ListTasksRequest, context: ServerCallContext
    ) -> ListTasksResponse:
        """The caller's own A2A tasks the agent remembers, most recently updated first, a page at
        a time; authorized (and audited) as ``Plans``, whose snapshots give their states."""
        call = call_of(context.state)
        try:
            answer = await self._call(
                PLANS.name, PLANS.encode_request(PLANS.build(page_size=MAX_PLANS_PAGE)), call
            )
        except RemoteError as error:
            _remember_status(context, error)
            raise a2a_error(error) from None
        states = {p.plan_id: state_of(p.status) for p in PLANS.decode_response(answer).plans}
        tasks = []
        for kept in self._tasks.owned_by(self._caller_of(call)):
            task = Task()
            task.CopyFrom(kept)
            if task.id in states and states[task.id] != task.status.state:
                task.status.state = states[task.id]
            tasks.append(task)
        if params.context_id:
            tasks = [task for task in tasks if task.context_id == params.context_id]
        if params.status != TaskState.TASK_STATE_UNSPECIFIED:
            tasks = [task for task in tasks if task.status.state == params.status]
        if params.HasField("status_timestamp_after"):
            after = params.status_timestamp_after.ToNanoseconds()
            tasks = [task for task in tasks if task.status.timestamp.ToNanoseconds() > after]
        if not params.page_token:
            start = 0
        elif params.page_token.isdigit() and int(params.page_token) <= len(tasks):
            start = int(params.page_token)
        else:
            raise InvalidParamsError(message=f"invalid pageToken {params.page_token[:40]!r}")
        size = params.page_size if params.HasField("page_size") and params.page_size > 0 else 50
        if size > _LIST_LIMIT:
            raise InvalidParamsError(message=f"pageSize is at most {_LIST_LIMIT}")
        page = tasks[start : start + size]
        for task in page:
            if not params.include_artifacts:
                del task.artifacts[:]
            if params.HasField("history_length"):
                del task.history[: max(0, len(task.history) - max(0, params.history_length))]
        following = start + len(page)
        return ListTasksResponse(
            tasks=page,
            next_page_token=str(following) if following < len(tasks) else "",
            page_size=size,
            total_size=len(tasks),
        )

    # --- what is not offered ------------------------------------------------------------------

    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_list_task_push_notification_configs(
        self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> ListTaskPushNotificationConfigsResponse:
        raise PushNotificationNotSupportedError

    async def on_delete_task_push_notification_config(
        self, params: DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        raise PushNotificationNotSupportedError

    async def on_get_extended_agent_card(
        self, params: GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> A2ACard:
        raise ExtendedAgentCardNotConfiguredError

    # --- through the agent's pipeline ---------------------------------------------------------

    async def _call(self, method: str, request: bytes, call: _Call) -> bytes:
        """One unary RPC of the agent's, through its gRPC server's stages."""
        return await self._server.serve_foreign(method, request, call.metadata, call.context)

    async def _hide_others(
        self, task_id: str, method: str, request: bytes, context: ServerCallContext
    ) -> None:
        """Answer "not found" for a task another identity asked for, as for one that does not
        exist (its existence is not told); the refusal is audited as ``NOT_FOUND`` under the
        verified caller, after authentication and authorization, as the method's would be.

        Raises:
            TaskNotFoundError: The task is someone else's.
        """
        owner = self._tasks.owner(task_id)
        if owner is None:
            return
        call = call_of(context.state)
        if self._caller_of(call) == owner:
            return
        missing = TaskNotFoundError(message=f"no task {task_id[:200]!r} on this agent")
        try:
            await self._server.serve_foreign(
                method, request, call.metadata, call.context, refusal=NotFoundError(missing.message)
            )
        except RemoteError as error:
            if not isinstance(error, NotFoundError):
                _remember_status(context, error)
                raise a2a_error(error, task_id=task_id) from None
        raise missing

    def _caller_of(self, call: _Call) -> str:
        """Who the call's credentials name ("": nobody verified; the stages refuse it then)."""
        try:
            return self._server.authenticate(call.metadata, call.context)
        except RemoteError:
            return ""

    # --- a message becomes a Call ---------------------------------------------------------------

    async def _prepare(self, message: Message, context: ServerCallContext) -> _Prepared:
        """The ``Call`` a message stands for; a message that cannot be one is refused through
        the pipeline (audited after authentication and authorization)."""
        skill = ""
        try:
            if message.task_id:
                # A task is one request's plan: it takes no further messages.
                await self._hide_others(
                    message.task_id, PLANS.name, _plans_query(message.task_id), context
                )
                await self._snapshot(message.task_id, context)
                raise UnsupportedOperationError(
                    message=f"task {message.task_id!r} takes no further messages; send a new one"
                )
            skill = skill_of(message, self._skills)
            spec = capability_for(self._role, skill)
            if spec is None:
                raise InvalidParamsError(message=f"{self._role} does not serve {skill!r}")
            if not message.message_id:
                raise InvalidParamsError(message="the message needs a messageId")
            body = request_body(message, spec)
        except A2AError as refusal:
            call = call_of(context.state, {TARGET_KEY: self._role, CAPABILITY_KEY: skill})
            try:
                await self._server.serve_foreign(
                    "Call",
                    b"",
                    call.metadata,
                    call.context,
                    refusal=InvalidArgumentError(refusal.message),
                )
            except RemoteError as error:
                if not isinstance(error, InvalidArgumentError):
                    _remember_status(context, error)
                    raise a2a_error(error) from None
            raise
        request_id = request_id_for(message.message_id)
        call = call_of(
            context.state,
            {TARGET_KEY: self._role, CAPABILITY_KEY: spec.name, REQUEST_ID_KEY: request_id},
        )
        caller = self._caller_of(call)
        task_id = task_id_for(caller, message.message_id)
        request = b""
        if caller:
            request = encode_call(
                spec,
                request_id=request_id,
                caller=caller,
                target=self._role,
                plan_id=task_id,
                step_id="",
                body=body,
            )
        # Without a verified caller the pipeline refuses the call before reading its body.
        return _Prepared(
            spec, call, request, task_id, message.context_id or task_id, [message], caller
        )


class _Prepared:
    """A message made into a ``Call``."""

    __slots__ = ("call", "caller", "context_id", "history", "request", "spec", "task_id")

    def __init__(
        self,
        spec: CapabilitySpec,
        call: _Call,
        request: bytes,
        task_id: str,
        context_id: str,
        history: list[Message],
        caller: str,
    ) -> None:
        self.caller = caller
        self.spec = spec
        self.call = call
        self.request = request
        self.task_id = task_id
        self.context_id = context_id
        self.history = history


class _Waiting:
    """A message's ``Call``, running, and the message made into it."""

    __slots__ = ("calling", "prepared")

    def __init__(self, calling: asyncio.Future[bytes], prepared: _Prepared) -> None:
        self.calling = calling
        self.prepared = prepared


def _plans_query(task_id: str) -> bytes:
    """A ``Plans`` request for ``task_id`` (what a refusal of a read of the task records)."""
    try:
        return PLANS.encode_request(PLANS.build(plan_id=task_id, page_size=1))
    except ProtocolUsageError:
        return b""


def _why(state: TaskState, snapshot: PlanSnapshot, kept: Task | None) -> str:
    """The status message of a task whose plan ended without success: why, from the reason the
    task was given when its call ended (kept), else the plan's last status line."""
    if state not in (TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_CANCELED):
        return ""
    if kept is not None and kept.status.state in FINAL_STATES:
        told = "".join(part.text for part in kept.status.message.parts)
        if told:
            return told
    return snapshot.message or f"the task's plan ended {snapshot.status}; no reason was recorded"


def _remember_status(context: ServerCallContext, error: RemoteError) -> None:
    """Leave the HTTP status a refusal deserves where the route finds it."""
    status = _HTTP_STATUS.get(error.code.value)
    holder = context.state.get(HTTP_STATUS_KEY)
    if status is not None and isinstance(holder, dict):
        holder["status"] = status


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
