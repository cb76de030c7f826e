"""Fuzzing the server pipeline with hypothesis, over real sockets, against one long-lived server.

One ``AgentServer`` (token authentication, the shipped policy, the fake strategic backend) runs on
an event loop in a background thread for the whole module; each example is one blocking gRPC call
from the test's thread, with a timeout, so a hang fails the example instead of the run. Inputs:

- random bytes as the body of every RPC;
- well-formed envelopes with one value out of range (negative or too large counts, empty, too long
  or malformed strings, too many list items, bad ids, an envelope that disagrees with the call);
- huge strings, beyond ``max_message_bytes`` and beyond the transport's own limit;
- valid envelopes with unknown fields appended (at the top and inside the body);
- random metadata: missing or garbage caller, capability, target, authorization, delegation,
  schema version and request id, with an oracle that walks the pipeline's stages in order.

Every call must end with a status within its timeout, never ``UNKNOWN`` or ``INTERNAL``, with the
exact code the input calls for; each call that reaches the pipeline leaves exactly one final audit
record with that code. The last test checks the agent still serves a well-formed call.

``STRATAGEM_FUZZ_EXAMPLES`` is the total number of examples across the module (200 by default, a
few seconds). ``make fuzz`` asks for 130,000, which make over 100,000 distinct calls: hypothesis
counts a repeated input as an example without calling again. The module prints how many calls it
made. Examples found failing are kept in ``.hypothesis/``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase

from stratagem.protocol import (
    AUTHORIZATION_KEY,
    OPERATOR,
    AgentServer,
    ClusterSecret,
    InvalidArgumentError,
    Policy,
    RequestEnvelope,
    ServerConfig,
    TokenAuthenticator,
    TokenSigner,
    WireModel,
    capability_for,
    decode_response,
    encode_request,
    roles,
)
from stratagem.protocol._audit import AuditRecord
from stratagem.protocol._gen.stratagem.v1 import agent_pb2 as pb
from stratagem.protocol._models import IDENTITY_PATTERN, control_capability
from stratagem.protocol._rpc import (
    CALLER_KEY,
    CAPABILITY_KEY,
    DELEGATION_KEY,
    REQUEST_ID_KEY,
    TARGET_KEY,
    VERSION_KEY,
    method_path,
)
from stratagem.protocol._service import CONTROL, RUN_PLAN, decode_query
from tests.integration.protocol.test_security import _with_claims
from tests.unit.protocol._support import SAMPLES, FakeBackend, model_strategy

pytestmark = pytest.mark.integration

ROLE: Final = "strategic"
MAX_BYTES: Final = 32 * 1024
# The server sets the transport's limit this many times above its own (protocol._server).
TRANSPORT_LIMIT: Final = 4 * MAX_BYTES
CALL_TIMEOUT_S: Final = 10.0
HOPS: Final = 8
_TOTAL = int(os.environ.get("STRATAGEM_FUZZ_EXAMPLES", "200"))
# A huge message costs up to half a second on the wire and its inputs vary in little but size:
# that test gets 1% of the total (at least 5); the other five share the rest, rounded up.
HUGE_EXAMPLES: Final = max(5, _TOTAL // 100)
EXAMPLES: Final = max(1, -(-(_TOTAL - HUGE_EXAMPLES) // 5))
_ROOT: Final = Path(__file__).resolve().parents[3]

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=False,
    database=DirectoryBasedExampleDatabase(str(_ROOT / ".hypothesis" / "examples")),
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
        HealthCheck.function_scoped_fixture,
    ],
)

_IDENTITY: Final = re.compile(IDENTITY_PATTERN)
NEVER: Final = frozenset({grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL})
OK: Final = grpc.StatusCode.OK
INVALID: Final = grpc.StatusCode.INVALID_ARGUMENT
EXHAUSTED: Final = grpc.StatusCode.RESOURCE_EXHAUSTED
UNAUTHENTICATED: Final = grpc.StatusCode.UNAUTHENTICATED
DENIED: Final = grpc.StatusCode.PERMISSION_DENIED
NOT_FOUND: Final = grpc.StatusCode.NOT_FOUND
PRECONDITION: Final = grpc.StatusCode.FAILED_PRECONDITION
STRATEGIC_CAPABILITIES: Final = ("AnalyzeNarrative", "PlanNarrativeArc")
# Identities with a valid token: allowed everything, allowed the two strategic capabilities,
# allowed only Describe, and named in no rule at all.
IDENTITIES: Final = ("operator", "orchestrator", "perception", "stranger")
FINAL_ACTIONS: Final = frozenset({"call.outcome", "call.refused", "call.denied", "call.replayed"})
POLICY: Final = Policy.default()


# --- the long-lived server ----------------------------------------------------------------------


class _Tally:
    """An audit log keeping only what the fuzz checks (action, code), so 100,000 cases stay small.

    Appended to from the server's loop thread, read from the test's thread after each call.
    """

    def __init__(self) -> None:
        self.entries: list[tuple[str, str]] = []

    def append(
        self,
        *,
        actor: str,
        action: str,
        target: str = "",
        capability: str = "",
        request_id: str = "",
        code: str = "",
        detail: str = "",
        digest: str = "",
    ) -> AuditRecord:
        self.entries.append((action, code))
        fields = (actor, action, target, capability, request_id, code, detail, digest)
        return AuditRecord(len(self.entries), "", *fields, "", "")

    async def append_async(self, **fields: str) -> AuditRecord:
        return self.append(**fields)

    def records(self) -> Iterator[AuditRecord]:
        return iter(())

    def head(self) -> str:
        return ""


class _Errors(logging.Handler):
    """Counts what the server logs at ERROR (an unexpected exception in the pipeline)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass(repr=False)
class Target:
    """The server under fuzz, a blocking channel to it, and what the checks read."""

    server: AgentServer
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    channel: grpc.Channel
    signer: TokenSigner
    audit: _Tally
    errors: _Errors
    tokens: dict[str, str] = field(default_factory=dict)
    bad_tokens: dict[str, str] = field(default_factory=dict)
    calls: int = 0
    started: float = field(default_factory=time.monotonic)

    def __repr__(self) -> str:  # hypothesis prints the fixture with every failing example
        return f"Target({self.server.endpoint}, {self.calls} calls so far)"


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="fuzzed-server", daemon=True)
    thread.start()
    secret = ClusterSecret.load_or_create(tmp_path_factory.mktemp("fuzz") / "cluster.secret")
    signer = TokenSigner(secret)
    audit = _Tally()
    errors = _Errors()
    logging.getLogger("protocol").addHandler(errors)

    async def start() -> AgentServer:
        server = AgentServer(
            FakeBackend(ROLE),
            policy=POLICY,
            authenticator=TokenAuthenticator(signer),
            audit=audit,
            # Every refusal recorded one by one (the per-peer budget of unauthenticated refusals
            # is tested in test_security), so each fuzzed call can be matched with its record.
            config=ServerConfig(
                max_message_bytes=MAX_BYTES,
                default_deadline_s=5.0,
                grace_s=1.0,
                refusal_audit_burst=1_000_000,
            ),
        )
        await server.start()
        return server

    server = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    channel = grpc.insecure_channel(server.endpoint)
    valid = signer.issue("operator", 3600)
    expired = TokenSigner(secret, clock=lambda: time.time() - 7200).issue("operator", 60)
    foreign = TokenSigner(ClusterSecret(os.urandom(32))).issue("operator", 3600)
    forged_mac = valid[:-1] + ("A" if valid[-1] != "A" else "B")
    forged_identity = _with_claims(valid, sub="orchestrator")
    running = Target(
        server=server,
        loop=loop,
        thread=thread,
        channel=channel,
        signer=signer,
        audit=audit,
        errors=errors,
        tokens={identity: signer.issue(identity, 3600) for identity in IDENTITIES},
        bad_tokens={
            "expired": f"Bearer {expired}",
            "foreign": f"Bearer {foreign}",
            "forged mac": f"Bearer {forged_mac}",
            "forged identity": f"Bearer {forged_identity}",
            "other scheme": f"Basic {valid}",
            "lowercase scheme": f"bearer {valid}",
            "bare token": valid,
            "empty bearer": "Bearer ",
        },
    )
    yield running
    elapsed = time.monotonic() - running.started
    print(f"\nfuzz: {running.calls} calls to the server in {elapsed:.1f}s")
    logging.getLogger("protocol").removeHandler(errors)
    channel.close()
    asyncio.run_coroutine_threadsafe(server.aclose(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


@dataclass(frozen=True)
class Outcome:
    code: grpc.StatusCode
    details: str
    violations: tuple[str, ...]
    response: bytes | None
    final_records: list[tuple[str, str]]


def _violation_fields(error: grpc.RpcError) -> tuple[str, ...]:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    fields: list[str] = []
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            fields.extend(item.field for item in bad.field_violations)
    return tuple(fields)


def _send(target: Target, method: str, body: bytes, metadata: Sequence[tuple[str, str]]) -> Outcome:
    """One blocking call; the outcome, with the final audit records it left."""
    before = len(target.audit.entries)
    target.calls += 1
    response: bytes | None = None
    try:
        if method == "Watch":
            stream = target.channel.unary_stream(method_path(method))
            list(stream(body, metadata=tuple(metadata), timeout=CALL_TIMEOUT_S))
            code, details, violations = OK, "", ()
        else:
            unary = target.channel.unary_unary(method_path(method))
            response = unary(body, metadata=tuple(metadata), timeout=CALL_TIMEOUT_S)
            code, details, violations = OK, "", ()
    except grpc.RpcError as error:
        code, details = error.code(), error.details() or ""  # type: ignore[attr-defined]
        violations = _violation_fields(error)
    finals = [entry for entry in target.audit.entries[before:] if entry[0] in FINAL_ACTIONS]
    assert code not in NEVER, f"{method}: {code} {details}"
    assert code is not grpc.StatusCode.DEADLINE_EXCEEDED, f"{method} hung: {details}"
    return Outcome(code, details, violations, response, finals)


def _check_audited(outcome: Outcome, *, transport_refused: bool = False) -> None:
    """A call the pipeline saw leaves exactly one final record, with the code answered; one the
    transport refused (beyond its own size limit) never reached the pipeline."""
    if transport_refused and not outcome.final_records:
        return
    assert [code for _, code in outcome.final_records] == [outcome.code.name], outcome


def _routing(
    target: Target,
    capability: str,
    *,
    identity: str = "operator",
    request_id: str = "",
) -> list[tuple[str, str]]:
    metadata = [
        (AUTHORIZATION_KEY, f"Bearer {target.tokens[identity]}"),
        (CALLER_KEY, identity),
        (TARGET_KEY, ROLE),
        (CAPABILITY_KEY, capability),
    ]
    if request_id:
        metadata.append((REQUEST_ID_KEY, request_id))
    return metadata


def _request_id() -> str:
    return f"fuzz-{uuid.uuid4().hex}"


def _envelope(
    capability: str,
    body: WireModel,
    *,
    caller: str = "operator",
    request_id: str | None = None,
    delegation: Sequence[str] = (),
) -> RequestEnvelope:
    return RequestEnvelope(
        request_id=request_id or _request_id(),
        caller=caller,
        target=ROLE,
        capability=capability,
        body=body,
        delegation=list(delegation),
    )


# --- random bytes -------------------------------------------------------------------------------

RPCS: Final = ("Call", "Describe", "Plans", "Watch", "Revisions", "Replay", "RunPlan", "Control")


def _expected_for_bytes(method: str, capability: str, body: bytes) -> grpc.StatusCode:
    """What the fake backend behind the pipeline answers to ``body``, decoded as ``method`` asks."""
    try:
        if method == "Call":
            return INVALID  # random bytes never make an envelope that matches the metadata
        if method == "RunPlan":
            return PRECONDITION if "cycle" in RUN_PLAN.decode_request(body).plan_json else OK
        if method == "Control":
            control = CONTROL.decode_request(body)
            if control_capability(control.action) != capability:
                return INVALID
            return NOT_FOUND if control.plan_id == "missing" else OK
        plan_id = decode_query(method, body)  # type: ignore[arg-type]
    except InvalidArgumentError:
        return INVALID
    if method in ("Revisions", "Replay", "Watch") and plan_id == "missing":
        return NOT_FOUND
    return OK


@FUZZ
@given(
    method=st.sampled_from(RPCS),
    capability=st.sampled_from(
        [*STRATEGIC_CAPABILITIES, *(f"Control.{a}" for a in ("pause", "cancel", "approve"))]
    ),
    body=st.one_of(
        st.binary(max_size=2048),
        # Bytes that start like a message, so the parser gets past the first tag more often.
        st.tuples(st.sampled_from([b"\n", b"\x12", b"j", b"r", b"\x08"]), st.binary()).map(
            b"".join
        ),
    ),
)
def test_random_bytes_get_the_code_their_decoding_calls_for(
    target: Target, method: str, capability: str, body: bytes
) -> None:
    if method == "Control" and not capability.startswith("Control."):
        capability = "Control.pause"
    elif method == "Call" and capability not in STRATEGIC_CAPABILITIES:
        capability = "AnalyzeNarrative"
    outcome = _send(target, method, body, _routing(target, capability))
    assert outcome.code == _expected_for_bytes(method, capability, body), outcome.details
    _check_audited(outcome)


# --- well-formed envelopes with one value out of range ------------------------------------------

_SLUG_BREAKERS: Final = st.one_of(
    st.just(""),
    st.text(st.characters(codec="utf-8"), min_size=1, max_size=70).filter(
        lambda s: re.fullmatch(r"[a-z][a-z0-9_]{0,63}", s) is None
    ),
    st.integers(65, 400).map(lambda n: "a" * n),
)
_INT32: Final = st.integers(-(2**31), 2**31 - 1)


@dataclass(frozen=True)
class Mutation:
    """One value put out of range in a valid request: where, and the field its violation names."""

    capability: str
    apply: Callable[[pb.AgentRequest], None]
    field: str


def _set(path: Sequence[str | int], value: Any) -> Callable[[pb.AgentRequest], None]:
    def apply(message: pb.AgentRequest) -> None:
        node: Any = message
        for step in path[:-1]:
            node = node[step] if isinstance(step, int) else getattr(node, step)
        last = path[-1]
        if isinstance(value, list):
            container = getattr(node, str(last))
            del container[:]
            if value and isinstance(value[0], dict):
                for item in value:
                    container.add(**item)
            else:
                container.extend(value)
        else:
            setattr(node, str(last), value)

    return apply


def _clear_body(message: pb.AgentRequest) -> None:
    message.ClearField(message.WhichOneof("body") or "analyze_narrative")


_RELATION: Final = {"subject": "mira", "predicate": "at", "object": "hall"}


@st.composite
def mutations(draw: st.DrawFn) -> Mutation:
    arc, analyze = "PlanNarrativeArc", "AnalyzeNarrative"
    a, n = "analyze_narrative", "plan_narrative_arc"
    choices: list[Callable[[], Mutation]] = [
        lambda: Mutation(
            arc,
            _set((n, "beats"), draw(_INT32.filter(lambda v: not 1 <= v <= 8))),
            "beats",
        ),
        lambda: Mutation(arc, _set((n, "protagonist"), draw(_SLUG_BREAKERS)), "protagonist"),
        lambda: Mutation(
            arc, _set((n, "goal"), draw(st.sampled_from(["", "g" * 201, "g" * 5000]))), "goal"
        ),
        lambda: Mutation(arc, _set((n, "themes"), ["t"] * draw(st.integers(17, 200))), "themes"),
        lambda: Mutation(
            arc,
            _set((n, "themes"), [draw(st.sampled_from(["", "w" * 65]))]),
            "themes[0]",
        ),
        lambda: Mutation(
            arc,
            _set(
                (n, "facts"),
                [{**_RELATION, "predicate": draw(st.text(max_size=20).filter(_not_predicate))}],
            ),
            "facts[0].predicate",
        ),
        lambda: Mutation(
            arc,
            _set((n, "facts"), [{**_RELATION, "object": draw(_SLUG_BREAKERS)}]),
            "facts[0].object",
        ),
        lambda: Mutation(
            analyze,
            _set(
                (a, "text"), "" if draw(st.booleans()) else "x" * draw(st.integers(20_001, 32_000))
            ),
            "text",
        ),
        lambda: Mutation(
            analyze,
            _set(
                (a, "entities"),
                [
                    {
                        "id": "mira",
                        "name": "Mira",
                        "kind": draw(st.text(max_size=12).filter(_not_kind)),
                    }
                ],
            ),
            "entities[0].kind",
        ),
        lambda: Mutation(
            analyze,
            _set((a, "entities"), [{"id": draw(_SLUG_BREAKERS), "name": "Mira", "kind": "place"}]),
            "entities[0].id",
        ),
        lambda: Mutation(
            analyze,
            _set((a, "entities"), [{"id": "mira", "name": "", "kind": "place"}]),
            "entities[0].name",
        ),
        lambda: Mutation(
            analyze,
            _set(
                ("request_id",),
                draw(
                    st.one_of(
                        st.just(""),
                        st.sampled_from(["-starts-with-dash", "has space", "ünïcode", "a" * 401]),
                        st.text(max_size=30).filter(_not_request_id),
                    )
                ),
            ),
            "request_id",
        ),
        lambda: Mutation(
            analyze,
            _set(("plan_id",), draw(st.sampled_from(["-x", "a b", "p" * 201, "x\ny"]))),
            "plan_id",
        ),
        lambda: Mutation(
            analyze, _set(("step_id",), draw(st.sampled_from(["/x", "s" * 300]))), "step_id"
        ),
        lambda: Mutation(analyze, _set(("caller",), "orchestrator"), "caller"),
        lambda: Mutation(
            analyze, _set(("target",), draw(st.sampled_from(["tactical", "X"]))), "target"
        ),
        lambda: Mutation(analyze, _set(("delegation",), ["alice"]), "delegation"),
        lambda: Mutation(analyze, _clear_body, "body"),
    ]
    return draw(st.sampled_from(choices))()


def _not_predicate(text: str) -> bool:
    return text not in ("at", "in", "has", "connected", "locked", "opens", "knows", "wants")


def _not_kind(text: str) -> bool:
    return text not in ("character", "place", "object")


def _not_request_id(text: str) -> bool:
    return re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.:/@-]{0,399}", text) is None


@FUZZ
@given(mutation=mutations())
def test_an_out_of_range_value_is_invalid_argument_naming_its_field(
    target: Target, mutation: Mutation
) -> None:
    request_id = _request_id()
    valid = _envelope(mutation.capability, SAMPLES[mutation.capability][0], request_id=request_id)
    message = pb.AgentRequest.FromString(encode_request(valid))
    mutation.apply(message)
    body = message.SerializeToString()
    outcome = _send(target, "Call", body, _routing(target, mutation.capability))
    if len(body) > MAX_BYTES:
        assert outcome.code == EXHAUSTED, outcome.details
    else:
        assert outcome.code == INVALID, outcome.details
        assert mutation.field in outcome.violations, (mutation.field, outcome.violations)
    _check_audited(outcome, transport_refused=len(body) > TRANSPORT_LIMIT)


@settings(FUZZ, max_examples=HUGE_EXAMPLES)
@given(
    size=st.one_of(
        st.integers(MAX_BYTES + 1, TRANSPORT_LIMIT),
        st.integers(TRANSPORT_LIMIT + 1, 6 * TRANSPORT_LIMIT),
    ),
    filler=st.characters(codec="utf-8", exclude_categories=["Cs"]),
    capability=st.sampled_from(STRATEGIC_CAPABILITIES),
)
def test_a_huge_string_is_resource_exhausted(
    target: Target, size: int, filler: str, capability: str
) -> None:
    text = (filler * size).encode()[:size].decode(errors="ignore") or "x" * size
    request = SAMPLES[capability][0]
    huge = (
        type(request).model_construct(**{**request.__dict__, "text": text})
        if capability == "AnalyzeNarrative"
        else type(request).model_construct(**{**request.__dict__, "goal": text})
    )
    envelope = RequestEnvelope.model_construct(
        **{**_envelope(capability, request).__dict__, "body": huge}
    )
    body = encode_request(envelope)
    assert len(body) > MAX_BYTES
    outcome = _send(target, "Call", body, _routing(target, capability))
    assert outcome.code == EXHAUSTED, outcome.details
    _check_audited(outcome, transport_refused=len(body) > TRANSPORT_LIMIT)


# --- unknown fields -----------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        if value < 0x80:
            out.append(value)
            return bytes(out)
        out.append((value & 0x7F) | 0x80)
        value >>= 7


# Field numbers no message of the envelope or its bodies uses (they use 1..16 and 99).
_UNKNOWN_NUMBER: Final = st.integers(17, 2**29 - 1).filter(lambda n: n != 99)


@st.composite
def unknown_fields(draw: st.DrawFn) -> bytes:
    parts: list[bytes] = []
    for _ in range(draw(st.integers(1, 4))):
        number = draw(_UNKNOWN_NUMBER)
        kind = draw(st.sampled_from([0, 1, 2, 5]))
        if kind == 0:
            value = _varint(draw(st.integers(0, 2**64 - 1)))
        elif kind == 1:
            value = draw(st.binary(min_size=8, max_size=8))
        elif kind == 5:
            value = draw(st.binary(min_size=4, max_size=4))
        else:
            payload = draw(st.binary(max_size=64))
            value = _varint(len(payload)) + payload
        parts.append(_varint(number << 3 | kind) + value)
    return b"".join(parts)


@FUZZ
@given(
    capability=st.sampled_from(STRATEGIC_CAPABILITIES),
    data=st.data(),
    top=unknown_fields(),
    inner=st.one_of(st.just(b""), unknown_fields()),
)
def test_unknown_fields_are_ignored_and_the_call_is_served(
    target: Target, capability: str, data: st.DataObject, top: bytes, inner: bytes
) -> None:
    spec = capability_for(ROLE, capability)
    assert spec is not None
    request = data.draw(model_strategy(spec.request))
    request_id = _request_id()
    message = pb.AgentRequest.FromString(
        encode_request(_envelope(capability, request, request_id=request_id))
    )
    if inner:
        getattr(message, spec.field).MergeFromString(inner)
    body = message.SerializeToString() + top
    outcome = _send(target, "Call", body, _routing(target, capability))
    if len(body) > MAX_BYTES:
        assert outcome.code == EXHAUSTED
    else:
        assert outcome.code == OK, outcome.details
        assert outcome.response is not None
        answer = decode_response(outcome.response)
        assert (answer.request_id, answer.capability, answer.responder) == (
            request_id,
            capability,
            ROLE,
        )
        assert answer.body == SAMPLES[capability][1]
    _check_audited(outcome)


# --- random metadata ----------------------------------------------------------------------------

_GARBAGE: Final = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=40)


def _maybe(valid: st.SearchStrategy[str]) -> st.SearchStrategy[str | None]:
    """Missing, a valid value, or garbage (printable ASCII, as metadata must be)."""
    return st.one_of(st.none(), valid, valid, _GARBAGE)


@dataclass(frozen=True)
class MetadataCase:
    auth: str  # an identity with a valid token, "missing", a bad-token kind, or "garbage"
    garbage_auth: str
    caller: str | None
    target: str | None
    capability: str | None
    version: str | None
    delegation: str | None
    request_id: str | None
    envelope_capability: str
    envelope_caller: str
    envelope_delegation: tuple[str, ...] | None  # None: the same as the metadata's chain


_POOL: Final = ("alice", "bob", "operator", "orchestrator", "strategic", "perception")
_BAD_TOKENS: Final = (
    "expired",
    "foreign",
    "forged mac",
    "forged identity",
    "other scheme",
    "lowercase scheme",
    "bare token",
    "empty bearer",
)


@st.composite
def metadata_cases(draw: st.DrawFn) -> MetadataCase:
    envelope_capability = draw(st.sampled_from([*STRATEGIC_CAPABILITIES, "ExtractEntities"]))
    chain = st.lists(st.sampled_from(_POOL), max_size=HOPS + 1).map(",".join)
    return MetadataCase(
        auth=draw(
            st.sampled_from(
                [*IDENTITIES, "operator", "operator", "missing", "garbage", *_BAD_TOKENS]
            )
        ),
        garbage_auth=draw(_GARBAGE),
        caller=draw(_maybe(st.sampled_from(IDENTITIES))),
        target=draw(_maybe(st.sampled_from([ROLE, ROLE, "perception"]))),
        capability=draw(
            _maybe(st.sampled_from([envelope_capability, envelope_capability, "Describe"]))
        ),
        version=draw(st.one_of(st.none(), st.none(), st.just("1"), _GARBAGE)),
        delegation=draw(st.one_of(st.none(), st.none(), chain, _GARBAGE)),
        request_id=draw(st.one_of(st.none(), st.none(), st.just("same"), _GARBAGE)),
        envelope_capability=envelope_capability,
        envelope_caller=draw(st.sampled_from([*IDENTITIES, "operator", "operator"])),
        envelope_delegation=draw(st.one_of(st.none(), st.none(), st.just(("bob",)))),
    )


def _expected_for_metadata(
    case: MetadataCase,
    identity: str | None,
    chain: tuple[str, ...],
    envelope_chain: tuple[str, ...],
    policy: Policy,
) -> grpc.StatusCode:
    """The pipeline's stages, in order (see ``protocol._server``), for this case."""
    if identity is None:
        return UNAUTHENTICATED
    if case.caller and case.caller != identity:
        return DENIED
    target, capability = case.target, case.capability
    if not (target and capability):
        # Without routing metadata the envelope routes the call (decoded once authenticated):
        # its target (this agent) and capability fill what the metadata left out, and its
        # delegation chain stands for a missing delegation header.
        target = target or ROLE
        capability = capability or case.envelope_capability
        if case.delegation is None:
            chain = envelope_chain
    if target != ROLE or not policy.allows(identity, target, capability):
        return DENIED
    if len(chain) + 1 > HOPS:
        return DENIED
    if not all(_IDENTITY.fullmatch(name) for name in chain):
        return INVALID
    if not set(chain) <= {OPERATOR, *roles(), *policy.callers}:
        return DENIED  # a delegation chain names only identities the deployment knows
    path = (*chain, identity, ROLE)
    if len(set(path)) < len(path):
        return DENIED
    spec = capability_for(ROLE, capability)
    if spec is None:
        return NOT_FOUND
    if case.version is not None and case.version != spec.version:
        return PRECONDITION
    routed = (
        case.envelope_caller == identity
        and case.envelope_capability == capability
        and (not case.request_id or case.request_id == "same")
        and envelope_chain == chain
    )
    return OK if routed else INVALID


@FUZZ
@given(case=metadata_cases())
def test_random_metadata_gets_the_code_of_the_first_stage_it_fails(
    target: Target, case: MetadataCase
) -> None:
    metadata: list[tuple[str, str]] = []
    identity: str | None = None
    if case.auth in IDENTITIES:
        identity = case.auth
        metadata.append((AUTHORIZATION_KEY, f"Bearer {target.tokens[case.auth]}"))
    elif case.auth == "garbage":
        metadata.append((AUTHORIZATION_KEY, case.garbage_auth))
    elif case.auth != "missing":
        metadata.append((AUTHORIZATION_KEY, target.bad_tokens[case.auth]))
    for key, value in (
        (CALLER_KEY, case.caller),
        (TARGET_KEY, case.target),
        (CAPABILITY_KEY, case.capability),
        (VERSION_KEY, case.version),
        (DELEGATION_KEY, case.delegation),
    ):
        if value is not None:
            metadata.append((key, value))
    request_id = _request_id()
    if case.request_id is not None:
        metadata.append(
            (REQUEST_ID_KEY, request_id if case.request_id == "same" else case.request_id)
        )
    chain = tuple(case.delegation.split(",")) if case.delegation else ()
    envelope_chain = chain if case.envelope_delegation is None else case.envelope_delegation
    if not all(_IDENTITY.fullmatch(name) for name in envelope_chain) or len(envelope_chain) > 64:
        envelope_chain = ()
    envelope = _envelope(
        case.envelope_capability,
        SAMPLES[case.envelope_capability][0],
        caller=case.envelope_caller,
        request_id=request_id,
        delegation=envelope_chain,
    )
    expected = _expected_for_metadata(case, identity, chain, envelope_chain, POLICY)
    outcome = _send(target, "Call", encode_request(envelope), metadata)
    assert outcome.code == expected, (outcome.code, outcome.details)
    _check_audited(outcome)


# --- and after all that -------------------------------------------------------------------------


def test_the_agent_still_serves_a_well_formed_call_after_the_fuzzing(target: Target) -> None:
    capability = "AnalyzeNarrative"
    request_id = _request_id()
    envelope = _envelope(capability, SAMPLES[capability][0], request_id=request_id)
    outcome = _send(target, "Call", encode_request(envelope), _routing(target, capability))
    assert outcome.code == OK
    assert outcome.response is not None
    assert decode_response(outcome.response).body == SAMPLES[capability][1]
    assert outcome.final_records == [("call.outcome", "OK")]
    assert target.thread.is_alive()
    assert target.server.load == (0, 0)
    assert target.errors.records == [], [r.getMessage() for r in target.errors.records]
