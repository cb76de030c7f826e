"""Model planners for the built-in roles: the model states what needs language, the agent's own
deterministic tools judge it.

* tactical: the model picks an action sequence from the actions grounded over the request's facts
  (an enum in the schema: it cannot invent an action), at most ``max_depth`` long; the plan is
  ``ground`` then ``verify`` (a re-simulation). Before the plan is accepted the sequence is
  simulated here: a precondition that does not hold, or a goal not reached, goes back as the
  critique. When every attempt fails, the A* plan is used (``fallback``).
* perception: for ``ExtractEntities`` the model reads the passage into entities (name and kind) and
  relations whose predicates are the world model's vocabulary (enums in the schema); names become
  ids as the rule-based extractor makes them, a relation must name extracted entities, and at least
  one character must be found. The plan merges them into the world. The regex extractor is the
  fallback; reading and changing the world (the other capabilities) stay with the rules.
* strategic and orchestrator: none yet; they keep their own planners. (The generic
  ``ModelPlanner``, where the model writes the whole plan over the agent's tools, is there for
  agents of your own; tried on the strategic agent with the 270M model it wrote no acceptable plan
  in three attempts of ~60 s each, so it is not wired to a built-in role.)

``model_planner(agent, client, config)`` builds the right one for an agent.
"""

from __future__ import annotations

from typing import Any

from stratagem.agents._actions import actors_for, ground_actions, simulate
from stratagem.agents._agent import Agent
from stratagem.agents._extract import slugify
from stratagem.agents._model import ModelClient
from stratagem.agents._model_planner import ModelPlanner, ModelPlanningConfig
from stratagem.agents._perception import PerceptionPlan, PerceptionPlanner, StateUpdate
from stratagem.agents._tactical import TacticalPlan, TacticalPlanner, TacticalStep, goals_of
from stratagem.planning import Budget, Plan, ToolStep
from stratagem.protocol import (
    Action,
    ExtractEntitiesRequest,
    PlanExecutionSequenceRequest,
    WireModel,
)

__all__ = ["PerceptionModelPlanner", "TacticalModelPlanner", "model_planner"]

_KINDS = ["character", "place", "object"]
_PREDICATES = ["at", "in", "has", "connected", "locked", "opens", "knows", "wants"]


def _label(action: Action) -> str:
    return f"{action.name}({','.join(action.args)})"


def _relation(fact: Any) -> str:
    return f"{fact.subject} {fact.predicate} {fact.object}"


class TacticalModelPlanner(ModelPlanner):
    """The tactical agent's model planner: a sequence chosen from the grounded actions."""

    def _grounded(self, request: PlanExecutionSequenceRequest) -> dict[str, Action]:
        goals = goals_of(request.beat, request.prior_beats)
        actors = actors_for(request.facts, goals)
        return {_label(g.action): g.action for g in ground_actions(request.facts, actors)}

    def system(self) -> str:
        return (
            "You plan a story's next actions. Answer with JSON: the list of actions, in order, "
            "that makes every goal fact true, using only the actions offered. Each action needs "
            "its preconditions to hold when it runs. Use as few actions as you can."
        )

    def ask(self, capability: str, request: WireModel) -> str:
        if not isinstance(request, PlanExecutionSequenceRequest):
            return super().ask(capability, request)
        goals = goals_of(request.beat, request.prior_beats)
        return (
            "Facts: "
            + "; ".join(_relation(f) for f in request.facts)
            + "\nGoals: "
            + "; ".join(_relation(g) for g in goals)
            + "\nActions offered: "
            + ", ".join(self._grounded(request))
        )

    def schema_for(self, capability: str, request: WireModel) -> dict[str, Any]:
        if not isinstance(request, PlanExecutionSequenceRequest):
            return self.schema
        labels = sorted(self._grounded(request))
        return {
            "type": "object",
            "additionalProperties": False,
            "required": ["actions"],
            "properties": {
                "actions": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": request.max_depth,
                    "items": {"type": "string", "enum": labels},
                }
            },
        }

    def build(
        self, answer: Any, capability: str, request: WireModel, plan_id: str
    ) -> tuple[Plan | None, list[str]]:
        if not isinstance(request, PlanExecutionSequenceRequest):
            return None, [f"the tactical model planner cannot plan {capability!r}"]
        chosen = answer.get("actions") if isinstance(answer, dict) else None
        if not isinstance(chosen, list) or not chosen:
            return None, ['the answer must be {"actions": [...]} with at least one action']
        if len(chosen) > request.max_depth:
            return None, [f"{len(chosen)} actions: more than the {request.max_depth} allowed"]
        grounded = self._grounded(request)
        unknown = [str(a) for a in chosen if a not in grounded]
        if unknown:
            return None, [f"not among the actions offered: {', '.join(unknown[:5])}"]
        actions = [grounded[label] for label in chosen]
        goals = goals_of(request.beat, request.prior_beats)
        facts = [f.model_dump() for f in request.facts]
        goal_data = [g.model_dump() for g in goals]
        steps = [
            ToolStep(
                id="ground", tool="ground_actions", input={"facts": facts, "goals": goal_data}
            ),
            ToolStep(
                id="verify",
                tool="verify_sequence",
                depends_on=["ground"],
                input={
                    "facts": facts,
                    "actions": [a.model_dump() for a in actions],
                    "goals": goal_data,
                },
            ),
        ]
        plan = TacticalPlan(
            id=plan_id,
            owner="tactical",
            goal=f"reach {request.beat.id} with the model's {len(actions)} actions"[:2000],
            steps=steps,
            execution_steps=[
                TacticalStep(step="ground", purpose="ground the actions open to the actors"),
                TacticalStep(step="verify", purpose="re-simulate the model's sequence"),
            ],
            dependencies={step.id: list(step.depends_on) for step in steps},
        )
        return plan, []


class PerceptionModelPlanner(ModelPlanner):
    """The perception agent's model planner: entities and relations read from ordinary prose."""

    async def plan(self, capability: str, request: WireModel, *, plan_id: str) -> Plan:
        if not isinstance(request, ExtractEntitiesRequest):
            # Reading and changing the world is exact work: the agent's own rules.
            return self.deterministic.plan(capability, request, plan_id=plan_id)
        return await super().plan(capability, request, plan_id=plan_id)

    def system(self) -> str:
        return (
            "You read a story passage and list its named entities and the facts between them. "
            "Kinds: character (a person or creature), place, object. Facts use only these "
            "predicates: at (a character at a place), in (an object in a place), has (a "
            "character has an object), connected (two places), locked (a place, to itself), "
            "opens (an object opens a place), knows, wants. Name entities as the text does."
        )

    def ask(self, capability: str, request: WireModel) -> str:
        text = request.text if isinstance(request, ExtractEntitiesRequest) else ""
        return f"Passage: {text}"

    def schema_for(self, capability: str, request: WireModel) -> dict[str, Any]:
        name = {"type": "string", "minLength": 1, "maxLength": 60}
        return {
            "type": "object",
            "additionalProperties": False,
            "required": ["entities", "relations"],
            "properties": {
                "entities": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 12,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["name", "kind"],
                        "properties": {"name": name, "kind": {"type": "string", "enum": _KINDS}},
                    },
                },
                "relations": {
                    "type": "array",
                    "maxItems": 16,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["subject", "predicate", "object"],
                        "properties": {
                            "subject": name,
                            "predicate": {"type": "string", "enum": _PREDICATES},
                            "object": name,
                        },
                    },
                },
            },
        }

    def build(
        self, answer: Any, capability: str, request: WireModel, plan_id: str
    ) -> tuple[Plan | None, list[str]]:
        if not isinstance(answer, dict):
            return None, ['the answer must be {"entities": [...], "relations": [...]}']
        problems: list[str] = []
        entities: dict[str, dict[str, str]] = {}
        for item in answer.get("entities") or []:
            if not isinstance(item, dict) or item.get("kind") not in _KINDS:
                problems.append(f"entity {item!r}: kind must be one of {', '.join(_KINDS)}")
                continue
            name = " ".join(str(item.get("name", "")).split())[:60]
            if not name:
                problems.append("an entity has no name")
                continue
            entities.setdefault(
                slugify(name), {"id": slugify(name), "name": name, "kind": item["kind"]}
            )
        if not any(e["kind"] == "character" for e in entities.values()):
            problems.append("no character was found: name at least one person or creature")
        relations = []
        for item in answer.get("relations") or []:
            if not isinstance(item, dict) or item.get("predicate") not in _PREDICATES:
                problems.append(
                    f"relation {item!r}: predicate must be one of {', '.join(_PREDICATES)}"
                )
                continue
            subject = slugify(str(item.get("subject", "")))
            obj = slugify(str(item.get("object", "")))
            missing = [n for n in (subject, obj) if n not in entities]
            if missing:
                problems.append(
                    f"relation {item.get('subject')} {item['predicate']} {item.get('object')} "
                    f"names {', '.join(missing)}, which is not among the entities"
                )
                continue
            relations.append({"subject": subject, "predicate": item["predicate"], "object": obj})
        if problems:
            return None, problems[:8]
        plan = PerceptionPlan(
            id=plan_id,
            owner="perception",
            goal="merge the entities and facts the model read in the passage",
            state_update_sequence=[
                StateUpdate(step="merge", operation="merge", description="the model's reading")
            ],
            steps=[
                ToolStep(
                    id="merge",
                    tool="merge_world",
                    input={"entities": list(entities.values()), "relations": relations},
                )
            ],
        )
        return plan, []


async def _simulate_judge(plan: Plan, request: WireModel) -> list[str]:
    """The tactical agent's judge: re-simulate the proposed sequence before accepting it."""
    if not isinstance(request, PlanExecutionSequenceRequest):
        return []
    verify = next((s for s in plan.steps if isinstance(s, ToolStep) and s.id == "verify"), None)
    if verify is None:
        return []
    actions = [Action.model_validate(a) for a in verify.input.get("actions", [])]
    goals = goals_of(request.beat, request.prior_beats)
    outcome = simulate(request.facts, actions, goals)
    if outcome.error:
        return [f"the sequence does not run: {outcome.error}"]
    if outcome.unmet:
        return [
            "after the sequence these goals are not reached: "
            + "; ".join(_relation(g) for g in outcome.unmet)
        ]
    return []


def model_planner(
    agent: Agent,
    client: ModelClient,
    config: ModelPlanningConfig | None = None,
    *,
    budget: Budget | None = None,
) -> ModelPlanner | None:
    """The model planner for ``agent``'s built-in capabilities (its own planner the fallback):
    the perception and tactical agents'; ``None`` for the others, which keep their own."""
    deterministic: Any = agent.planner
    if isinstance(agent.planner, PerceptionPlanner):
        return PerceptionModelPlanner(
            role=agent.role,
            plan_type=agent.plan_type,
            registry=agent.registry,
            client=client,
            deterministic=deterministic,
            config=config,
            budget=budget,
        )
    if isinstance(agent.planner, TacticalPlanner):
        return TacticalModelPlanner(
            role=agent.role,
            plan_type=agent.plan_type,
            registry=agent.registry,
            client=client,
            deterministic=deterministic,
            config=config,
            judge=_simulate_judge,
            budget=budget,
        )
    return None
