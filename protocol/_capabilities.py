"""Capability models: the one place where each cross-agent request's constraints live.

Every capability has a request model and a response model. Their field names and shapes mirror the
protobuf messages in ``proto/stratagem/v1/agent.proto`` exactly; the generic codec in ``_codec.py``
converts between the two, and ``tests/unit/protocol/test_codec.py`` fails when they drift apart.

Constraints (lengths, ranges, patterns, required values) are declared here, on the pydantic models,
and nowhere else: the server validates every decoded request against them, the client validates
before sending, and ``Describe`` publishes their JSON Schema.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

from google.protobuf.message import Message
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
)

from stratagem.protocol._drift import schema_drift
from stratagem.protocol._intents import check_intents

__all__ = [
    "ALREADY_HOLDS",
    "CAPABILITIES",
    "CONSULT_PATTERN",
    "DEFAULT_WORLD",
    "EXTENSION_FIELD",
    "OPERATOR",
    "ROLES",
    "ROLE_PATTERN",
    "WORLD_PATTERN",
    "Action",
    "AnalyzeNarrativeRequest",
    "AnalyzeNarrativeResponse",
    "Beat",
    "CapabilitySpec",
    "Consultation",
    "Entity",
    "ExtractEntitiesRequest",
    "ExtractEntitiesResponse",
    "FindSpatialContextRequest",
    "FindSpatialContextResponse",
    "ListWorldsRequest",
    "ListWorldsResponse",
    "PlanExecutionSequenceRequest",
    "PlanExecutionSequenceResponse",
    "PlanNarrativeArcRequest",
    "PlanNarrativeArcResponse",
    "Relation",
    "ResetWorldRequest",
    "ResetWorldResponse",
    "Role",
    "ShowWorldRequest",
    "ShowWorldResponse",
    "SpatialContext",
    "SubmitGoalRequest",
    "SubmitGoalResponse",
    "UpdateWorldStateRequest",
    "UpdateWorldStateResponse",
    "WireModel",
    "WorldSummary",
    "capability_for",
    "register_capability",
    "register_role",
    "roles",
    "sensitive",
]

Role = Literal["strategic", "tactical", "perception", "orchestrator"]
"""A built-in role (an extension's agent adds a role of its own: see :func:`roles`)."""

OPERATOR: Final = "operator"
"""The identity of the CLI's user (never a role: ``register_role`` refuses it)."""

ROLES: Final[tuple[Role, ...]] = ("strategic", "tactical", "perception", "orchestrator")
"""The four built-in roles; :func:`roles` adds those extensions registered in this process."""
ROLE_PATTERN: Final = r"^[a-z][a-z0-9_]{0,31}$"
"""What a role's name must be: a lowercase identifier, at most 32 characters (it names the
agent's actor, files, database schema and service)."""
_ROLE: Final = re.compile(ROLE_PATTERN)
_EXTENSION_ROLES: list[str] = []

# An entity id: a lowercase slug. Kept short so ids stay readable in logs, spans and audit records.
Slug = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,63}$")]
Word = Annotated[str, StringConstraints(min_length=1, max_length=64)]
Text = Annotated[str, StringConstraints(min_length=1, max_length=20_000)]
Title = Annotated[str, StringConstraints(min_length=1, max_length=200)]
PlanId = Annotated[str, StringConstraints(pattern=r"^([A-Za-z0-9][A-Za-z0-9_.:/-]{0,199})?$")]


def _no_sub_plan_mark(plan_id: object) -> object:
    if isinstance(plan_id, str) and "/" in plan_id:
        raise ValueError(
            "a '/' marks a sub-plan's id (PLAN/STEP), which only the engine makes: a plan you "
            "name may not have one"
        )
    return plan_id


# The check before the pattern: its message says why ``/`` is refused.
NewPlanId = Annotated[
    str,
    BeforeValidator(_no_sub_plan_mark),
    StringConstraints(pattern=r"^([A-Za-z0-9][A-Za-z0-9_.:-]{0,199})?$"),
]
"""The id a caller gives a plan it starts: a ``PlanId`` without ``/`` (sub-plans are
``PLAN/STEP``; a user's plan must not pass for one)."""
WORLD_PATTERN: Final = r"^[a-z0-9][a-z0-9_.-]{0,63}$"
"""What a world's name must be: a lowercase letter or digit, then up to 63 letters, digits, ``_``,
``.`` or ``-`` (it names a file in the state directory)."""
DEFAULT_WORLD: Final = "default"
"""The world a perception request that names none acts on."""
WorldName = Annotated[str, StringConstraints(pattern=WORLD_PATTERN)]
# "" in a request: the default world (perception) or a fresh one (a goal).
OptionalWorldName = Annotated[str, StringConstraints(pattern=r"^([a-z0-9][a-z0-9_.-]{0,63})?$")]
# The largest value of a protobuf int32; every int field bound to one is bounded by it, so a valid
# model always encodes (the drift test checks the bound).
INT32_MAX: Final = 2**31 - 1


class WireModel(BaseModel):
    """Base of every model that crosses the wire: strict about unknown fields, immutable."""

    # defer_build: a model's validator is built when first used, not at import, so a process that
    # uses a few capabilities (the CLI's one request) does not pay for all of them at start.
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class Entity(WireModel):
    """A named thing in the story world."""

    id: Slug
    name: Title
    kind: Literal["character", "place", "object"]


class Relation(WireModel):
    """A world fact as a triple, e.g. ``(mira, at, courtyard)``."""

    subject: Slug
    predicate: Literal["at", "in", "has", "connected", "locked", "opens", "knows", "wants"]
    object: Slug


class Action(WireModel):
    """A ground world action with its preconditions and effects."""

    name: Word
    args: list[Slug] = Field(max_length=8)
    preconditions: list[Relation] = Field(default_factory=list, max_length=32)
    adds: list[Relation] = Field(default_factory=list, max_length=32)
    deletes: list[Relation] = Field(default_factory=list, max_length=32)


class Beat(WireModel):
    """A dramatic beat: a stage of the arc and the facts that hold once it is reached."""

    id: Slug
    title: Title
    purpose: str = Field(default="", max_length=500)
    goals: list[Relation] = Field(min_length=1, max_length=16)


# --- perception ------------------------------------------------------------------------------


class ExtractEntitiesRequest(WireModel):
    """Extract entities and relations from a passage and merge them into the world model."""

    text: Text
    world: OptionalWorldName = ""
    require_facts: bool = False


class ExtractEntitiesResponse(WireModel):
    """The entities and relations found, and the world model's version after merging them."""

    entities: list[Entity] = Field(default_factory=list, max_length=1000)
    relations: list[Relation] = Field(default_factory=list, max_length=5000)
    world_version: int = Field(default=0, ge=0, le=INT32_MAX)


class FindSpatialContextRequest(WireModel):
    """Where each named entity is, what it contains and (for places) where one can go from it."""

    entity_ids: list[Slug] = Field(min_length=1, max_length=100)
    world: OptionalWorldName = ""


class SpatialContext(WireModel):
    """Where one entity is, what it directly contains and, for a place, its neighbours."""

    entity_id: Slug
    location: str = Field(default="", max_length=64)
    contains: list[Slug] = Field(default_factory=list, max_length=1000)
    neighbours: list[Slug] = Field(default_factory=list, max_length=1000)


class FindSpatialContextResponse(WireModel):
    """The context of each entity asked about, and the world facts linked to those entities."""

    contexts: list[SpatialContext] = Field(default_factory=list, max_length=100)
    facts: list[Relation] = Field(default_factory=list, max_length=5000)


class UpdateWorldStateRequest(WireModel):
    """Apply actions to the world model in order, checking each precondition."""

    actions: list[Action] = Field(default_factory=list, max_length=500)
    dry_run: bool = False
    world: OptionalWorldName = ""


class UpdateWorldStateResponse(WireModel):
    """The facts the actions added and removed, and the world model's new version."""

    added: list[Relation] = Field(default_factory=list, max_length=5000)
    removed: list[Relation] = Field(default_factory=list, max_length=5000)
    world_version: int = Field(default=0, ge=0, le=INT32_MAX)


class ListWorldsRequest(WireModel):
    """The perception agent's worlds (those whose name starts with ``prefix``)."""

    prefix: str = Field(default="", max_length=64, pattern=r"^[a-z0-9_.-]*$")


class WorldSummary(WireModel):
    """One world: its name, its version and how much it holds."""

    name: WorldName
    version: int = Field(default=0, ge=0, le=INT32_MAX)
    entities: int = Field(default=0, ge=0, le=INT32_MAX)
    facts: int = Field(default=0, ge=0, le=INT32_MAX)


class ListWorldsResponse(WireModel):
    """The worlds by name (at most 1000) and how many match."""

    worlds: list[WorldSummary] = Field(default_factory=list, max_length=1000)
    total: int = Field(default=0, ge=0, le=INT32_MAX)


class ShowWorldRequest(WireModel):
    """Everything one world holds."""

    world: WorldName


class ShowWorldResponse(WireModel):
    """A world's entities and facts."""

    world: WorldName
    version: int = Field(default=0, ge=0, le=INT32_MAX)
    entities: list[Entity] = Field(default_factory=list, max_length=1000)
    facts: list[Relation] = Field(default_factory=list, max_length=5000)


class ResetWorldRequest(WireModel):
    """Empty one world: no entity, no fact (its version goes on)."""

    world: WorldName


class ResetWorldResponse(WireModel):
    """What the reset removed, and the emptied world's version."""

    world: WorldName
    version: int = Field(default=0, ge=0, le=INT32_MAX)
    entities_removed: int = Field(default=0, ge=0, le=INT32_MAX)
    facts_removed: int = Field(default=0, ge=0, le=INT32_MAX)


# --- strategic -------------------------------------------------------------------------------


class AnalyzeNarrativeRequest(WireModel):
    """Find the protagonist, themes and tension of a passage."""

    text: Text
    entities: list[Entity] = Field(default_factory=list, max_length=1000)


class AnalyzeNarrativeResponse(WireModel):
    """The passage's protagonist, themes, tension (0..1) and a short summary."""

    protagonist: str = Field(default="", max_length=64)
    themes: list[Word] = Field(default_factory=list, max_length=16)
    tension: float = Field(default=0.0, ge=0.0, le=1.0)
    summary: str = Field(default="", max_length=2000)


class PlanNarrativeArcRequest(WireModel):
    """Decompose a goal into dramatic beats (HTN-style, from arc templates)."""

    goal: Title
    protagonist: Slug
    themes: list[Word] = Field(default_factory=list, max_length=16)
    facts: list[Relation] = Field(default_factory=list, max_length=5000)
    beats: int = Field(default=3, ge=1, le=8)


class PlanNarrativeArcResponse(WireModel):
    """The arc template chosen and its beats, in order."""

    template: str = Field(default="", max_length=64)
    beats: list[Beat] = Field(default_factory=list, max_length=8)


# --- tactical --------------------------------------------------------------------------------


class PlanExecutionSequenceRequest(WireModel):
    """Find a sequence of world actions from ``facts`` that reaches the beat's goals."""

    beat: Beat
    facts: list[Relation] = Field(min_length=1, max_length=5000)
    prior_beats: list[Beat] = Field(default_factory=list, max_length=8)
    max_depth: int = Field(default=12, ge=1, le=32)


class PlanExecutionSequenceResponse(WireModel):
    """The actions that reach the beat's goals, and how many states the search explored."""

    beat_id: Slug
    actions: list[Action] = Field(default_factory=list, max_length=64)
    states_explored: int = Field(default=0, ge=0, le=INT32_MAX)


# --- orchestrator ----------------------------------------------------------------------------


CONSULT_PATTERN: Final = r"^[a-z][a-z0-9_-]{0,55}$"
"""What a goal's ``consult`` names must be: an external A2A agent's name (``STRATAGEM_A2A_AGENTS``)
of at most 56 characters (it names the goal's step ``consult_<name>``)."""
MAX_CONSULTED: Final = 8
"""The most external agents one goal may consult."""


class SubmitGoalRequest(WireModel):
    """Pursue a story goal across all agents.

    ``consult`` names external A2A agents (``STRATAGEM_A2A_AGENTS``) the orchestrator sends the
    goal, the passage and the arc's beats to; their answers come back in the response's
    ``consultations``. A failed consultation is recorded and the goal goes on, unless
    ``consult_required``: then it fails the goal before the world changes. ``detach``: answer once
    its plan runs (its ``plan_id`` and ``status``), the goal running on bound by no caller's
    deadline.
    """

    goal: Title
    passage: Text
    beats: int = Field(default=3, ge=1, le=8)
    plan_id: NewPlanId = ""
    world: OptionalWorldName = ""
    consult: list[Annotated[str, StringConstraints(pattern=CONSULT_PATTERN)]] = Field(
        default_factory=list, max_length=MAX_CONSULTED
    )
    consult_required: bool = False
    detach: bool = False

    @field_validator("consult")
    @classmethod
    def _once_each(cls, value: list[str]) -> list[str]:
        twice = sorted({name for name in value if value.count(name) > 1})
        if twice:
            raise ValueError(f"names {', '.join(twice)} more than once")
        return value


class Consultation(WireModel):
    """What one external A2A agent a goal consulted answered, or why it did not.

    Attributes:
        agent: Its name (``STRATAGEM_A2A_AGENTS``).
        status: ``answered``; ``failed`` (``error`` says why); ``skipped``: the goal stopped
            before it was asked.
        task_id: Its task's id ("" when it answered with a message).
        state: Its task's final state (``completed``, ...), or ``message``.
        text: Its text parts, joined by newlines.
        data_json: Its first JSON object part, as JSON ("" for none).
        error: Why the consultation failed ("" otherwise).
    """

    agent: str = Field(max_length=64)
    status: Literal["answered", "failed", "skipped"]
    task_id: str = Field(default="", max_length=400)
    state: str = Field(default="", max_length=32)
    text: str = Field(default="", max_length=1 << 20)
    data_json: str = Field(default="", max_length=4 << 20)
    error: str = Field(default="", max_length=2000)


class SubmitGoalResponse(WireModel):
    """The goal's plan, its final status, and the arc, actions and world changes it made."""

    plan_id: str = Field(max_length=200)
    status: str = Field(max_length=32)
    beats: list[Beat] = Field(default_factory=list, max_length=8)
    actions: list[Action] = Field(default_factory=list, max_length=512)
    added: list[Relation] = Field(default_factory=list, max_length=5000)
    removed: list[Relation] = Field(default_factory=list, max_length=5000)
    world: OptionalWorldName = ""
    note: str = Field(default="", max_length=2000)
    consultations: list[Consultation] = Field(default_factory=list, max_length=MAX_CONSULTED)


ALREADY_HOLDS: Final = "already_holds"
"""``SubmitGoalResponse.status`` of a goal whose arc held before any action (nothing was done)."""


# --- the registry of capabilities ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CapabilitySpec:
    """One capability: its name, the role that serves it, its models and its wire field.

    Attributes:
        name: The capability's name, e.g. ``"ExtractEntities"``.
        role: The role that serves it.
        field: The name of the ``oneof body`` field carrying it in the envelope.
        request: The pydantic request model.
        response: The pydantic response model.
        version: The capability's schema version; bumped on any incompatible change.
        wire: How an extension capability's value travels in ``ExtensionBody`` (built-in ones
            have a field of their own): ``"json"`` (its JSON), ``"struct"`` (a
            ``google.protobuf.Struct``) or ``"message"`` (``messages``, packed in an ``Any``).
            Whatever the form, both sides validate it with ``request`` / ``response``.
        messages: For ``wire="message"``: the protobuf classes of the request and response,
            compiled from the extension's own .proto; their fields must match the models.
        intents: Phrasings a person would use to ask for it, with ``{slot}``s naming fields of
            the request model (``"weather in {city}"``); the orchestrator's goal planner matches
            goals against them (``protocol._intents``; checked on registration). None: goals in
            plain words never choose it.
        side_effects: Whether it changes something outside the answer (a timer set, a world
            changed): a goal may wait at a gate for approval before such a step.
        cost: What one call costs in the deployment's own units (a tie-breaker between equally
            good matches: the cheaper wins), 0 or more.
    """

    name: str
    role: str
    field: str
    request: type[WireModel]
    response: type[WireModel]
    version: str = "1"
    wire: Literal["json", "struct", "message"] = "json"
    messages: tuple[type[Message], type[Message]] | None = None
    intents: tuple[str, ...] = ()
    side_effects: bool = False
    cost: float = 0.0


CAPABILITIES: Final[dict[str, CapabilitySpec]] = {
    spec.name: spec
    for spec in (
        CapabilitySpec(
            "ExtractEntities",
            "perception",
            "extract_entities",
            ExtractEntitiesRequest,
            ExtractEntitiesResponse,
            intents=("extract the entities of {text}", "read the passage {text}"),
            side_effects=True,
        ),
        CapabilitySpec(
            "FindSpatialContext",
            "perception",
            "find_spatial_context",
            FindSpatialContextRequest,
            FindSpatialContextResponse,
        ),
        CapabilitySpec(
            "UpdateWorldState",
            "perception",
            "update_world_state",
            UpdateWorldStateRequest,
            UpdateWorldStateResponse,
        ),
        CapabilitySpec(
            "ListWorlds",
            "perception",
            "list_worlds",
            ListWorldsRequest,
            ListWorldsResponse,
            intents=("list the worlds", "which worlds are there", "list worlds starting {prefix}"),
        ),
        CapabilitySpec(
            "ShowWorld",
            "perception",
            "show_world",
            ShowWorldRequest,
            ShowWorldResponse,
            intents=("show the world {world}", "what is in the world {world}"),
        ),
        CapabilitySpec(
            "ResetWorld",
            "perception",
            "reset_world",
            ResetWorldRequest,
            ResetWorldResponse,
            intents=("reset the world {world}", "empty the world {world}"),
            side_effects=True,
        ),
        CapabilitySpec(
            "AnalyzeNarrative",
            "strategic",
            "analyze_narrative",
            AnalyzeNarrativeRequest,
            AnalyzeNarrativeResponse,
        ),
        CapabilitySpec(
            "PlanNarrativeArc",
            "strategic",
            "plan_narrative_arc",
            PlanNarrativeArcRequest,
            PlanNarrativeArcResponse,
        ),
        CapabilitySpec(
            "PlanExecutionSequence",
            "tactical",
            "plan_execution_sequence",
            PlanExecutionSequenceRequest,
            PlanExecutionSequenceResponse,
        ),
        CapabilitySpec(
            "SubmitGoal",
            "orchestrator",
            "submit_goal",
            SubmitGoalRequest,
            SubmitGoalResponse,
        ),
    )
}


EXTENSION_FIELD: Final = "extension"


def sensitive(description: str = "", **constraints: Any) -> Any:
    """A field whose value must never be shown: ``secret: str = sensitive(max_length=64)``.

    The value is left out of the model's ``repr`` (so of logs and error messages that print the
    model), its JSON Schema says ``"x-sensitive": true``, and, as for every field, validation
    errors never quote it and audit records keep only the request's digest.
    """
    return Field(
        description=description or None,
        repr=False,
        json_schema_extra={"x-sensitive": True},
        **constraints,
    )


def register_capability(spec: CapabilitySpec) -> None:
    """Add a user's capability (carried in the envelope's ``extension`` body).

    Args:
        spec: The capability; its ``field`` must be ``"extension"``.

    Raises:
        ValueError: When the name is taken by another capability, the field is not
            ``extension``, the wire is unknown, or (``wire="message"``) the protobuf messages'
            fields differ from the models' (``schema_drift``): one line naming the difference;
            an intent that does not parse or names a slot that is not a field of the request
            model (``IntentError``: one line naming the capability, the intent and the slot).
    """
    check_intents(spec)
    if spec.field != EXTENSION_FIELD:
        raise ValueError(f"capability {spec.name!r}: an added capability uses field 'extension'")
    if spec.wire not in ("json", "struct", "message"):
        raise ValueError(
            f"capability {spec.name!r}: wire must be json, struct or message, not {spec.wire!r}"
        )
    if (spec.wire == "message") != (spec.messages is not None):
        raise ValueError(
            f"capability {spec.name!r}: wire 'message' and messages (request and response "
            "protobuf classes) go together"
        )
    if spec.messages is not None:
        for model, message in zip((spec.request, spec.response), spec.messages, strict=True):
            descriptor = getattr(message, "DESCRIPTOR", None)
            if not isinstance(message, type) or not issubclass(message, Message) or not descriptor:
                raise ValueError(f"capability {spec.name!r}: {message!r} is not a protobuf message")
            drift = schema_drift(model, descriptor)
            if drift:
                raise ValueError(
                    f"capability {spec.name!r}: {model.__name__} and {descriptor.full_name} "
                    f"differ: {'; '.join(drift[:3])}"
                )
    existing = CAPABILITIES.get(spec.name)
    if existing is not None and existing != spec:
        raise ValueError(f"capability {spec.name!r} is already registered for {existing.role}")
    CAPABILITIES[spec.name] = spec


def capability_for(role: str, name: str) -> CapabilitySpec | None:
    """The capability ``name`` served by ``role``, or ``None`` when that role does not serve it."""
    spec = CAPABILITIES.get(name)
    return spec if spec is not None and spec.role == role else None


# --- the registry of roles ---------------------------------------------------------------------


def register_role(name: str) -> None:
    """Add the role of an extension's agent (``agents.define_agent`` calls this).

    Args:
        name: The role; a lowercase identifier (``ROLE_PATTERN``).

    Raises:
        ValueError: The name is not a lowercase identifier, is the operator's identity, or is
            a role already (a built-in one or one registered before): one line naming it.
    """
    if not isinstance(name, str) or not _ROLE.fullmatch(name):
        raise ValueError(
            f"role {name!r} is not a lowercase identifier (a letter, then up to 31 letters, "
            "digits or underscores)"
        )
    if name == OPERATOR:
        raise ValueError(f"role {name!r} is the operator's identity, not an agent's")
    if name in ROLES:
        raise ValueError(f"role {name!r} is a built-in agent's")
    if name in _EXTENSION_ROLES:
        raise ValueError(f"role {name!r} is defined already")
    _EXTENSION_ROLES.append(name)


def roles() -> tuple[str, ...]:
    """Every role known in this process: the built-in ones, then those extensions registered (in
    the order they were)."""
    return (*ROLES, *_EXTENSION_ROLES)
