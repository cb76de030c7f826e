"""The artifact tools a plan may call: ``artifact.save``, ``artifact.load``, ``artifact.list``.

They are ordinary tools of the agent's registry, over the deployment's ``planning.ArtifactStore``,
given to an agent only as far as the policy grants them: a rule whose ``caller`` is the agent (or
``"*"``), whose ``target`` is ``"artifact"`` in so many words (a ``"*"`` target never covers it)
and whose ``capabilities`` name the tool's verb (``save``, ``load``, ``list``) or ``"*"``::

    [[allow]]
    caller = "tactical"
    target = "artifact"
    capabilities = ["save", "load", "list"]

Exactly once: ``artifact.save`` has side effects but is idempotent (the store answers the version
a step already saved when the same step saves the same bytes again), so a step in flight at a
crash is run again on resume, and the resumed plan ends with one version and no orphan blob.
Every record carries the step's provenance (agent, plan, revision, step, attempt, the input
digests the step names, the tool and its version).
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import TYPE_CHECKING, Any, Final, Literal

from opentelemetry import trace
from pydantic import BaseModel, ConfigDict, Field, model_validator

from stratagem.agents._tool import Tool
from stratagem.agents._wire import package_version
from stratagem.planning import (
    ARTIFACT_NAME_PATTERN,
    ArtifactCorruptError,
    ArtifactError,
    ArtifactInputError,
    ArtifactNotFoundError,
    ArtifactProvenance,
    ArtifactRecord,
    ArtifactStorageError,
    ArtifactStore,
    ClaimCheck,
    LogicError,
    ToolContext,
    TransientError,
)
from stratagem.protocol import Policy

if TYPE_CHECKING:
    from stratagem.agents._agent import Agent

__all__ = [
    "ARTIFACT_TARGET",
    "ARTIFACT_TOOLS",
    "ArtifactOut",
    "artifact_grants",
    "artifact_tools",
    "attach_artifact_tools",
]

ARTIFACT_TARGET: Final = "artifact"
"""The policy target that grants the artifact tools."""

ARTIFACT_TOOLS: Final = ("save", "load", "list")
"""The verbs, each a tool ``artifact.<verb>``."""

Scope = Literal["plan", "goal", "agent", "deployment"]
_DIGEST: Final = r"^(sha256:)?[0-9a-f]{64}$"


class ArtifactOut(BaseModel):
    """An artifact version as a tool's output shows it (what ``plans show`` recognises)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    version: int
    digest: str
    size: int
    media_type: str
    scope: Scope
    scope_id: str

    @classmethod
    def of(cls, record: ArtifactRecord) -> ArtifactOut:
        """The output form of ``record``."""
        return cls(
            name=record.name,
            version=record.version,
            digest=record.digest,
            size=record.size,
            media_type=record.media_type,
            scope=record.scope,
            scope_id=record.scope_id,
        )


class _Where(BaseModel):
    model_config = ConfigDict(extra="forbid")

    scope: Scope = Field("plan", description="What the artifact belongs to.")
    scope_id: str | None = Field(
        None,
        max_length=200,
        description="The plan, goal or agent id; the running plan's or agent's when omitted.",
    )


class SaveInput(_Where):
    """``artifact.save``: exactly one of ``text``, ``base64`` or ``json``."""

    name: str = Field(pattern=ARTIFACT_NAME_PATTERN, max_length=200)
    media_type: str = Field("", max_length=200, description="Default: by the content field.")
    text: str | None = None
    base64: str | None = None
    json_value: Any = Field(None, alias="json")
    inputs: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="SHA-256 digests of what the artifact was made from (provenance).",
    )

    @model_validator(mode="after")
    def _one_content(self) -> SaveInput:
        given = [n for n in ("text", "base64", "json_value") if n in self.model_fields_set]
        if len(given) != 1:
            raise ValueError("give exactly one of text, base64 or json")
        return self


class SaveOutput(BaseModel):
    """The version saved (or the one this step saved before)."""

    artifact: ArtifactOut


class LoadInput(_Where):
    """``artifact.load``: the newest version unless ``version`` is given."""

    name: str = Field(pattern=ARTIFACT_NAME_PATTERN, max_length=200)
    version: int | None = Field(None, ge=1)
    as_: Literal["text", "base64", "json"] = Field("text", alias="as")


class LoadOutput(BaseModel):
    """The artifact and its content: ``text``, ``base64``, or ``data`` (the parsed JSON)."""

    artifact: ArtifactOut
    text: str | None = None
    base64: str | None = None
    data: Any = None


class ListInput(BaseModel):
    """``artifact.list``: the newest version of each name, unless ``all_versions``."""

    model_config = ConfigDict(extra="forbid")

    scope: Scope = "plan"
    scope_id: str | None = Field(None, max_length=200)
    name: str | None = Field(None, pattern=ARTIFACT_NAME_PATTERN, max_length=200)
    all_versions: bool = False


class ListOutput(BaseModel):
    """The artifacts, by name then version."""

    artifacts: list[ArtifactOut]


def artifact_grants(policy: Policy, agent: str) -> tuple[str, ...]:
    """The verbs of ``ARTIFACT_TOOLS`` the policy grants ``agent`` (deny by default)."""
    return tuple(
        verb
        for verb in ARTIFACT_TOOLS
        if any(
            rule.target == ARTIFACT_TARGET and rule.matches(agent, ARTIFACT_TARGET, verb)
            for rule in policy.rules
        )
    )


def _scope_id(where: _Where, ctx: ToolContext) -> str:
    if where.scope_id is not None:
        return where.scope_id
    if where.scope == "plan":
        return ctx.plan_id
    if where.scope == "agent":
        return ctx.agent
    if where.scope == "deployment":
        return ""
    raise LogicError("scope_id: a goal's artifact needs its goal id")


def _failed(exc: ArtifactError) -> Exception:
    """A store error as the step failure it is: bad input or a missing or corrupt artifact is
    ``logic`` (the same input fails again), a backend failure ``transient``."""
    if isinstance(exc, ArtifactStorageError):
        return TransientError(str(exc))
    if isinstance(exc, ArtifactInputError | ArtifactNotFoundError | ArtifactCorruptError):
        return LogicError(str(exc))
    return LogicError(str(exc))


def _traced(record: ArtifactRecord) -> None:
    """The artifact on the current span (the step's): its digest, name, version and size."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes(
            {
                "stratagem.artifact.digest": record.digest,
                "stratagem.artifact.name": record.name,
                "stratagem.artifact.version": record.version,
                "stratagem.artifact.size": record.size,
            }
        )


def _content(data: SaveInput) -> tuple[bytes, str]:
    if data.text is not None:
        return data.text.encode(), data.media_type or "text/plain; charset=utf-8"
    if data.base64 is not None:
        try:
            return base64.b64decode(data.base64, validate=True), (
                data.media_type or "application/octet-stream"
            )
        except binascii.Error:
            raise LogicError("base64: not valid base64") from None
    return (
        json.dumps(data.json_value, separators=(",", ":"), sort_keys=True).encode(),
        data.media_type or "application/json",
    )


def artifact_tools(
    store: ArtifactStore, verbs: tuple[str, ...] = ARTIFACT_TOOLS
) -> list[Tool[Any, Any]]:
    """The tools ``artifact.<verb>`` over ``store``, for each verb of ``verbs``."""
    version = package_version()

    async def save(data: SaveInput, ctx: ToolContext) -> SaveOutput:
        content, media_type = _content(data)
        digests = tuple(d.removeprefix("sha256:") for d in data.inputs)
        try:
            record = await store.save(
                data.name,
                content,
                media_type=media_type,
                scope=data.scope,
                scope_id=_scope_id(data, ctx),
                provenance=ArtifactProvenance(
                    agent=ctx.agent,
                    plan_id=ctx.plan_id,
                    revision=ctx.revision,
                    step_id=ctx.step_id,
                    attempt=ctx.attempt,
                    inputs=digests,
                    tool="artifact.save",
                    tool_version=version,
                ),
            )
        except ArtifactError as exc:
            raise _failed(exc) from exc
        _traced(record)
        return SaveOutput(artifact=ArtifactOut.of(record))

    async def load(data: LoadInput, ctx: ToolContext) -> LoadOutput:
        try:
            record, content = await store.load(
                data.name, scope=data.scope, scope_id=_scope_id(data, ctx), version=data.version
            )
        except ArtifactError as exc:
            raise _failed(exc) from exc
        _traced(record)
        out = LoadOutput(artifact=ArtifactOut.of(record))
        if data.as_ == "base64":
            out.base64 = base64.b64encode(content).decode()
            return out
        try:
            text = content.decode()
        except UnicodeDecodeError:
            raise LogicError(f"as: {record.key} is not UTF-8 text; load it as base64") from None
        if data.as_ == "json":
            try:
                out.data = json.loads(text)
            except ValueError:
                raise LogicError(f"as: {record.key} is not JSON") from None
        else:
            out.text = text
        return out

    async def list_(data: ListInput, ctx: ToolContext) -> ListOutput:
        where = _Where(scope=data.scope, scope_id=data.scope_id)
        try:
            records = await store.list(
                scope=data.scope,
                scope_id=_scope_id(where, ctx),
                name=data.name,
                latest=not data.all_versions,
            )
        except ArtifactError as exc:
            raise _failed(exc) from exc
        return ListOutput(artifacts=[ArtifactOut.of(r) for r in records])

    made: dict[str, Tool[Any, Any]] = {
        "save": Tool(
            name="artifact.save",
            description="Save bytes as the next version of a named artifact, with provenance.",
            input_model=SaveInput,
            output_model=SaveOutput,
            fn=save,
            side_effects=True,
            idempotent=True,
        ),
        "load": Tool(
            name="artifact.load",
            description="Load a version of an artifact (digest checked).",
            input_model=LoadInput,
            output_model=LoadOutput,
            fn=load,
        ),
        "list": Tool(
            name="artifact.list",
            description="List the artifacts of a scope.",
            input_model=ListInput,
            output_model=ListOutput,
            fn=list_,
        ),
    }
    return [made[verb] for verb in verbs]


def attach_artifact_tools(agent: Agent, store: ArtifactStore, policy: Policy) -> tuple[str, ...]:
    """Register on ``agent`` the artifact tools ``policy`` grants it; their names. Its large
    tool outputs go out by reference to ``store`` too (``planning.ClaimCheck``, whatever the
    policy grants: the claim check is the engine's, not a tool).

    Call it before the agent's model planner is made and before any plan resumes (the tools are
    then in its answer schema and a resumed step finds its tool).
    """
    agent.use_claim_check(ClaimCheck(store))
    verbs = artifact_grants(policy, agent.role)
    for item in artifact_tools(store, verbs):
        agent.registry.register(item, replace=True)
    return tuple(f"{ARTIFACT_TARGET}.{verb}" for verb in verbs)
