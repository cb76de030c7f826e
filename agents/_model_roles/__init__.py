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
* strategic: for ``PlanNarrativeArc`` the model proposes the beats for any goal (a title and goal
  facts per beat, exactly as many beats as asked; entity ids and predicates are enums of the
  request's world in the schema). The plan is one step, ``check_arc``, and before it is accepted
  ``arc_problems`` judges it: every goal about a known entity, each beat adding a goal, goals that
  accumulate without placing anything twice, the protagonist involved. The HTN templates are the
  fallback; ``AnalyzeNarrative`` stays with the rules.
* orchestrator: for ``SubmitGoal`` the model chooses the decomposition: ``arc`` (the built-in
  pipeline: perception, a strategic arc, a tactical sequence per beat, apply) or ``direct`` for a
  goal that is one change of the world ("Mira goes to the garden"), which the arc templates do not
  fit: the model states the goal facts and the plan skips the strategic agent (extract, spatial,
  one tactical beat, apply). The entities a goal may name are those the passage's sentences name,
  read by the rules perception falls back on (their ids are an enum of the schema, and each must
  be of the kind its predicate relates); for prose those rules do not read, any name the passage
  contains. The plan is validated like any plan with cross-agent steps, and the tactical agent
  judges reachability while it runs. The built-in pipeline is the fallback. A goal that names
  external A2A agents to consult lets the model choose which of them (``consult``: an enum of the
  goal's names, so it cannot add one; all of them when ``consult_required``); an unknown name is
  refused before the model is asked.

(The generic ``ModelPlanner``, where the model writes the whole plan over the agent's tools, is
there for agents of your own; tried on the strategic agent with the 270M model it wrote no
acceptable plan in three attempts of ~60 s each, so a built-in role uses it only through the
narrower answers above.)

``model_planner(agent, client, config)`` builds the right one for an agent. Each role's answer
is data (a ``ModelAnswer``: its prompt, its schema, how the answer becomes its plan, its judge)
that the one ``ModelPlanner`` composes; the old class names (``PerceptionModelPlanner``, ...)
name those answers, and ``isinstance(planner, PerceptionModelPlanner)`` still tells which role's
answer a model planner asks for.
"""

from stratagem.agents._model_roles._factory import model_planner
from stratagem.agents._model_roles._orchestrator import ORCHESTRATOR_ANSWER
from stratagem.agents._model_roles._perception import PERCEPTION_ANSWER
from stratagem.agents._model_roles._strategic import STRATEGIC_ANSWER
from stratagem.agents._model_roles._tactical import TACTICAL_ANSWER

OrchestratorModelPlanner = ORCHESTRATOR_ANSWER
PerceptionModelPlanner = PERCEPTION_ANSWER
StrategicModelPlanner = STRATEGIC_ANSWER
TacticalModelPlanner = TACTICAL_ANSWER

__all__ = [
    "ORCHESTRATOR_ANSWER",
    "PERCEPTION_ANSWER",
    "STRATEGIC_ANSWER",
    "TACTICAL_ANSWER",
    "OrchestratorModelPlanner",
    "PerceptionModelPlanner",
    "StrategicModelPlanner",
    "TacticalModelPlanner",
    "model_planner",
]
