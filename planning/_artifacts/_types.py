"""The artifact store's values: records, provenance, references, retention.

Frozen dataclasses (small internal values that also cross the API); the untrusted input (a name,
a media type, a scope) is checked by ``_checks`` before a record is made.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, get_args

__all__ = [
    "ARTIFACT_REF_KEY",
    "ARTIFACT_SCOPES",
    "ArtifactProvenance",
    "ArtifactRecord",
    "ArtifactRef",
    "ArtifactRetention",
    "ArtifactScope",
]

ArtifactScope = Literal["plan", "goal", "agent", "deployment"]
"""What an artifact belongs to: a plan (``scope_id`` the plan id), a goal (the goal id), an agent
(its role) or the whole deployment (``scope_id`` empty)."""

ARTIFACT_SCOPES: Final[tuple[ArtifactScope, ...]] = get_args(ArtifactScope)

ARTIFACT_REF_KEY: Final = "$artifact"
"""The key of a claim-check reference in a step's output: ``{"$artifact": {...}}``."""


@dataclass(frozen=True, slots=True)
class ArtifactProvenance:
    """Who made an artifact, and from what.

    Attributes:
        agent: The agent that saved it (its role; ``operator`` for a save from the CLI).
        plan_id: The plan whose step saved it ("" outside a plan).
        revision: The plan's revision.
        step_id: The step ("" outside a plan).
        attempt: The step's attempt (1 for the first).
        inputs: The SHA-256 digests (hex) of the step's inputs: artifacts it read, its input JSON.
        tool: The tool that made it (e.g. ``artifact.save``).
        tool_version: The tool's version ("" when the tool has none).
        time: When it was saved, in seconds since the epoch (the store's clock when 0).
    """

    agent: str = ""
    plan_id: str = ""
    revision: int = 0
    step_id: str = ""
    attempt: int = 0
    inputs: tuple[str, ...] = ()
    tool: str = ""
    tool_version: str = ""
    time: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """As a JSON object (``inputs`` a list)."""
        # Spelled out: ``dataclasses.asdict`` deep-copies field by field, a sizeable part of a
        # small save's cost (every save writes its provenance).
        return {
            "agent": self.agent,
            "plan_id": self.plan_id,
            "revision": self.revision,
            "step_id": self.step_id,
            "attempt": self.attempt,
            "inputs": list(self.inputs),
            "tool": self.tool,
            "tool_version": self.tool_version,
            "time": self.time,
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> ArtifactProvenance:
        """Read back what ``to_json`` wrote."""
        return cls(
            agent=str(value.get("agent", "")),
            plan_id=str(value.get("plan_id", "")),
            revision=int(value.get("revision", 0)),
            step_id=str(value.get("step_id", "")),
            attempt=int(value.get("attempt", 0)),
            inputs=tuple(str(d) for d in value.get("inputs", ())),
            tool=str(value.get("tool", "")),
            tool_version=str(value.get("tool_version", "")),
            time=float(value.get("time", 0.0)),
        )


@dataclass(frozen=True, slots=True)
class ArtifactRef:
    """A pointer to one version of an artifact: what a step output carries instead of the bytes.

    Attributes:
        scope: The artifact's scope.
        scope_id: Its scope's id.
        name: Its name.
        version: Its version (from 1).
        digest: The SHA-256 of its bytes (hex).
        size: Its size in bytes.
        media_type: Its media type.
    """

    scope: ArtifactScope
    scope_id: str
    name: str
    version: int
    digest: str
    size: int
    media_type: str

    @property
    def key(self) -> str:
        """``scope/scope_id/name@version`` (``deployment//name@1`` for the deployment)."""
        return f"{self.scope}/{self.scope_id}/{self.name}@{self.version}"

    def to_json(self) -> dict[str, Any]:
        """The claim-check form a step output carries: ``{"$artifact": {...}}``."""
        return {
            ARTIFACT_REF_KEY: {
                "scope": self.scope,
                "scope_id": self.scope_id,
                "name": self.name,
                "version": self.version,
                "digest": self.digest,
                "size": self.size,
                "media_type": self.media_type,
            }
        }

    @classmethod
    def from_json(cls, value: Any) -> ArtifactRef | None:
        """The reference in ``value`` when it is one (``to_json``'s form), else ``None``."""
        if not isinstance(value, Mapping) or set(value) != {ARTIFACT_REF_KEY}:
            return None
        body = value[ARTIFACT_REF_KEY]
        if not isinstance(body, Mapping) or body.get("scope") not in ARTIFACT_SCOPES:
            return None
        try:
            return cls(
                scope=body["scope"],
                scope_id=str(body["scope_id"]),
                name=str(body["name"]),
                version=int(body["version"]),
                digest=str(body["digest"]),
                size=int(body["size"]),
                media_type=str(body["media_type"]),
            )
        except (KeyError, TypeError, ValueError):
            return None

    @classmethod
    def in_output(cls, value: Any) -> builtins.list[ArtifactRef]:
        """The artifact versions a step output names: a claim-check reference (the output
        itself, ``{"$artifact": {...}}``) or the ``artifact`` field of the artifact tools'
        outputs (``{"artifact": {...}, ...}``)."""
        found = cls.from_json(value)
        if found is not None:
            return [found]
        if isinstance(value, Mapping) and isinstance(value.get("artifact"), Mapping):
            inner = cls.from_json({ARTIFACT_REF_KEY: value["artifact"]})
            if inner is not None:
                return [inner]
        return []


@dataclass(frozen=True, slots=True)
class ArtifactRecord:
    """One version of an artifact: its metadata (the bytes are a blob under ``digest``).

    Attributes:
        name: The artifact's name (letters, digits, ``.``, ``_``, ``-``; never ``..`` or ``/``).
        version: 1 for the first save of the name in its scope, then one more per new content.
        media_type: What the bytes are (``text/plain``, ``application/json``, ``image/png``...).
        size: The bytes' length.
        digest: The SHA-256 of the bytes, hex.
        scope: What the artifact belongs to.
        scope_id: The plan, goal or agent it belongs to ("" for the deployment).
        created_at: When this version was saved (seconds since the epoch).
        provenance: Who made it and from what.
    """

    name: str
    version: int
    media_type: str
    size: int
    digest: str
    scope: ArtifactScope
    scope_id: str
    created_at: float
    provenance: ArtifactProvenance = field(default_factory=ArtifactProvenance)

    @property
    def ref(self) -> ArtifactRef:
        """The reference to this version."""
        return ArtifactRef(
            self.scope,
            self.scope_id,
            self.name,
            self.version,
            self.digest,
            self.size,
            self.media_type,
        )

    @property
    def key(self) -> str:
        """``scope/scope_id/name@version``."""
        return self.ref.key

    def to_json(self) -> dict[str, Any]:
        """As a JSON object (what ``artifacts list --json`` prints, one per artifact)."""
        return {
            "name": self.name,
            "version": self.version,
            "media_type": self.media_type,
            "size": self.size,
            "digest": self.digest,
            "scope": self.scope,
            "scope_id": self.scope_id,
            "created_at": self.created_at,
            "provenance": self.provenance.to_json(),
        }


@dataclass(frozen=True, slots=True)
class ArtifactRetention:
    """How long a scope's artifacts are kept: versions older than ``max_age_s`` and versions of a
    name beyond its newest ``max_versions`` are removed by ``ArtifactStore.prune`` (``None``: no
    bound). The newest version of a name is kept by the count rule, never by the age rule alone
    unless ``keep_latest`` is false.

    Attributes:
        max_age_s: The age in seconds past which a version is removed.
        max_versions: How many of a name's newest versions are kept.
        keep_latest: Whether a name's newest version survives the age rule.
    """

    max_age_s: float | None = None
    max_versions: int | None = None
    keep_latest: bool = True

    def __post_init__(self) -> None:
        if self.max_age_s is not None and self.max_age_s < 0:
            raise ValueError("max_age_s: must be >= 0")
        if self.max_versions is not None and self.max_versions < 1:
            raise ValueError("max_versions: must be >= 1")
