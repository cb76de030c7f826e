"""Routing under concurrency: many callers, thousands of requests in flight, each answer to its own
caller.

Real gRPC over loopback sockets with token authentication: 8 clients, each with its own identity
and token (a policy built here grants each of them ``ExtractEntities`` on perception), send 500
concurrent requests each to one ``AgentServer``. The fake backend echoes who asked what into its
answer and sleeps a random few milliseconds first, so answers complete out of order. Every caller
uses the same request ids (``r-0`` ... ``r-499``): ids are per caller, so an answer keyed on the
id alone would reach the wrong caller and show up here as a mismatch.

A burst of 4000 calls once found a limit below the server's own admission control: grpc's C core
holds at most ``grpc.server.max_pending_requests`` (1000 by default) calls that arrived but that
the application has not picked up yet, and cancelled the rest with ``CANCELLED`` before the
pipeline saw them (no audit record). ``AgentServer`` now raises those limits above its
``max_concurrent_requests`` + ``max_queued_requests``, and this test runs the server as shipped.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from pathlib import Path

import pytest

from stratagem.protocol import (
    AgentClient,
    AgentServer,
    CallContext,
    ClientConfig,
    ClusterSecret,
    Entity,
    ExtractEntitiesRequest,
    ExtractEntitiesResponse,
    InMemoryAuditLog,
    Policy,
    PolicyRule,
    ServerConfig,
    TokenAuthenticator,
    TokenCredentials,
    TokenSigner,
    WireModel,
)
from tests.integration.protocol.conftest import Tracing
from tests.unit.protocol._support import FakeBackend

pytestmark = pytest.mark.integration

CALLERS = 8
REQUESTS_PER_CALLER = 500
# Every request of every caller is in flight at once; the server runs half and queues half, so
# the admission queue hands slots over under load and still refuses none.
IN_FLIGHT = CALLERS * REQUESTS_PER_CALLER
ALL_DONE_WITHIN_S = 90.0


def _identity(index: int) -> str:
    return f"caller-{index}"


def _text(caller: str, number: int) -> str:
    return f"{caller} asks question {number}."


async def _echo(request: WireModel, ctx: CallContext) -> WireModel:
    """Answer with what was asked, by whom, under which id, after a random short wait."""
    assert isinstance(request, ExtractEntitiesRequest)
    await asyncio.sleep(random.uniform(0.0, 0.02))
    return ExtractEntitiesResponse(
        entities=[
            Entity(id="asked", name=request.text, kind="object"),
            Entity(id="caller", name=ctx.caller, kind="character"),
            Entity(id="request", name=ctx.request_id, kind="object"),
        ],
        world_version=len(request.text),
    )


def _mismatch(caller: str, number: int, answer: WireModel) -> str | None:
    """What is wrong with ``answer`` to request ``number`` of ``caller``, or ``None``."""
    expected = {
        "asked": _text(caller, number),
        "caller": caller,
        "request": f"r-{number}",
    }
    if not isinstance(answer, ExtractEntitiesResponse):
        return f"a {type(answer).__name__}"
    echoed = {entity.id: entity.name for entity in answer.entities}
    if echoed != expected or answer.world_version != len(expected["asked"]):
        return f"{echoed} != {expected}"
    return None


class _Run:
    """What one burst produced: each call's outcome, the backend, the audit log, the server."""

    def __init__(self) -> None:
        self.outcomes: list[str | BaseException | None] = []
        self.elapsed = 0.0
        self.peak_running = 0
        self.backend = FakeBackend("perception")
        self.backend.behaviour["ExtractEntities"] = _echo
        self.audit = InMemoryAuditLog()
        self.load_after = (-1, -1)


async def _burst(tmp_path: Path, tracing: Tracing) -> _Run:
    """8 token-authenticated clients, 500 concurrent ``ExtractEntities`` calls each, to one
    server whose admission limits (half running, half queued) admit all 4000 at once."""
    signer = TokenSigner(ClusterSecret.load_or_create(tmp_path / "cluster.secret"))
    identities = [_identity(i) for i in range(CALLERS)]
    policy = Policy(
        PolicyRule(caller, "perception", frozenset({"ExtractEntities"})) for caller in identities
    )
    run = _Run()
    server = AgentServer(
        run.backend,
        policy=policy,
        authenticator=TokenAuthenticator(signer),
        audit=run.audit,
        config=ServerConfig(
            default_deadline_s=60.0,
            grace_s=1.0,
            max_concurrent_requests=IN_FLIGHT // 2,
            max_queued_requests=IN_FLIGHT - IN_FLIGHT // 2,
        ),
        tracer_provider=tracing.provider,
    )
    await server.start()
    clients = [
        AgentClient(
            server.endpoint,
            credentials=TokenCredentials(signer, caller),
            config=ClientConfig(default_timeout_s=60.0),
            tracer_provider=tracing.provider,
        )
        for caller in identities
    ]

    async def watch_load() -> None:
        while True:
            run.peak_running = max(run.peak_running, server.load[0])
            await asyncio.sleep(0.005)

    async def ask(client: AgentClient, caller: str, number: int) -> str | None:
        request = ExtractEntitiesRequest(text=_text(caller, number))
        answer = await client.call(
            "perception", "ExtractEntities", request, request_id=f"r-{number}"
        )
        return _mismatch(caller, number, answer)

    watcher = asyncio.create_task(watch_load())
    started = time.monotonic()
    try:
        calls = [
            ask(client, caller, number)
            for number in range(REQUESTS_PER_CALLER)
            for client, caller in zip(clients, identities, strict=True)
        ]
        run.outcomes = await asyncio.wait_for(
            asyncio.gather(*calls, return_exceptions=True), ALL_DONE_WITHIN_S
        )
        run.elapsed = time.monotonic() - started
        run.load_after = server.load
    finally:
        watcher.cancel()
        for client in clients:
            await client.aclose()
        await server.aclose()
    return run


def _assert_every_caller_got_exactly_its_own_answers(run: _Run) -> None:
    failures = [outcome for outcome in run.outcomes if isinstance(outcome, BaseException)]
    mismatches = [outcome for outcome in run.outcomes if isinstance(outcome, str)]
    assert failures == [], f"{len(failures)} calls failed, e.g. {failures[:3]}"
    assert mismatches == [], f"{len(mismatches)} wrong answers, e.g. {mismatches[:3]}"
    assert len(run.outcomes) == IN_FLIGHT
    assert run.elapsed < ALL_DONE_WITHIN_S

    # The handler ran once per request, as its own caller, under its own id.
    identities = [_identity(i) for i in range(CALLERS)]
    expected = {(caller, f"r-{n}") for caller in identities for n in range(REQUESTS_PER_CALLER)}
    served = Counter((ctx.caller, ctx.request_id) for _, _, ctx in run.backend.calls)
    assert set(served) == expected
    assert set(served.values()) == {1}

    # Exactly one accepted and one OK outcome per request, under the caller that sent it.
    records = list(run.audit.records())
    by_action = Counter((r.action, r.actor, r.request_id, r.code) for r in records)
    accepted = {(actor, rid) for action, actor, rid, _ in by_action if action == "call.accepted"}
    answered = {
        (actor, rid)
        for action, actor, rid, code in by_action
        if action == "call.outcome" and code == "OK"
    }
    assert accepted == expected
    assert answered == expected
    assert set(by_action.values()) == {1}
    assert len(records) == 2 * IN_FLIGHT, Counter(r.action for r in records)
    # No more ran at once than admitted, and every slot came back.
    assert run.peak_running <= IN_FLIGHT // 2
    assert run.load_after == (0, 0)


async def test_8_callers_with_500_concurrent_requests_each_get_exactly_their_own_answers(
    tmp_path: Path, tracing: Tracing
) -> None:
    run = await _burst(tmp_path, tracing)
    _assert_every_caller_got_exactly_its_own_answers(run)
