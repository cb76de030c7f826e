"""An agent of your own: the critic, which reviews another agent's plan.

The module defines a whole agent with ``define_agent`` when it is imported: its role (``critic``),
its tools, its plan type (``CriticPlan``: its tool steps may name only the critic's tools), its
planner, its capability (``ReviewPlan``) and the policy entries that let the orchestrator call it.
``stratagem up`` deploys it as a fifth Ray actor beside the built-in four::

    export STRATAGEM_EXTENSIONS=examples.extensions.critic
    stratagem up
    stratagem status                      # five agents: the built-in four and the critic
    stratagem describe critic             # ReviewPlan, its schemas, the critic's tools
    stratagem request critic ReviewPlan --json '{"plan": {"id": "p", "owner": "strategic",
        "goal": "g", "steps": [{"kind": "tool", "id": "a", "tool": "score_themes",
        "input": {"text": "Mira waits."}}]}}'
    stratagem plans run examples/plans/critic-review.yaml   # the orchestrator asks the critic

A review reads the plan as its owner would (every plan's fields, steps, dependencies and
references; cross-agent targets and capabilities), measures its DAG, and weighs what could go
wrong (no budget, gates, steps no retry protects, another agent's tools). Its verdict is
``unsound`` when the owner would refuse the plan, ``concerns`` when only warnings were found, else
``sound``.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from stratagem.agents import ROLE_TYPES, define_agent, tool
from stratagem.planning import (
    CrossAgentStep,
    GateStep,
    LogicError,
    Plan,
    PlanResult,
    PlanValidationError,
    ToolStep,
    find_cycle,
    ref,
    topological_layers,
    validate_plan,
)
from stratagem.protocol import EXTENSION_FIELD, CapabilitySpec, WireModel

# --- the capability ------------------------------------------------------------------------------


class ReviewPlanRequest(WireModel):
    """Review a plan (what a plan file holds: id, owner, goal, steps): ``plan`` as an object, or
    ``plan_json`` as JSON text (inside another plan's step, where ``{"$ref": ...}`` in an object
    would be that plan's reference)."""

    plan: dict[str, Any] | None = Field(default=None, description="The plan, as an object.")
    plan_json: str = Field(default="", max_length=500_000, description="Or the plan as JSON.")

    @field_validator("plan_json")
    @classmethod
    def _an_object(cls, value: str) -> str:
        if value:
            try:
                loaded = json.loads(value)
            except ValueError:
                raise ValueError("is not valid JSON") from None
            if not isinstance(loaded, dict):
                raise ValueError("is not a JSON object")
        return value

    @model_validator(mode="after")
    def _one_plan(self) -> ReviewPlanRequest:
        if (self.plan is None) == (not self.plan_json):
            raise ValueError("give the plan as plan or as plan_json, not both or neither")
        return self

    def reviewed(self) -> dict[str, Any]:
        """The plan under review."""
        if self.plan is not None:
            return self.plan
        loaded: dict[str, Any] = json.loads(self.plan_json)
        return loaded


class Finding(WireModel):
    """One thing the critic noticed."""

    severity: Literal["error", "warning", "info"]
    step: str = Field(default="", max_length=64)
    message: str = Field(max_length=500)


class ReviewPlanResponse(WireModel):
    """The verdict, the findings, and the plan's shape."""

    plan_id: str = Field(max_length=200)
    owner: str = Field(max_length=64)
    verdict: Literal["sound", "concerns", "unsound"]
    findings: list[Finding] = Field(default_factory=list, max_length=200)
    steps: int = Field(ge=0)
    depth: int = Field(ge=0, description="The longest chain of dependencies, in steps.")
    width: int = Field(ge=0, description="The most steps that can run at once.")


REVIEW_PLAN = CapabilitySpec(
    name="ReviewPlan",
    role="critic",
    field=EXTENSION_FIELD,
    request=ReviewPlanRequest,
    response=ReviewPlanResponse,
)

# --- the tools -----------------------------------------------------------------------------------

_MAX_FINDINGS = 60


class Outline(WireModel):
    """What the plan is and its shape; ``findings`` when it is not a plan at all."""

    plan_id: str = ""
    owner: str = ""
    steps: int = 0
    depth: int = 0
    width: int = 0
    findings: list[Finding] = Field(default_factory=list)


class Findings(WireModel):
    """The findings of one check."""

    findings: list[Finding] = Field(default_factory=list)


class Verdict(WireModel):
    """Every finding, errors first, and what they add up to."""

    verdict: Literal["sound", "concerns", "unsound"]
    findings: list[Finding] = Field(default_factory=list)


def _read(plan: dict[str, Any]) -> Plan:
    """The plan as every plan is read: its typed fields (a role's own) are left aside."""
    return Plan.model_validate({key: plan[key] for key in Plan.model_fields if key in plan})


def _load(plan_json: str) -> dict[str, Any]:
    loaded = json.loads(plan_json)
    if not isinstance(loaded, dict):
        raise LogicError("the plan is not a JSON object")
    return loaded


def _text(value: object, limit: int) -> str:
    return str(value)[:limit]


@tool
async def outline_plan(plan_json: str) -> Outline:
    """Read the plan and measure its DAG: how many steps, how deep, how wide."""
    plan = _load(plan_json)
    try:
        read = _read(plan)
    except ValidationError as exc:
        findings = [
            Finding(
                severity="error",
                message=_text(
                    "not a plan: "
                    + ".".join(str(part) for part in error["loc"])
                    + f": {error['msg']}",
                    500,
                ),
            )
            for error in exc.errors(include_url=False, include_input=False)[:_MAX_FINDINGS]
        ]
        return Outline(
            plan_id=_text(plan.get("id", ""), 200),
            owner=_text(plan.get("owner", ""), 64),
            findings=findings,
        )
    if find_cycle(read.steps) is not None:
        depth = width = 0  # the rules check names the cycle
    else:
        ids = {step.id for step in read.steps}
        known = [
            step.model_copy(update={"depends_on": [d for d in step.depends_on if d in ids]})
            for step in read.steps
        ]
        layers = topological_layers(known)
        depth, width = len(layers), max((len(layer) for layer in layers), default=0)
    return Outline(
        plan_id=read.id, owner=read.owner, steps=len(read.steps), depth=depth, width=width
    )


@cache
def _builtin_tools() -> dict[str, str]:
    """Each built-in agent's tools -> its role."""
    return {name: role for role, kind in ROLE_TYPES.items() for name in kind().registry.names()}


@tool
async def check_rules(plan_json: str) -> Findings:
    """The rules the plan's owner checks before it runs a plan: a DAG, references that name
    dependencies, cross-agent steps to other agents' capabilities, and tools of its own."""
    try:
        read = _read(_load(plan_json))
    except ValidationError:
        return Findings()  # the outline says why
    named = {step.tool for step in read.steps if isinstance(step, ToolStep)}
    named |= {step.compensate for step in read.steps if step.compensate}
    findings = []
    try:
        # The critic does not hold the owner's registry: the tools are judged below instead.
        validate_plan(read, tools=named)
    except PlanValidationError as exc:
        findings = [Finding(severity="error", message=_text(p, 500)) for p in exc.problems]
    owners = _builtin_tools()
    for step in read.steps:
        if isinstance(step, ToolStep) and owners.get(step.tool, read.owner) != read.owner:
            findings.append(
                Finding(
                    severity="error",
                    step=step.id,
                    message=f"uses tool {step.tool!r}, the {owners[step.tool]} agent's: "
                    f"the {read.owner} agent will refuse it",
                )
            )
    return Findings(findings=findings[:_MAX_FINDINGS])


@tool
async def assess_risks(plan_json: str) -> Findings:
    """What could go wrong while it runs: no budget, people to wait for, steps no retry
    protects, nothing to undo a failed plan's effects."""
    try:
        read = _read(_load(plan_json))
    except ValidationError:
        return Findings()
    findings = []
    if not read.steps:
        findings.append(Finding(severity="error", message="the plan has no steps"))
    if read.budget is None:
        findings.append(
            Finding(
                severity="warning",
                message="no budget: nothing bounds its tool calls, cost or wall time",
            )
        )
    for step in read.steps:
        if isinstance(step, GateStep):
            findings.append(
                Finding(
                    severity="info",
                    step=step.id,
                    message=f"waits for a person: {step.prompt!r}"[:500],
                )
            )
        elif isinstance(step, CrossAgentStep) and step.retry.max_attempts <= 1:
            findings.append(
                Finding(
                    severity="warning",
                    step=step.id,
                    message=f"calls {step.target}.{step.capability} once: a transient failure "
                    "fails the plan",
                )
            )
    if len(read.steps) > 1 and not any(step.compensate for step in read.steps):
        findings.append(
            Finding(
                severity="info",
                message="no step names a compensation: a failed plan leaves what it did",
            )
        )
    return Findings(findings=findings[:_MAX_FINDINGS])


_ORDER = {"error": 0, "warning": 1, "info": 2}


@tool
async def weigh_findings(
    outline: list[Finding], rules: list[Finding], risks: list[Finding]
) -> Verdict:
    """Every finding, errors first, and the verdict they add up to."""
    found = sorted([*outline, *rules, *risks], key=lambda f: _ORDER[f.severity])
    severities = {finding.severity for finding in found}
    verdict: Literal["sound", "concerns", "unsound"] = (
        "unsound" if "error" in severities else "concerns" if "warning" in severities else "sound"
    )
    return Verdict(verdict=verdict, findings=found[:200])


# --- the plan type and the planner ---------------------------------------------------------------


class CriticPlan(Plan):
    """A critic's plan: the checks it runs on one reviewed plan.

    Attributes:
        reviewed: The id of the plan under review.
    """

    reviewed: str = Field(default="", max_length=200)


class CriticPlanner:
    """Plans ``ReviewPlan``: three checks side by side, then one verdict."""

    def plan(self, capability: str, request: WireModel, *, plan_id: str) -> CriticPlan:
        """The review's plan."""
        if not isinstance(request, ReviewPlanRequest):
            raise ValueError(f"the critic cannot plan {capability!r}")
        reviewed = request.reviewed()
        # The reviewed plan travels as text: its own references are not the critic plan's.
        text = json.dumps(reviewed)
        checks = [
            ToolStep(id=name, tool=tool_name, input={"plan_json": text})
            for name, tool_name in (
                ("outline", "outline_plan"),
                ("rules", "check_rules"),
                ("risks", "assess_risks"),
            )
        ]
        verdict = ToolStep(
            id="verdict",
            tool="weigh_findings",
            depends_on=["outline", "rules", "risks"],
            input={name: ref(f"{name}.findings") for name in ("outline", "rules", "risks")},
        )
        return CriticPlan(
            id=plan_id,
            owner="critic",
            goal=f"review plan {_text(reviewed.get('id', '?'), 200)!s}",
            reviewed=_text(reviewed.get("id", ""), 200),
            steps=[*checks, verdict],
        )

    def respond(self, capability: str, request: WireModel, result: PlanResult[Any]) -> WireModel:
        """The outline's shape and the verdict's findings."""
        outline = result.outputs["outline"]
        verdict = result.outputs["verdict"]
        return ReviewPlanResponse(
            plan_id=outline["plan_id"],
            owner=outline["owner"],
            verdict=verdict["verdict"],
            findings=verdict["findings"],
            steps=outline["steps"],
            depth=outline["depth"],
            width=outline["width"],
        )


# --- the agent -----------------------------------------------------------------------------------

CRITIC = define_agent(
    "critic",
    plan_type=CriticPlan,
    planner=CriticPlanner,
    tools=[outline_plan, check_rules, assess_risks, weigh_findings],
    capabilities=[REVIEW_PLAN],
    # Who may call the critic, and what: the orchestrator may ask for reviews and read its card
    # (the operator may call anything under the default policy).
    callers={"orchestrator": ["ReviewPlan", "Describe"]},
    # Whom the critic may call: like every built-in agent, it may ask any agent what it is.
    calls={"*": ["Describe"]},
    description="Reviews another agent's plan: its rules, its shape, its risks.",
)
