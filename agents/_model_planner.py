"""Planning with a language model, without trusting it.

``ModelPlanner`` asks a model for the agent's own plan type, as JSON constrained by a schema made
from the agent's plan and registry: a step's ``tool`` is one of *this agent's* tools and its
``input`` that tool's input schema (``plan_answer_schema``). Whatever comes back is untrusted
input and passes what a hand-written plan passes, and more:

1. JSON, not cut at the token limit, nested at most ``MAX_ANSWER_DEPTH`` deep, with a token
   count that is not negative (``parse_json_answer``);
2. the plan type's model (pydantic), with the planner's own ``id``, ``owner`` and ``provenance``;
3. ``planning.validate_plan`` against the registry: a foreign tool, a cycle, a bad ``$ref``;
4. each tool step's input against that tool's input model (when it holds no reference);
5. the role's ``judge``, the agent's deterministic tools (the tactical agent simulates a proposed
   sequence).

A role whose model answers something narrower than a plan (the built-in roles: ``_model_roles``)
composes a ``ModelAnswer`` (``answer=``): its prompt, its schema, how its answer becomes the
role's plan and the judge of that plan; the checks above and what follows are the same for it.

A refused answer goes back to the model as a critique naming every problem, for at most
``max_repairs`` more attempts; then the deterministic planner's plan is used when ``fallback`` is
on, else planning fails with class ``logic`` naming the last problems. A logic failure while the
plan runs comes back through ``replan``: the critique is the failure, the answer a new revision
whose ``provenance.author`` names the model (the engine records it as the revision's author).

Every call is journaled in the plan's ``provenance`` (model, request digest, the answer as
received, finish reason, tokens, latency, the critique it answered, its outcome), so replay
re-derives the plan from the journal with no model server (``rederive``). Tokens are reserved
from the plan's ``budget.model_tokens`` before each call (``max_tokens`` plus the prompt's
estimate); a call that would pass it is not sent (``PolicyError`` naming it). A server that cannot
be reached or times out is retried with backoff (``TransientError`` after the last try).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic import ValidationError

from stratagem.agents._model import (
    ChatMessage,
    ChatRequest,
    ChatResponse,
    ModelClient,
    ScriptedModelClient,
    parse_json_answer,
)
from stratagem.agents._model_answer import DeterministicPlanner, ModelAnswer, PlanJudge
from stratagem.agents._model_schema import plan_answer_schema
from stratagem.agents._tool import ToolRegistry
from stratagem.planning import (
    Budget,
    LogicError,
    ModelCall,
    Plan,
    PlanValidationError,
    PolicyError,
    Provenance,
    StepFailure,
    ToolStep,
    TransientError,
    validate_plan,
)
from stratagem.protocol import CAPABILITIES, WireModel, remaining_time

__all__ = [
    "ModelAnswer",
    "ModelPlanner",
    "ModelPlanningConfig",
    "PlanJudge",
    "plan_answer_schema",
    "rederive",
]

logger = logging.getLogger(__name__)

_RESPONSE_LIMIT: Final = 65536
INVALID_USAGE: Final = "invalid_usage"
"""The finish reason journaled for an answer whose server reported a negative token count."""
_TRANSIENT_DELAYS_S: Final = (0.5, 1.0, 2.0)
# A rough count of the prompt's tokens (reserved before a call): four characters a token.
_CHARS_PER_TOKEN: Final = 4


@dataclass(frozen=True, slots=True)
class ModelPlanningConfig:
    """How a model planner asks and how far it trusts.

    Attributes:
        max_repairs: New attempts after a refused answer (``STRATAGEM_MODEL_MAX_REPAIRS``).
        max_tokens: The most tokens one answer may have.
        max_steps: The most steps a plan the model writes may have (bounded in the schema).
        fallback: Whether the deterministic planner's plan is used when every attempt was refused.
        temperature: Sampling temperature.
        transient_delays_s: Backoff between tries when the server cannot be reached.
    """

    max_repairs: int = 2
    max_tokens: int = 512
    max_steps: int = 8
    fallback: bool = True
    temperature: float = 0.0
    transient_delays_s: tuple[float, ...] = _TRANSIENT_DELAYS_S

    def __post_init__(self) -> None:
        if self.max_repairs < 0 or self.max_tokens < 1 or self.max_steps < 1:
            raise ValueError("max_repairs must be >= 0, max_tokens and max_steps >= 1")


# --- the planner ---------------------------------------------------------------------------------


def _digest(request: ChatRequest) -> str:
    body = {
        "messages": [[m.role, m.content] for m in request.messages],
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "schema": request.schema,
    }
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


_ANSWER_FIELDS: Final = frozenset({"goal", "steps", "inputs", "on_failure"})
_ANSWER_KINDS: Final = frozenset({"tool", "map", "loop", "subplan"})


def _kinds(steps: list[Any]) -> set[str]:
    """The kinds of the steps (a step without one is a tool step), bodies included."""
    found: set[str] = set()
    for step in steps:
        if isinstance(step, dict):
            found.add(str(step.get("kind", "tool")))
            if isinstance(step.get("steps"), list):
                found |= _kinds(step["steps"])
    return found


def _with_kinds(steps: list[Any]) -> list[Any]:
    """The steps with ``kind: tool`` given to those without a kind (the answer leaves it out)."""
    shaped: list[Any] = []
    for step in steps:
        if isinstance(step, dict):
            step = {"kind": "tool", **step}
            if isinstance(step.get("steps"), list):
                step["steps"] = _with_kinds(step["steps"])
        shaped.append(step)
    return shaped


def _has_ref(value: Any) -> bool:
    """Whether ``value`` holds a ``{"$ref": ...}`` reference or an ``{"$expr": ...}`` anywhere."""
    if isinstance(value, dict):
        return "$ref" in value or "$expr" in value or any(_has_ref(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_ref(v) for v in value)
    return False


def _words(text: str) -> list[str]:
    return text.lower().split()


def _one_line(text: str, limit: int = 600) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(slots=True)
class _Attempts:
    """The conversation and the journal of one planning (or repair) session."""

    messages: list[ChatMessage]
    calls: list[ModelCall] = field(default_factory=list)
    spent: int = 0


class ModelPlanner:
    """Plans an agent's capabilities with a model, checked by the agent's own rules and tools.

    Args:
        role: The agent's role (its plans' owner).
        plan_type: The agent's plan type.
        registry: The agent's tools: the only tools a model's plan may name.
        client: The model.
        deterministic: The role's own planner: the fallback, and what builds responses.
        config: Repairs, limits, fallback.
        judge: The role's deterministic check of a proposed plan (problems, or [] to accept).
        instructions: What the system prompt adds for this role (a few lines, an example).
        budget: The budget given to every plan made (``model_tokens`` bounds the model calls).
        answer: A role's narrow answer (``ModelAnswer``) in place of a plan over the agent's
            tools: its requests are asked as it says, others go to ``deterministic`` unasked.
    """

    def __init__(
        self,
        *,
        role: str,
        plan_type: type[Plan],
        registry: ToolRegistry,
        client: ModelClient,
        deterministic: DeterministicPlanner,
        config: ModelPlanningConfig | None = None,
        judge: PlanJudge | None = None,
        instructions: str = "",
        budget: Budget | None = None,
        answer: ModelAnswer[Any] | None = None,
    ) -> None:
        self.role = role
        self.plan_type = plan_type
        self.registry = registry
        self.client = client
        self.deterministic = deterministic
        self.config = config or ModelPlanningConfig()
        self.answer = answer
        self.judge = judge if judge is not None or answer is None else answer.judge
        self.instructions = instructions
        self.budget = budget
        self._schema: dict[str, Any] | None = None

    @property
    def schema(self) -> dict[str, Any]:
        """The answer schema of a plan over this agent's tools (``plan_answer_schema``), made on
        first use: a role that asks for another answer (the orchestrator, which has no tools)
        never needs it."""
        if self._schema is None:
            self._schema = plan_answer_schema(self.registry, max_steps=self.config.max_steps)
        return self._schema

    # --- the prompt --------------------------------------------------------------------------

    def _answer_for(self, request: WireModel) -> ModelAnswer[Any] | None:
        """The role's answer when ``request`` is one it answers, else ``None`` (a plan)."""
        answer = self.answer
        return answer if answer is not None and answer.answers(request) else None

    def system(self) -> str:
        """The system message: the role's own, else the agent's tools and the plan's shape."""
        if self.answer is not None:
            return self.answer.system
        tools = "\n".join(
            f"- {name}: {self.registry.get(name).description}" for name in self.registry.names()
        )
        return (
            f"You plan for the {self.role} agent. Answer with one JSON object: a short goal (the "
            f"request's own goal, word for word, when it has one) and at most "
            f"{self.config.max_steps} steps. Each step calls one of these tools with its "
            f"input, and may depend on earlier steps by id:\n{tools}\n"
            f'Inputs may be expressions, {{"$expr": "step.field"}}; a step may have "when" '
            f'or "runs_on": "failure"; a "map" runs its tool per item of "over" (its input '
            f'reads "item"); a "loop" repeats until "until".\n{self.instructions}'
        ).strip()

    def ask(self, capability: str, request: WireModel) -> str:
        """The user message: what to plan (a role's answer says it more briefly)."""
        answer = self._answer_for(request)
        if answer is not None:
            return answer.ask(request)
        return f"Plan {capability} for this request:\n{request.model_dump_json()}"

    # --- calling -----------------------------------------------------------------------------

    async def _call(
        self, attempts: _Attempts, critique: str, schema: dict[str, Any]
    ) -> tuple[ChatResponse, ModelCall]:
        request = ChatRequest(
            messages=tuple(attempts.messages),
            max_tokens=self.config.max_tokens,
            temperature=self.config.temperature,
            schema=schema,
            schema_name=f"{self.role}_plan",
        )
        digest = _digest(request)
        limit = self.budget.model_tokens if self.budget is not None else None
        reserve = self.config.max_tokens + sum(len(m.content) for m in request.messages) // (
            _CHARS_PER_TOKEN
        )
        if limit is not None and attempts.spent + reserve > limit:
            raise PolicyError(
                f"model call {len(attempts.calls) + 1} of the {self.role} planner would pass the "
                f"plan's model token budget ({attempts.spent} used + {reserve} reserved > {limit})"
            )
        delays = self.config.transient_delays_s
        for attempt in range(len(delays) + 1):
            try:
                response = await self.client.chat(request)
                break
            except TransientError as exc:
                left = remaining_time()
                if attempt == len(delays) or (left is not None and left <= delays[attempt]):
                    raise TransientError(
                        f"{exc} (tried {attempt + 1} times while planning {self.role})"
                    ) from exc
                logger.warning(
                    "%s planner: %s; retrying in %.1f s", self.role, exc, delays[attempt]
                )
                await asyncio.sleep(delays[attempt])
        if min(response.input_tokens, response.output_tokens) < 0:
            # The server's count is nonsense: recorded as such (so replay refuses it again).
            response = dataclasses.replace(
                response, finish_reason=INVALID_USAGE, input_tokens=0, output_tokens=0
            )
        attempts.spent += response.input_tokens + response.output_tokens
        call = ModelCall(
            model=response.model[:200] or self.client.model[:200],
            request_digest=digest,
            response=response.content[:_RESPONSE_LIMIT],
            finish_reason=response.finish_reason[:64],
            input_tokens=response.input_tokens,
            output_tokens=response.output_tokens,
            latency_s=max(response.latency_s, 0.0),
            critique=critique[:4000],
        )
        return response, call

    # --- checking ----------------------------------------------------------------------------

    # --- the answer's shape and how it becomes a plan (a role's answer, or a plan) -------------

    def schema_for(self, capability: str, request: WireModel) -> dict[str, Any]:
        """The JSON Schema the answer must follow (without a role's answer: a plan of this
        agent's tools)."""
        answer = self._answer_for(request)
        return self.schema if answer is None else answer.schema(request)

    def build(
        self, answer: Any, capability: str, request: WireModel, plan_id: str
    ) -> tuple[Plan | None, list[str]]:
        """The answer as this agent's plan (without a role's answer: the answer is the plan's
        goal and steps), or the problems that refuse it."""
        role_answer = self._answer_for(request)
        if role_answer is not None:
            return role_answer.build(answer, request, plan_id, self.deterministic)
        if not isinstance(answer, dict):
            return None, ["the answer is not a JSON object with a goal and steps"]
        fields = {k: v for k, v in answer.items() if k in _ANSWER_FIELDS}
        unknown = sorted(set(answer) - _ANSWER_FIELDS)
        if unknown:
            return None, [f"the answer has fields a plan does not: {', '.join(unknown)}"]
        users = getattr(request, "goal", None)
        if isinstance(users, str) and users.strip():
            # The goal is the user's: a model proposes how to reach it, never what it is.
            proposed = fields.get("goal")
            if not isinstance(proposed, str) or _words(proposed) != _words(users):
                return None, [
                    f"the plan's goal {proposed!r} is not the user's goal {users!r}: a plan may "
                    "choose how to reach the goal, not what it is"
                ]
            fields["goal"] = users
        steps = fields.get("steps")
        if isinstance(steps, list):
            found = _kinds(steps)
            if found - _ANSWER_KINDS:
                return None, [
                    f"the plan may only have tool, map, loop and subplan steps, not "
                    f"{sorted(found - _ANSWER_KINDS)}"
                ]
            fields["steps"] = _with_kinds(steps)
        try:
            plan = self.plan_type.model_validate({**fields, "id": plan_id, "owner": self.role})
        except ValidationError as exc:
            return None, [
                f"{'.'.join(str(p) for p in error['loc']) or 'plan'}: {error['msg']}"
                for error in exc.errors()[:8]
            ]
        return plan, []

    def _read(
        self, response: ChatResponse, capability: str, request: WireModel, plan_id: str
    ) -> tuple[Plan | None, list[str]]:
        """The answer as this agent's plan, checked like a hand-written one, or the problems
        that refuse it."""
        if len(response.content) > _RESPONSE_LIMIT:
            return None, [f"the answer is longer than {_RESPONSE_LIMIT} characters"]
        if response.finish_reason == INVALID_USAGE:
            return None, ["the server reported a negative token count for the answer: not used"]
        try:
            answer = parse_json_answer(response)
        except LogicError as exc:
            return None, [str(exc)]
        plan, problems = self.build(answer, capability, request, plan_id)
        if plan is None:
            return None, problems
        try:
            validate_plan(plan, tools=self.registry)
        except PlanValidationError as exc:
            problems.extend(exc.problems)
        for step in plan.steps:
            if isinstance(step, ToolStep) and step.tool in self.registry:
                if _has_ref(step.input):
                    continue
                try:
                    self.registry.get(step.tool).input_model.model_validate(step.input)
                except ValidationError as exc:
                    problems.extend(
                        f"step {step.id!r} input {'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                        for e in exc.errors()[:4]
                    )
        return (None, problems) if problems else (plan, [])

    async def _judged(self, plan: Plan, request: WireModel) -> list[str]:
        if self.judge is None:
            return []
        try:
            return await self.judge(plan, request)
        except (LogicError, ValueError) as exc:
            return [str(exc)]

    # --- planning ----------------------------------------------------------------------------

    async def _session(
        self,
        capability: str,
        request: WireModel,
        plan_id: str,
        attempts: _Attempts,
        critique: str,
        tries: int,
    ) -> tuple[Plan | None, list[str]]:
        problems: list[str] = []
        for _ in range(tries):
            response, call = await self._call(
                attempts, critique, self.schema_for(capability, request)
            )
            plan, problems = self._read(response, capability, request, plan_id)
            if plan is not None:
                problems = await self._judged(plan, request)
            outcome = "accepted" if plan is not None and not problems else "; ".join(problems)
            attempts.calls.append(call.model_copy(update={"outcome": _one_line(outcome, 4000)}))
            if plan is not None and not problems:
                return plan, []
            critique = _one_line("; ".join(problems), 3000)
            attempts.messages += [
                ChatMessage("assistant", response.content[:4000]),
                ChatMessage(
                    "user",
                    f"That plan was refused: {critique}. Answer again with a corrected plan.",
                ),
            ]
        return None, problems

    def _stamp(
        self,
        plan: Plan,
        capability: str,
        request: WireModel,
        author: str,
        calls: Sequence[ModelCall],
    ) -> Plan:
        provenance = Provenance(
            author=author[:300],
            capability=capability,
            request=request.model_dump(mode="json"),
            calls=list(calls)[-64:],
        )
        update: dict[str, Any] = {"provenance": provenance}
        if self.budget is not None and plan.budget is None:
            update["budget"] = self.budget
        return plan.model_copy(update=update)

    async def plan(self, capability: str, request: WireModel, *, plan_id: str) -> Plan:
        """A plan for one request, written by the model and accepted by every check.

        Raises:
            planning.LogicError: Every attempt was refused and ``fallback`` is off; the message
                names the last problems.
            planning.PolicyError: A call would pass the plan's model token budget.
            planning.TransientError: The model server could not be reached, after retries.
            protocol.InvalidArgumentError: The role answer's ``check`` refused the request before
                the model was asked (the orchestrator's: a consulted agent it does not know).
        """
        if self.answer is not None:
            answer = self._answer_for(request)
            if answer is None:  # not a request the role asks its model about: its own rules
                return self.deterministic.plan(capability, request, plan_id=plan_id)
            if answer.check is not None:
                answer.check(request, self.deterministic)
        attempts = _Attempts(
            messages=[
                ChatMessage("system", self.system()),
                ChatMessage("user", self.ask(capability, request)),
            ]
        )
        plan, problems = await self._session(
            capability, request, plan_id, attempts, "", 1 + self.config.max_repairs
        )
        if plan is not None:
            return self._stamp(
                plan, capability, request, f"model:{self.client.model}", attempts.calls
            )
        last = _one_line("; ".join(problems), 1500)
        if not self.config.fallback:
            times = "once" if len(attempts.calls) == 1 else f"{len(attempts.calls)} times"
            raise LogicError(f"the model's plan for {capability} was refused {times}; last: {last}")
        logger.warning(
            "%s planner: the model's plans were refused %d times (last: %s); using the %s "
            "planner's",
            self.role,
            len(attempts.calls),
            last,
            self.role,
        )
        fallback = self.deterministic.plan(capability, request, plan_id=plan_id)
        return self._stamp(fallback, capability, request, f"planner:{self.role}", attempts.calls)

    async def replan(self, plan: Plan, failure: StepFailure) -> Plan | None:
        """After a logic failure while the plan ran: the model repairs it, the failure being the
        critique, within what is left of ``max_repairs`` (``None``: no repair left, or the plan
        was not the model's)."""
        provenance = plan.provenance
        if provenance is None or not provenance.author.startswith("model:"):
            return None
        repairs = sum(1 for call in provenance.calls if call.critique)
        left = self.config.max_repairs - repairs
        if left <= 0:
            return None
        request = self._request(provenance)
        if request is None:
            return None
        capability, wire = request
        critique = _one_line(f"step {failure.step_id!r} failed: {failure.message}", 3000)
        steps = [s.model_dump(mode="json", exclude={"status"}) for s in plan.steps]
        attempts = _Attempts(
            messages=[
                ChatMessage("system", self.system()),
                ChatMessage("user", self.ask(capability, wire)),
                ChatMessage("assistant", json.dumps({"goal": plan.goal, "steps": steps})[:4000]),
                ChatMessage(
                    "user",
                    f"That plan failed while running: {critique}. Answer with a corrected plan.",
                ),
            ],
            spent=provenance.tokens,
        )
        new, _ = await self._session(capability, wire, plan.id, attempts, critique, left)
        if new is None:
            return None
        return self._stamp(
            new,
            capability,
            wire,
            f"model:{self.client.model}",
            [*provenance.calls, *attempts.calls],
        )

    def _request(self, provenance: Provenance) -> tuple[str, WireModel] | None:
        """The capability request a plan answers, read back from its provenance."""
        spec = CAPABILITIES.get(provenance.capability)
        if spec is None:
            return None
        try:
            return provenance.capability, spec.request.model_validate(provenance.request)
        except ValidationError:
            return None

    def respond(self, capability: str, request: WireModel, result: Any) -> WireModel:
        """The response, built by the role's own planner from the plan's outputs (or by the
        role's answer, when it builds one for this result)."""
        answer = self._answer_for(request)
        if answer is not None and answer.respond is not None:
            own = answer.respond(request, result)
            if own is not None:
                return own
        return self.deterministic.respond(capability, request, result)

    async def rederive(
        self,
        plan: Plan,
        repaired: Sequence[StepFailure] = (),
        *,
        served: Callable[[Plan], Plan] | None = None,
    ) -> list[str] | None:
        """Re-derive ``plan`` from its journal with no model (see ``rederive``): the differences
        ([]: none), or ``None`` when it is not a plan this planner made from model calls.

        Args:
            plan: The plan's newest revision.
            repaired: For a revision the model made while the plan ran, the failure each earlier
                revision ended with, oldest first (one per revision after the first).
            served: What the agent did to the first revision before running it (it marks the
                goal), so a repair is asked about the plan as it ran.
        """
        provenance = plan.provenance
        if provenance is None or not provenance.calls or plan.revision != 1 + len(repaired):
            return None
        request = self._request(provenance)
        if request is None:
            return ["the journal does not hold the request the plan answers"]
        return await rederive(self, request[0], request[1], plan, repaired=repaired, served=served)


async def rederive(
    planner: ModelPlanner,
    capability: str,
    request: WireModel,
    plan: Plan,
    *,
    repaired: Sequence[StepFailure] = (),
    served: Callable[[Plan], Plan] | None = None,
) -> list[str]:
    """Re-derive ``plan`` from its journal, with no model: the recorded answers are served in
    order to the same planner (same role, schema and checks), which plans the first revision and
    then repairs it after each failure in ``repaired``; the differences between the derived plan
    and ``plan`` ([]: none).

    A difference is named: other steps, the model asked something else than the journal
    recorded (a request digest differs), the journal running out of answers, or answers left
    over that the derivation never asked for.
    """
    provenance = plan.provenance
    if provenance is None:
        return ["the plan has no provenance to re-derive it from"]
    recorded = [
        ChatResponse(
            content=c.response,
            model=c.model,
            finish_reason=c.finish_reason,
            input_tokens=c.input_tokens,
            output_tokens=c.output_tokens,
        )
        for c in provenance.calls
    ]
    journal = ScriptedModelClient(recorded, model=planner.client.model)
    again = copy.copy(planner)  # the same role, schema and checks: only the model differs
    again.client = journal
    try:
        derived = await again.plan(capability, request, plan_id=plan.id)
        for number, failure in enumerate(repaired, start=2):
            if served is not None and number == 2:
                derived = served(derived)
            repair = await again.replan(derived, failure)
            if repair is None:
                return [f"revision {number}: the journal does not re-derive the model's repair"]
            derived = repair
    except (LogicError, PolicyError, TransientError) as exc:
        return [f"re-deriving from the journal failed: {_one_line(str(exc), 500)}"]
    # Steps, not the goal: the agent marks a served plan's goal with its request's digest.
    differences = []
    ours = [s.model_dump(mode="json", exclude={"status"}) for s in derived.steps]
    theirs = [s.model_dump(mode="json", exclude={"status"}) for s in plan.steps]
    if ours != theirs:
        differences.append("steps differs")
    digests = [c.request_digest for c in (derived.provenance.calls if derived.provenance else [])]
    if digests != [c.request_digest for c in provenance.calls[: len(digests)]]:
        differences.append("the model was asked something else than the journal recorded")
    if journal.remaining:
        differences.append(
            f"the journal holds {journal.remaining} model answer(s) the derivation never asked for"
        )
    return differences
