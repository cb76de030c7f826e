"""``Call``'s own stages: a capability request, routed by the capability table, answered once.

After the shared admission (``Pipeline.admit``) a ``Call`` must name a capability this agent
serves (``NOT_FOUND``, told only to a caller the policy allowed) in the schema version it speaks
(``FAILED_PRECONDITION``); its envelope must agree with the call's metadata (``INVALID_ARGUMENT``).
A ``request_id`` seen before from the same caller gets the stored answer (another request under the
same id is ``FAILED_PRECONDITION``) and a duplicate of a call still running waits for it, so the
handler runs once; answers are stored before they are sent. Two requests are the same request when
``same_request_digest`` says so: what the caller asked, not how it came to ask (see there).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from typing import Any

from opentelemetry.trace import Span

from stratagem.protocol._admission import Budget, uninterrupted, within
from stratagem.protocol._answers import AnswerStore
from stratagem.protocol._capabilities import CapabilitySpec, capability_for
from stratagem.protocol._codec import decode_request, encode_answer
from stratagem.protocol._context import CallContext, current_call
from stratagem.protocol._errors import (
    FailedPreconditionError,
    FieldViolation,
    InvalidArgumentError,
    NotFoundError,
    RemoteError,
    UnavailableError,
    error_for_code,
)
from stratagem.protocol._models import RequestEnvelope
from stratagem.protocol._pipeline import Exchange, Pipeline, plan_step
from stratagem.protocol._rpc import VERSION_KEY, stratagem_attributes
from stratagem.protocol._service import AgentBackend
from stratagem.protocol._status import as_remote_error

__all__ = ["CallPipeline"]

logger = logging.getLogger(__name__)


class CallPipeline:
    """Serves ``Call`` for one server.

    Args:
        pipeline: The stages every RPC shares.
        backend: The agent whose capabilities answer.
        answers: Where answers are kept by (caller, request id).
    """

    def __init__(self, pipeline: Pipeline, backend: AgentBackend, answers: AnswerStore) -> None:
        self._pipeline = pipeline
        self._backend = backend
        self._role = pipeline.role
        self._answers = answers
        self._running: dict[tuple[str, str], tuple[str, asyncio.Future[bytes | RemoteError]]] = {}

    async def serve(self, exchange: Exchange, request: bytes, context: Any, span: Span) -> bytes:
        """The ``Call`` RPC's stages after its span is made; its answer's bytes."""
        pipeline = self._pipeline
        await pipeline.admit(exchange, request, context, span, read=None)
        spec = capability_for(self._role, exchange.capability)
        if spec is None:
            raise NotFoundError(f"{self._role} does not serve {exchange.capability!r}")
        spoken = exchange.metadata.get(VERSION_KEY, spec.version)
        if spoken != spec.version:
            raise FailedPreconditionError(
                f"{spec.name}: the caller speaks schema version {spoken[:32]!r}, "
                f"{self._role} speaks {spec.version!r}; update one side"
            )
        pipeline.limit(len(request), "request")
        envelope = exchange.envelope or decode_request(request)
        span.set_attributes(
            stratagem_attributes(
                request_id=envelope.request_id, plan_id=envelope.plan_id, step_id=envelope.step_id
            )
        )
        _check_routing(envelope, exchange)
        exchange.request_id = envelope.request_id
        key = (exchange.caller, envelope.request_id)
        same = same_request_digest(envelope)
        budget = pipeline.budget(context)
        running = self._running.get(key)
        if running is None:
            kept = await self._answers.get(*key)
            if kept is not None:
                stored = (kept.request_digest, kept.answer)
                return await self._replay(exchange, same, stored, budget)
            # A duplicate may have started while the store was read.
            running = self._running.get(key)
        if running is not None:
            return await self._replay(exchange, same, running, budget)
        # Registered before the next await, so a duplicate arriving meanwhile waits for this one.
        outcome: asyncio.Future[bytes | RemoteError] = asyncio.get_running_loop().create_future()
        self._running[key] = (same, outcome)
        try:
            detail = plan_step(envelope.plan_id, envelope.step_id)
            await pipeline.accept(exchange, detail, defer=True)
            answer = await self._run(spec, envelope, budget)
            # Handed to the audit log now, so that it commits with the acceptance (the server
            # confirms both before answering).
            pipeline.append_outcome(exchange, answer)
            # Stored before the call leaves ``_running`` and before it is answered, so a repeat
            # (even after this server restarts, with a durable store) never runs the handler again.
            await uninterrupted(self._keep(key, same, answer))
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
        exchange: Exchange,
        same: str,
        stored: tuple[str, bytes | asyncio.Future[bytes | RemoteError]],
        budget: Budget,
    ) -> bytes:
        """Answer a duplicate ``request_id`` with the first attempt's outcome, when it is the same
        request (``same``: its ``same_request_digest``)."""
        request_digest, answer = stored
        # An answer stored before requests were compared by ``same_request_digest`` carries the
        # digest of the whole request message: the same request sent again has that one too.
        if request_digest not in (same, exchange.request_digest):
            raise FailedPreconditionError(
                f"request_id {exchange.request_id!r} was already used for a different request"
            )
        exchange.replayed = True
        if isinstance(answer, bytes):
            return answer
        result = await within(budget, asyncio.shield(answer), "the first attempt")
        if isinstance(result, RemoteError):
            raise error_for_code(result.code, result.message, result.violations)
        return result

    async def _run(self, spec: CapabilitySpec, envelope: RequestEnvelope, budget: Budget) -> bytes:
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
            response = await within(
                budget, self._backend.handle(spec.name, envelope.body, call), spec.name
            )
        finally:
            current_call.reset(token)
        # The backend built ``response`` (a validated model) and every envelope field comes from the
        # validated request: encoded as is, without validating an envelope around it again.
        answer = encode_answer(spec, envelope.request_id, self._role, response)
        self._pipeline.limit(len(answer), "response")
        return answer


def same_request_digest(envelope: RequestEnvelope) -> str:
    """What makes two requests under one ``request_id`` the same request: the capability asked
    of which target, the caller's plan and step, and the body (as canonical JSON).

    Not how the caller came to ask: the delegation chain (a plan resumed after its agent restarted
    asks again on nobody's behalf, where the first attempt carried ``["operator"]``), nor what
    travels in metadata (deadline, trace context, credentials), which a retry changes anyway. The
    caller is part of the key the answer is stored under.
    """
    body = json.dumps(envelope.body.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    routed = "\n".join(
        (envelope.capability, envelope.target, envelope.plan_id, envelope.step_id, body)
    )
    return hashlib.sha256(routed.encode()).hexdigest()


def _check_routing(envelope: RequestEnvelope, exchange: Exchange) -> None:
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
