"""Who may call what on whom: a deny-by-default policy loaded from TOML.

A policy is a list of ``[[allow]]`` rules; a call is allowed when one rule matches it, refused
otherwise::

    [[allow]]
    caller = "orchestrator"
    target = "perception"
    capabilities = ["ExtractEntities", "FindSpatialContext"]

``target`` may be ``"*"`` (any agent) and ``capabilities`` may contain ``"*"`` (any capability).
``caller`` is always required: a rule matches any caller only when it says ``caller = "*"`` in so
many words, never because a key is missing. The other RPCs are authorized like capabilities, under
pseudo-capability names the RPC table declares (``protocol._service``): the read-only ones
(``READ_RPCS``: ``"Describe"``, ``"Watch"``, ``"Plans"``, ``"Revisions"``) and ``"RunPlan"``,
``"Replay"`` and ``"Control.<action>"``.

MCP tools are authorized by the same rules: an agent may use tool ``T`` of the MCP server ``S``
attached to it (``McpServerConfig``) when a rule names the agent as ``caller``, ``mcp.S`` as
``target`` in so many words (a ``"*"`` target never covers an MCP server) and ``T`` (or ``"*"``)
among its ``capabilities`` (``Policy.allows_tool``); the tools it may not use are not given to it.

The caller is the identity the server authenticated (today the ``x-stratagem-caller`` metadata
value, trusted; see the README); ``OPERATOR`` is the identity of the CLI's user.
"""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from stratagem.protocol._codec import field_path
from stratagem.protocol._errors import ProtocolUsageError
from stratagem.protocol._service import RPCS

__all__ = ["ANY", "MCP_TARGET_PREFIX", "OPERATOR", "READ_RPCS", "Policy", "PolicyRule"]

logger = logging.getLogger(__name__)

OPERATOR: Final = "operator"
"""The identity of the CLI's user."""

MCP_TARGET_PREFIX: Final = "mcp."
"""A policy rule's target ``mcp.<server>`` names the MCP server ``<server>`` of its caller."""

ANY: Final = "*"
"""The wildcard for a rule's target or capabilities (and, written explicitly, its caller)."""

READ_RPCS: Final[tuple[str, ...]] = tuple(
    spec.authorized_as for spec in RPCS.values() if spec.access == "read"
)
"""The read-only RPCs (``access="read"`` in the RPC table), authorized as pseudo-capabilities of
these names."""

_Name = Annotated[str, StringConstraints(pattern=r"^(\*|[A-Za-z][A-Za-z0-9_.-]{0,63})$")]


@dataclass(frozen=True, slots=True)
class PolicyRule:
    """One ``[[allow]]`` rule.

    Attributes:
        caller: The identity allowed to call, or ``"*"`` for any authenticated caller.
        target: The role called, or ``"*"`` for any.
        capabilities: The capabilities (and read RPCs) allowed; ``"*"`` among them allows any.
    """

    caller: str
    target: str
    capabilities: frozenset[str]

    def matches(self, caller: str, target: str, capability: str) -> bool:
        """Whether this rule allows ``caller`` to call ``capability`` on ``target``."""
        return (
            self.caller in (caller, ANY)
            and self.target in (target, ANY)
            and (capability in self.capabilities or ANY in self.capabilities)
        )


class _RuleFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    caller: _Name
    target: _Name
    capabilities: list[_Name] = Field(min_length=1)


class _PolicyFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    allow: list[_RuleFile] = Field(default_factory=list)


class Policy:
    """A deny-by-default authorization policy: an ordered list of allow rules.

    Args:
        rules: The rules; an empty policy allows nothing.
    """

    def __init__(self, rules: Iterable[PolicyRule] = ()) -> None:
        self._rules = tuple(rules)

    @property
    def rules(self) -> tuple[PolicyRule, ...]:
        """The allow rules, in file order."""
        return self._rules

    def allows(self, caller: str, target: str, capability: str) -> bool:
        """Whether any rule allows ``caller`` to call ``capability`` on ``target``.

        An empty caller, target or capability is never allowed, whatever the rules say.
        """
        if not (caller and target and capability):
            return False
        return any(rule.matches(caller, target, capability) for rule in self._rules)

    def allows_tool(self, agent: str, server: str, tool: str) -> bool:
        """Whether ``agent`` may use tool ``tool`` of its MCP server ``server``: a rule whose
        caller is ``agent`` (or ``"*"``) and whose target is exactly ``mcp.<server>`` names the
        tool or ``"*"``. Deny by default: no such rule, no tool.
        """
        if not (agent and server and tool):
            return False
        target = f"{MCP_TARGET_PREFIX}{server}"
        return any(
            rule.target == target and rule.matches(agent, target, tool) for rule in self._rules
        )

    @classmethod
    def from_toml(cls, text: str, *, source: str = "<string>") -> Policy:
        """Parse a policy from TOML text.

        Args:
            text: The TOML document.
            source: Where it came from, for error messages.

        Returns:
            The policy.

        Raises:
            ProtocolUsageError: A one-line message naming the first problem (syntax, unknown key,
                missing key, malformed name, empty capability list).
        """
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ProtocolUsageError(f"invalid policy {source}: TOML syntax: {exc}") from None
        try:
            parsed = _PolicyFile.model_validate(data)
        except ValidationError as exc:
            error = exc.errors(include_url=False, include_input=False)[0]
            where = field_path(error["loc"]) or "policy"
            raise ProtocolUsageError(f"invalid policy {source}: {where}: {error['msg']}") from None
        if not parsed.allow:
            logger.warning("policy %s has no [[allow]] rules: every call will be denied", source)
        return cls(
            PolicyRule(rule.caller, rule.target, frozenset(rule.capabilities))
            for rule in parsed.allow
        )

    @classmethod
    def load(cls, path: str | Path) -> Policy:
        """Read a policy from a TOML file.

        Raises:
            ProtocolUsageError: When the file cannot be read or is not a valid policy.
        """
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ProtocolUsageError(f"cannot read policy {path}: {exc}") from None
        policy = cls.from_toml(text, source=str(path))
        logger.info("loaded policy %s with %d rules", path, len(policy.rules))
        return policy

    @classmethod
    def default(cls) -> Policy:
        """The policy shipped in ``protocol/default_policy.toml``."""
        text = (
            resources.files("stratagem.protocol").joinpath("default_policy.toml").read_text("utf-8")
        )
        return cls.from_toml(text, source="default_policy.toml")

    def __repr__(self) -> str:
        return f"Policy({len(self._rules)} rules)"
