"""The ``AgentService`` RPCs, one declaration each: the table the rest derives from.

Each ``RpcSpec`` names an RPC of ``proto/stratagem/v1/agent.proto`` and declares what differs from
one RPC to the next:

- its protobuf messages and the pydantic models they carry (``messages``, ``request``,
  ``response``), from which its codec follows (``encode_request``, ``decode_response``...);
- its authorization class: ``access`` (``read`` RPCs make ``READ_RPCS``) and ``authorized_as``,
  the (pseudo-)capability the policy is asked about: the RPC's own name, ``Control.{action}`` for
  one per action (named in the capability metadata, so authorization precedes decoding), or
  ``{capability}`` for ``Call`` (the capability it calls);
- whether it waits for one of the server's request slots (``queued``) or is counted apart;
- what answers it: ``serve`` (unary) or ``stream`` (server-streaming), small functions of the
  ``AgentBackend``; ``Call``'s is the capability's own handler, behind the server's call pipeline
  (idempotency and the answer store);
- what its audit records and client add: ``accepted`` (the ``call.accepted`` detail), ``what``
  (how a deadline error names it), ``request_id`` (the client sends a fresh request id with this
  prefix, so the call is audited under it).

The server registers one generic handler per entry, the client's methods are one call each of
``AgentClient._rpc`` with the entry, and ``tests/unit/protocol/test_service.py`` fails when the
table and the .proto's service disagree. Adding an RPC: its messages in the .proto, its models in
``_models.py``, an entry here with its handler, its ``AgentBackend`` method, a client method.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final, Generic, Literal, Protocol, TypeVar

from google.protobuf.message import Message
from pydantic import ValidationError

from stratagem.protocol._capabilities import WireModel
from stratagem.protocol._codec import decode, encode, violations_from
from stratagem.protocol._context import CallContext
from stratagem.protocol._errors import ProtocolUsageError
from stratagem.protocol._gen.stratagem.v1 import agent_pb2 as pb
from stratagem.protocol._models import (
    AgentCard,
    ControlRequest,
    NoQuery,
    PlanEvent,
    PlanQuery,
    PlanSnapshot,
    PlansPage,
    PlansQuery,
    ReplayResult,
    RequestEnvelope,
    ResponseEnvelope,
    RevisionsResponse,
    RunPlanRequest,
)

__all__ = [
    "CALL",
    "CONTROL",
    "DESCRIBE",
    "PLANS",
    "REPLAY",
    "REVISIONS",
    "RPCS",
    "RUN_PLAN",
    "WATCH",
    "AgentBackend",
    "RpcSpec",
    "Serving",
    "decode_card",
    "decode_event",
    "decode_plans",
    "decode_query",
    "encode_card",
    "encode_event",
    "encode_plans",
    "encode_query",
    "plan_detail",
]

# What a Plans page leaves free of its message limit.
_PAGE_HEADROOM: Final = 4096

Req = TypeVar("Req", bound=WireModel)
Resp = TypeVar("Resp", bound=WireModel)


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

    async def run_plan(
        self, plan_json: str, ctx: CallContext, *, until_blocked: bool = False
    ) -> PlanSnapshot:
        """Validate a user's plan against this agent's registry, run it, return its final state
        (or, ``until_blocked``, its state once it waits at a gate)."""
        ...

    def plans(self, plan_id: str) -> list[PlanSnapshot]:
        """Snapshots of the plan and its sub-plans, or of every plan for ""; must not block."""
        ...

    async def history(self, query: PlansQuery, max_bytes: int) -> PlansPage:
        """One page of the agent's plans as ``query`` asks (``Plans``), at most ``max_bytes``."""
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
class Serving(Generic[Req]):
    """What an RPC's handler is given.

    Attributes:
        backend: The agent served.
        request: The decoded, validated request.
        call: The call (also ``current_call`` while a unary handler runs).
        max_message_bytes: The server's message limit (a response past it is refused).
    """

    backend: AgentBackend
    request: Req
    call: CallContext
    max_message_bytes: int


def plan_detail(request: WireModel, caller: str) -> str:
    """The ``call.accepted`` detail of a request about a plan: ``plan <id>``, or "" for none."""
    plan_id = getattr(request, "plan_id", "")
    return f"plan {plan_id}" if plan_id else ""


@dataclass(frozen=True, slots=True)
class RpcSpec(Generic[Req, Resp]):
    """One ``AgentService`` RPC (see the module docstring for what derives from it).

    Attributes:
        name: The method's name in the service, e.g. ``"Plans"``.
        messages: Its request and response protobuf classes.
        request: The model of its request.
        response: The model of its response (of each streamed message).
        access: ``read`` (it changes nothing: ``READ_RPCS``) or ``write``.
        authorized_as: The capability the policy is asked about; ``{field}`` stands for that
            field of the request (``Control.{action}``; ``{capability}`` for ``Call``).
        queued: Whether a call waits for one of the server's request slots; a stream that is
            not is counted against ``ServerConfig.max_watch_streams`` instead.
        serve: Answers a unary call: the response and the outcome record's detail ("" for the
            answer's size). ``None`` with no ``stream`` too: ``Call``'s capability handler.
        stream: Answers a server-streaming call, one response a message.
        accepted: The ``call.accepted`` record's detail, from the request and the caller.
        what: How a deadline error names the call ("<what> did not finish within ..."); the
            RPC's name when ``None``.
        request_id: The prefix of a fresh request id the client sends (``<prefix>-<hex>``); ""
            for none.
    """

    name: str
    messages: tuple[type[Message], type[Message]]
    request: type[Req]
    response: type[Resp]
    access: Literal["read", "write"]
    authorized_as: str
    queued: bool = True
    serve: Callable[[Serving[Req]], Awaitable[tuple[Resp, str]]] | None = None
    stream: Callable[[Serving[Req]], AsyncIterator[Resp]] | None = None
    accepted: Callable[[Req, str], str] = plan_detail
    what: Callable[[Req], str] | None = None
    request_id: str = ""

    @property
    def streaming(self) -> bool:
        """Whether the response is a stream (``rpc ... returns (stream ...)``)."""
        return self.stream is not None

    @property
    def action(self) -> str:
        """The request field the authorized capability names ("" when it is a fixed name)."""
        _, brace, rest = self.authorized_as.partition("{")
        return rest.rstrip("}") if brace else ""

    def authorization(self, request: Req) -> str:
        """The capability the policy is asked about for ``request``, e.g. ``Control.approve``."""
        action = self.action
        if not action:
            return self.authorized_as
        return self.authorized_as.replace(f"{{{action}}}", str(getattr(request, action)))

    def described(self, request: Req) -> str:
        """How a deadline error names the call (``what``)."""
        return self.name if self.what is None else self.what(request)

    def build(self, **fields: Any) -> Req:
        """A request model from a client's arguments.

        Raises:
            ProtocolUsageError: Naming each field that breaks its constraint.
        """
        try:
            return self.request(**fields)
        except ValidationError as exc:
            problems = "; ".join(f"{v.field}: {v.description}" for v in violations_from(exc))
            raise ProtocolUsageError(f"invalid {self.name} request: {problems}") from None

    def encode_request(self, request: Req) -> bytes:
        """The request as bytes of its message."""
        return encode(request, self.messages[0])

    def decode_request(self, data: bytes) -> Req:
        """Parse and validate a request (``InvalidArgumentError`` naming the fields)."""
        return decode(data, self.messages[0], self.request)

    def encode_response(self, response: Resp) -> bytes:
        """The response (one streamed message) as bytes of its message."""
        return encode(response, self.messages[1])

    def decode_response(self, data: bytes) -> Resp:
        """Parse and validate a response (``InvalidArgumentError`` naming the fields)."""
        return decode(data, self.messages[1], self.response)


# --- the handlers -------------------------------------------------------------------------------


async def _describe(serving: Serving[NoQuery]) -> tuple[AgentCard, str]:
    return serving.backend.card(), ""


def _watch(serving: Serving[PlanQuery]) -> AsyncIterator[PlanEvent]:
    return serving.backend.watch(serving.request.plan_id)


async def _plans(serving: Serving[PlansQuery]) -> tuple[PlansPage, str]:
    query = serving.request
    page = await serving.backend.history(query, serving.max_message_bytes)
    # A page ends before its bytes would pass the message limit (the agent cuts step values to
    # fit already; this holds for any backend whose snapshots carry cursors).
    budget = serving.max_message_bytes - _PAGE_HEADROOM
    used = 0
    for kept, snapshot in enumerate(page.plans):
        used += snapshot.size_hint()
        if kept and used > budget and page.plans[kept - 1].cursor:
            page = PlansPage(
                plans=page.plans[:kept],
                next_page_token=page.plans[kept - 1].cursor,
                unreadable=page.unreadable,
            )
            break
    more = "more follow" if page.next_page_token else "the last page"
    summary = f"{len(page.plans)} plans ({query.view or 'plans'}), {more}"
    return page, summary


async def _run_plan(serving: Serving[RunPlanRequest]) -> tuple[PlanSnapshot, str]:
    request = serving.request
    snapshot = await serving.backend.run_plan(
        request.plan_json, serving.call, until_blocked=request.until_blocked
    )
    return snapshot, f"plan {snapshot.plan_id} {snapshot.status}"


def _control_detail(control: ControlRequest, caller: str) -> str:
    described = f"plan {control.plan_id} {control.action}"
    if control.action in ("approve", "reject"):
        # The approver is the verified caller (the record's actor); the rationale is redacted
        # with the rest of the detail by the audit log.
        return (
            f"{described} gate {control.gate_id} by {caller}"
            + (" (recorded as done)" if control.output_json else "")
            + f": {control.rationale}"
        )
    if control.action == "replan":
        return f"{described} by {caller}: {control.rationale}"
    return described


async def _control(serving: Serving[ControlRequest]) -> tuple[PlanSnapshot, str]:
    snapshot = await serving.backend.control(serving.request, serving.call)
    described = _control_detail(serving.request, serving.call.caller)
    return snapshot, f"{described} -> {snapshot.status}"


async def _replay(serving: Serving[PlanQuery]) -> tuple[ReplayResult, str]:
    plan_id = serving.request.plan_id
    result = await serving.backend.replay(plan_id, serving.call)
    summary = (
        f"plan {plan_id} revision {result.revision} replayed: {result.decisions} "
        f"decisions, {len(result.divergences)} diverged"
    )
    return result, summary


async def _revisions(serving: Serving[PlanQuery]) -> tuple[RevisionsResponse, str]:
    plan_id = serving.request.plan_id
    response = await serving.backend.revisions(plan_id)
    return response, f"plan {plan_id}: {len(response.revisions)} revisions"


# --- the table ----------------------------------------------------------------------------------

CALL: Final = RpcSpec(
    "Call",
    (pb.AgentRequest, pb.AgentResponse),
    RequestEnvelope,
    ResponseEnvelope,
    access="write",
    authorized_as="{capability}",
)
DESCRIBE: Final = RpcSpec(
    "Describe",
    (pb.DescribeRequest, pb.AgentCard),
    NoQuery,
    AgentCard,
    access="read",
    authorized_as="Describe",
    serve=_describe,
)
WATCH: Final = RpcSpec(
    "Watch",
    (pb.WatchRequest, pb.PlanEvent),
    PlanQuery,
    PlanEvent,
    access="read",
    authorized_as="Watch",
    queued=False,
    stream=_watch,
)
PLANS: Final = RpcSpec(
    "Plans",
    (pb.PlansRequest, pb.PlansResponse),
    PlansQuery,
    PlansPage,
    access="read",
    authorized_as="Plans",
    serve=_plans,
)
RUN_PLAN: Final = RpcSpec(
    "RunPlan",
    (pb.RunPlanRequest, pb.PlanSnapshot),
    RunPlanRequest,
    PlanSnapshot,
    access="write",
    authorized_as="RunPlan",
    serve=_run_plan,
    what=lambda _: "the plan",
    request_id="run",
)
CONTROL: Final = RpcSpec(
    "Control",
    (pb.ControlRequest, pb.PlanSnapshot),
    ControlRequest,
    PlanSnapshot,
    access="write",
    authorized_as="Control.{action}",
    serve=_control,
    accepted=_control_detail,
    what=lambda control: f"{control.action} {control.plan_id}",
    request_id="control",
)
REPLAY: Final = RpcSpec(
    "Replay",
    (pb.ReplayRequest, pb.ReplayResult),
    PlanQuery,
    ReplayResult,
    access="write",
    authorized_as="Replay",
    serve=_replay,
    accepted=lambda query, _: f"plan {query.plan_id} replay",
    what=lambda query: f"replay {query.plan_id}",
    request_id="replay",
)
REVISIONS: Final = RpcSpec(
    "Revisions",
    (pb.RevisionsRequest, pb.RevisionsResponse),
    PlanQuery,
    RevisionsResponse,
    access="read",
    authorized_as="Revisions",
    serve=_revisions,
    what=lambda query: f"revisions of {query.plan_id}",
)

RPCS: Final[dict[str, RpcSpec[Any, Any]]] = {
    spec.name: spec for spec in (CALL, DESCRIBE, WATCH, PLANS, RUN_PLAN, CONTROL, REPLAY, REVISIONS)
}
"""Every ``AgentService`` RPC by name, in the order the .proto declares them."""


# --- shorthands of the codec ----------------------------------------------------------------------


def encode_card(card: AgentCard) -> bytes:
    """Serialize an agent card to ``stratagem.v1.AgentCard`` bytes."""
    return DESCRIBE.encode_response(card)


def decode_card(data: bytes) -> AgentCard:
    """Parse and validate ``stratagem.v1.AgentCard`` bytes (``InvalidArgumentError`` when bad)."""
    return DESCRIBE.decode_response(data)


def encode_event(event: PlanEvent) -> bytes:
    """Serialize a plan event to ``stratagem.v1.PlanEvent`` bytes."""
    return WATCH.encode_response(event)


def decode_event(data: bytes) -> PlanEvent:
    """Parse and validate ``stratagem.v1.PlanEvent`` bytes (``InvalidArgumentError`` when bad)."""
    return WATCH.decode_response(data)


def encode_plans(snapshots: Iterable[PlanSnapshot], next_page_token: str = "") -> bytes:
    """Serialize plan snapshots (one page) to ``stratagem.v1.PlansResponse`` bytes."""
    return PLANS.encode_response(PlansPage(plans=list(snapshots), next_page_token=next_page_token))


def decode_plans(data: bytes) -> list[PlanSnapshot]:
    """Parse and validate ``stratagem.v1.PlansResponse`` bytes (``InvalidArgumentError``); the
    page's snapshots."""
    return PLANS.decode_response(data).plans


def encode_query(rpc: str, plan_id: str = "") -> bytes:
    """The request of a read RPC or ``Replay`` asking about ``plan_id`` ("" for none).

    Raises:
        ProtocolUsageError: When ``plan_id`` is malformed, or given to ``Describe``.
    """
    spec = RPCS[rpc]
    return spec.encode_request(spec.build(**({"plan_id": plan_id} if plan_id else {})))


def decode_query(rpc: str, data: bytes) -> str:
    """The plan id a request of a read RPC or ``Replay`` asks about ("" for ``Describe``).

    Raises:
        InvalidArgumentError: Unparseable bytes or a malformed ``plan_id``.
    """
    return str(getattr(RPCS[rpc].decode_request(data), "plan_id", ""))
