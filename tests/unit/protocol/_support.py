"""Test doubles for the protocol tests: sample models, a fake agent backend, model strategies."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from hypothesis import strategies as st
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from stratagem.protocol import (
    CAPABILITIES,
    DEFAULT_PLANS_PAGE,
    Action,
    AgentCard,
    AnalyzeNarrativeRequest,
    AnalyzeNarrativeResponse,
    Beat,
    CallContext,
    CapabilityCard,
    ControlRequest,
    Entity,
    ExtractEntitiesRequest,
    ExtractEntitiesResponse,
    FindSpatialContextRequest,
    FindSpatialContextResponse,
    InvalidArgumentError,
    ListWorldsRequest,
    ListWorldsResponse,
    NotFoundError,
    PlanEvent,
    PlanExecutionSequenceRequest,
    PlanExecutionSequenceResponse,
    PlanNarrativeArcRequest,
    PlanNarrativeArcResponse,
    PlanRevision,
    PlanSnapshot,
    PlansPage,
    PlansQuery,
    Relation,
    ReplayDivergence,
    ReplayResult,
    ResetWorldRequest,
    ResetWorldResponse,
    RevisionsResponse,
    RevisionStepChange,
    ShowWorldRequest,
    ShowWorldResponse,
    SpatialContext,
    SubmitGoalRequest,
    SubmitGoalResponse,
    UpdateWorldStateRequest,
    UpdateWorldStateResponse,
    WireModel,
    WorldSummary,
)

MIRA_IN_HALL = Relation(subject="mira", predicate="at", object="hall")
MIRA_IN_TOWER = Relation(subject="mira", predicate="at", object="tower")
HALL_TO_TOWER = Relation(subject="hall", predicate="connected", object="tower")
MIRA = Entity(id="mira", name="Mira", kind="character")
BEAT = Beat(
    id="reach_tower", title="Mira reaches the tower", purpose="rising", goals=[MIRA_IN_TOWER]
)
MOVE = Action(
    name="move",
    args=["mira", "hall", "tower"],
    preconditions=[MIRA_IN_HALL, HALL_TO_TOWER],
    adds=[MIRA_IN_TOWER],
    deletes=[MIRA_IN_HALL],
)

SAMPLES: dict[str, tuple[WireModel, WireModel]] = {
    "ExtractEntities": (
        ExtractEntitiesRequest(text="Mira waits in the hall."),
        ExtractEntitiesResponse(entities=[MIRA], relations=[MIRA_IN_HALL], world_version=3),
    ),
    "FindSpatialContext": (
        FindSpatialContextRequest(entity_ids=["mira"]),
        FindSpatialContextResponse(
            contexts=[SpatialContext(entity_id="mira", location="hall", neighbours=["tower"])],
            facts=[MIRA_IN_HALL, HALL_TO_TOWER],
        ),
    ),
    "UpdateWorldState": (
        UpdateWorldStateRequest(actions=[MOVE], dry_run=True),
        UpdateWorldStateResponse(added=[MIRA_IN_TOWER], removed=[MIRA_IN_HALL], world_version=4),
    ),
    "AnalyzeNarrative": (
        AnalyzeNarrativeRequest(text="Mira must reach the tower.", entities=[MIRA]),
        AnalyzeNarrativeResponse(
            protagonist="mira", themes=["quest"], tension=0.25, summary="Mira sets out."
        ),
    ),
    "PlanNarrativeArc": (
        PlanNarrativeArcRequest(
            goal="Mira reaches the tower", protagonist="mira", facts=[MIRA_IN_HALL], beats=1
        ),
        PlanNarrativeArcResponse(template="quest", beats=[BEAT]),
    ),
    "PlanExecutionSequence": (
        PlanExecutionSequenceRequest(beat=BEAT, facts=[MIRA_IN_HALL, HALL_TO_TOWER], max_depth=4),
        PlanExecutionSequenceResponse(beat_id="reach_tower", actions=[MOVE], states_explored=7),
    ),
    "SubmitGoal": (
        SubmitGoalRequest(
            goal="Mira reaches the tower", passage="Mira waits.", plan_id="goal-1", world="tale"
        ),
        SubmitGoalResponse(
            plan_id="goal-1",
            status="succeeded",
            beats=[BEAT],
            actions=[MOVE],
            added=[MIRA_IN_TOWER],
            world="tale",
        ),
    ),
    "ListWorlds": (
        ListWorldsRequest(prefix="goal-"),
        ListWorldsResponse(
            worlds=[WorldSummary(name="goal-1", version=2, entities=3, facts=4)], total=1
        ),
    ),
    "ShowWorld": (
        ShowWorldRequest(world="goal-1"),
        ShowWorldResponse(world="goal-1", version=2, entities=[MIRA], facts=[MIRA_IN_HALL]),
    ),
    "ResetWorld": (
        ResetWorldRequest(world="goal-1"),
        ResetWorldResponse(world="goal-1", version=3, entities_removed=1, facts_removed=1),
    ),
}

Behaviour = Callable[[WireModel, CallContext], Awaitable[WireModel]]


class FakeBackend:
    """An ``AgentBackend`` answering with ``SAMPLES``; ``behaviour`` overrides a capability."""

    def __init__(self, role: str = "perception") -> None:
        self._role = role
        self.calls: list[tuple[str, WireModel, CallContext]] = []
        self.behaviour: dict[str, Behaviour] = {}
        self.events: list[PlanEvent] = []
        self.snapshots: list[PlanSnapshot] = []
        self.controls: list[tuple[ControlRequest, CallContext]] = []

    @property
    def role(self) -> str:
        return self._role

    def card(self) -> AgentCard:
        return AgentCard(
            role=self._role,
            version="test",
            capabilities=[
                CapabilityCard.from_spec(spec)
                for spec in CAPABILITIES.values()
                if spec.role == self._role
            ],
            tools=["lookup"],
        )

    async def handle(self, capability: str, request: WireModel, ctx: CallContext) -> WireModel:
        self.calls.append((capability, request, ctx))
        behaviour = self.behaviour.get(capability)
        if behaviour is not None:
            return await behaviour(request, ctx)
        return SAMPLES[capability][1]

    async def watch(self, plan_id: str) -> AsyncIterator[PlanEvent]:
        if plan_id == "missing":
            raise NotFoundError(f"no plan {plan_id!r}")
        for event in self.events:
            await asyncio.sleep(0)
            if event.plan_id == plan_id or event.plan_id.startswith(plan_id + "/"):
                yield event

    def plans(self, plan_id: str) -> list[PlanSnapshot]:
        return [s for s in self.snapshots if not plan_id or s.plan_id.split("/")[0] == plan_id]

    async def history(self, query: PlansQuery, max_bytes: int) -> PlansPage:
        """The snapshots as pages: a token is an offset, each snapshot's cursor the next one."""
        held = self.plans(query.plan_id)
        start = int(query.page_token or 0)
        end = start + (query.page_size or DEFAULT_PLANS_PAGE)
        page = [
            snapshot.model_copy(update={"cursor": str(index)})
            for index, snapshot in enumerate(held[start:end], start + 1)
        ]
        return PlansPage(plans=page, next_page_token=str(end) if end < len(held) else "")

    async def run_plan(
        self, plan_json: str, ctx: CallContext, *, until_blocked: bool = False
    ) -> PlanSnapshot:
        self.calls.append(("RunPlan", PlanSnapshot(plan_id="p", agent="x", status="x"), ctx))
        if "cycle" in plan_json:
            raise InvalidArgumentError("plan 'p' refused: cycle: a -> b -> a")
        return PlanSnapshot(
            plan_id="user-plan",
            agent=self._role,
            revision=1,
            status="succeeded",
            plan_json=plan_json,
        )

    async def control(self, request: ControlRequest, ctx: CallContext) -> PlanSnapshot:
        self.controls.append((request, ctx))
        if request.plan_id == "missing":
            raise NotFoundError(f"no plan {request.plan_id!r}")
        return PlanSnapshot(
            plan_id=request.plan_id, agent=self._role, revision=1, status=request.action
        )

    async def revisions(self, plan_id: str) -> RevisionsResponse:
        if plan_id == "missing":
            raise NotFoundError(f"no plan {plan_id!r}")
        return RevisionsResponse(
            plan_id=plan_id,
            agent=self._role,
            revisions=[
                PlanRevision(revision=1),
                PlanRevision(
                    revision=2,
                    parent=1,
                    author="operator",
                    rationale="why",
                    added=["c"],
                    changed=[RevisionStepChange(step_id="b", fields=["input"])],
                    carried=["a"],
                    at=1.5,
                ),
            ],
        )

    async def replay(self, plan_id: str, ctx: CallContext) -> ReplayResult:
        self.calls.append(("Replay", PlanSnapshot(plan_id=plan_id, agent="x", status="x"), ctx))
        if plan_id == "missing":
            raise NotFoundError(f"no plan {plan_id!r}")
        divergences = (
            [ReplayDivergence(step_id="b", decision="output", recorded="1", replayed="2")]
            if plan_id == "diverged"
            else []
        )
        return ReplayResult(
            plan_id=plan_id,
            agent=self._role,
            revision=1,
            recorded_status="succeeded",
            replayed_status="succeeded",
            decisions=9,
            divergences=divergences,
        )


# --- hypothesis strategies built from the models' own constraints -----------------------------


def _constraint(metadata: list[Any], name: str) -> Any:
    for item in metadata:
        if isinstance(item, FieldInfo):
            found = _constraint(list(item.metadata), name)
            if found is not None:
                return found
        value = getattr(item, name, None)
        if value is not None:
            return value
    return None


def _strategy(annotation: Any, metadata: list[Any]) -> st.SearchStrategy[Any]:
    while get_origin(annotation) is Annotated:
        annotation, *extra = get_args(annotation)
        metadata = [*metadata, *extra]
    origin = get_origin(annotation)
    if origin in (Union, UnionType) and type(None) in get_args(annotation):
        (present,) = [arg for arg in get_args(annotation) if arg is not type(None)]
        return st.none() | _strategy(present, metadata)
    if origin is list:
        low = _constraint(metadata, "min_length") or 0
        high = min(_constraint(metadata, "max_length") or 3, low + 3)
        # Items drawn distinct: a model may refuse a name given twice (SubmitGoal's consult).
        item = _strategy(get_args(annotation)[0], [])
        return st.lists(item, min_size=low, max_size=high, unique_by=repr)
    if origin is Literal:
        return st.sampled_from(get_args(annotation))
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return model_strategy(annotation)
    if annotation is bool:
        return st.booleans()
    low, high = _constraint(metadata, "ge"), _constraint(metadata, "le")
    if annotation is int:
        return st.integers(min_value=low, max_value=high)
    if annotation is float:
        return st.floats(min_value=low, max_value=high, allow_nan=False, allow_infinity=False)
    if annotation is str:
        pattern = _constraint(metadata, "pattern")
        if pattern is not None:
            return st.from_regex(pattern, fullmatch=True)
        low = _constraint(metadata, "min_length") or 0
        high = min(_constraint(metadata, "max_length") or 40, 40)
        return st.text(st.characters(codec="utf-8"), min_size=low, max_size=high)
    raise TypeError(f"no strategy for {annotation!r}")


def model_strategy(model: type[BaseModel]) -> st.SearchStrategy[Any]:
    """Valid instances of ``model``, drawn from the constraints its fields declare."""
    fields = {
        name: _strategy(info.annotation, list(info.metadata))
        for name, info in model.model_fields.items()
    }
    return st.fixed_dictionaries(fields).map(model.model_validate)
