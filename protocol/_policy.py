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

The caller is the identity the server authenticated (a signed token's subject, a certificate's
identity, or with ``STRATAGEM_AUTH=none`` the trusted ``x-stratagem-caller`` metadata value; see
``docs/security.md``); ``OPERATOR`` is the identity of the CLI's user.

Memory (``docs/artifacts-memory.md``): ``[[memory]]`` rules grant an identity ``read`` and/or
``write`` on memory namespaces (``protocol._memory_grants``); no rule, no access.

Gates (``docs/gates.md``): the policy may name **roles** (``[roles]``, e.g. ``leads = ["ana",
"bo"]``) that a gate's deciders name as ``role:leads``; the **deciders** of an agent's gates that
name none (``[[gate]]`` with ``agent`` and ``deciders``); and **approvals** (``[[approval]]``):
calls of an agent's tool that wait for a person's approval first, optionally only ``when`` an
expression over their ``arguments`` holds, with who decides and what a timeout does::

    [roles]
    leads = ["ana", "bo"]

    [[gate]]
    agent = "tactical"
    deciders = ["role:leads"]

    [[approval]]
    agent = "tactical"
    tool = "ledger_append"
    when = "arguments.amount > `100`"
    deciders = ["operator"]
    timeout_s = 3600
    on_timeout = "reject"

Goals in plain words (``docs/goals.md``): ``[goals]`` with ``approve_side_effects = true`` holds
every goal's steps that have side effects at the goal's gate ``approve`` until someone approves,
as the goal's own ``approve`` does (the orchestrator's ``[[gate]]`` deciders decide it)::

    [goals]
    approve_side_effects = true
"""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

from stratagem.protocol._capabilities import OPERATOR
from stratagem.protocol._codec import field_path
from stratagem.protocol._errors import ProtocolUsageError
from stratagem.protocol._memory_grants import MemoryAccess, MemoryRule, MemoryRuleFile
from stratagem.protocol._service import RPCS

__all__ = [
    "ANY",
    "MCP_TARGET_PREFIX",
    "OPERATOR",
    "READ_RPCS",
    "ROLE_PREFIX",
    "ApprovalRule",
    "Policy",
    "PolicyRule",
]

logger = logging.getLogger(__name__)

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
_Identity = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_-]{0,63}$")]
_Decider = Annotated[str, StringConstraints(pattern=r"^(role:)?[a-z][a-z0-9_-]{0,63}$")]

ROLE_PREFIX: Final = "role:"
"""A gate's decider ``role:NAME`` names the members of the policy's role ``NAME``."""


@dataclass(frozen=True, slots=True)
class ApprovalRule:
    """An ``[[approval]]`` of the policy: calls of ``agent``'s ``tool`` wait for an approval.

    Attributes:
        agent: The agent whose tool it is (``"*"``: any agent's tool of that name).
        tool: The tool.
        when: An expression over the call's ``arguments``; asked only when it holds (``None``:
            always). Checked by the agent that takes the rule up.
        prompt: What the approver is asked (the tool and its arguments are shown anyway).
        deciders: Who may decide (identities, ``role:NAME``; empty: as the agent's gates).
        timeout_s: Seconds after which ``on_timeout`` decides (``None``: never).
        on_timeout: ``reject``, ``approve`` or ``escalate``.
        escalate_after_s: Seconds undecided after which the gate passes to ``escalate_to``.
        escalate_to: Who decides once it escalated.
    """

    agent: str
    tool: str
    when: str | None = None
    prompt: str = ""
    deciders: tuple[str, ...] = ()
    timeout_s: float | None = None
    on_timeout: Literal["reject", "approve", "escalate"] = "reject"
    escalate_after_s: float | None = None
    escalate_to: tuple[str, ...] = ()


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


class _GateFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    agent: _Name
    deciders: list[_Decider] = Field(min_length=1, max_length=64)


class _ApprovalFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    agent: _Name
    tool: _Name
    when: str | None = Field(default=None, min_length=1, max_length=2000)
    prompt: str = Field(default="", max_length=2000)
    deciders: list[_Decider] = Field(default_factory=list, max_length=64)
    timeout_s: float | None = Field(default=None, gt=0.0)
    on_timeout: Literal["reject", "approve", "escalate"] = "reject"
    escalate_after_s: float | None = Field(default=None, gt=0.0)
    escalate_to: list[_Decider] = Field(default_factory=list, max_length=64)

    @model_validator(mode="after")
    def _fits(self) -> _ApprovalFile:
        escalates = self.escalate_after_s is not None or self.on_timeout == "escalate"
        if escalates and not self.escalate_to:
            raise ValueError("it escalates but names no one in escalate_to")
        if self.on_timeout != "reject" and self.timeout_s is None:
            raise ValueError("on_timeout needs timeout_s")
        return self


class _GoalsFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    approve_side_effects: bool = False


class _PolicyFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    goals: _GoalsFile = Field(default_factory=_GoalsFile)
    allow: list[_RuleFile] = Field(default_factory=list)
    roles: dict[_Identity, list[_Identity]] = Field(default_factory=dict)
    gate: list[_GateFile] = Field(default_factory=list)
    approval: list[_ApprovalFile] = Field(default_factory=list)
    memory: list[MemoryRuleFile] = Field(default_factory=list)


class Policy:
    """A deny-by-default authorization policy: an ordered list of allow rules.

    Args:
        rules: The rules; an empty policy allows nothing.
    """

    def __init__(
        self,
        rules: Iterable[PolicyRule] = (),
        *,
        roles: Mapping[str, Iterable[str]] | None = None,
        gate_deciders: Mapping[str, Sequence[str]] | None = None,
        approvals: Iterable[ApprovalRule] = (),
        memory: Iterable[MemoryRule] = (),
        approve_goal_side_effects: bool = False,
    ) -> None:
        self._rules = tuple(rules)
        self._memory = tuple(memory)
        self._approve_goal_side_effects = approve_goal_side_effects
        self._roles = {name: frozenset(members) for name, members in (roles or {}).items()}
        self._gate_deciders = {agent: tuple(d) for agent, d in (gate_deciders or {}).items()}
        self._approvals = tuple(approvals)

    @property
    def rules(self) -> tuple[PolicyRule, ...]:
        """The allow rules, in file order."""
        return self._rules

    @property
    def callers(self) -> frozenset[str]:
        """The identities the rules name as callers (the wildcard aside)."""
        return frozenset(rule.caller for rule in self._rules if rule.caller != ANY)

    def allows(self, caller: str, target: str, capability: str) -> bool:
        """Whether any rule allows ``caller`` to call ``capability`` on ``target``.

        An empty caller, target or capability is never allowed, whatever the rules say.
        """
        if not (caller and target and capability):
            return False
        return any(rule.matches(caller, target, capability) for rule in self._rules)

    @property
    def approve_goal_side_effects(self) -> bool:
        """Whether a goal in plain words waits for an approval before its steps that have side
        effects, whether or not it asked to (``[goals] approve_side_effects``)."""
        return self._approve_goal_side_effects

    @property
    def roles(self) -> Mapping[str, frozenset[str]]:
        """Each role of ``[roles]`` and its members (the identities a ``role:NAME`` names)."""
        return self._roles

    def gate_deciders(self, agent: str) -> tuple[str, ...]:
        """Who decides ``agent``'s gates that name no one (``[[gate]]``; empty: anyone allowed
        to call ``Control.approve``)."""
        return self._gate_deciders.get(agent) or self._gate_deciders.get(ANY, ())

    def approvals(self, agent: str) -> tuple[ApprovalRule, ...]:
        """The ``[[approval]]`` rules for ``agent``'s tools, in file order."""
        return tuple(rule for rule in self._approvals if rule.agent in (agent, ANY))

    def may_decide(self, identity: str, deciders: Sequence[str], agent: str) -> bool:
        """Whether ``identity`` may decide a gate of ``agent`` whose deciders are ``deciders``
        (empty: the agent's ``[[gate]]`` deciders; none there either: yes, anyone the policy
        lets call ``Control.approve``). A decider names an identity or ``role:NAME``."""
        named = tuple(deciders) or self.gate_deciders(agent)
        if not named:
            return True
        for decider in named:
            if decider == identity:
                return True
            if decider.startswith(ROLE_PREFIX) and identity in self._roles.get(
                decider[len(ROLE_PREFIX) :], ()
            ):
                return True
        return False

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

    @property
    def memory_rules(self) -> tuple[MemoryRule, ...]:
        """The ``[[memory]]`` rules, in file order."""
        return self._memory

    def allows_memory(self, caller: str, namespace: Sequence[str], access: MemoryAccess) -> bool:
        """Whether ``caller`` may ``access`` (``read`` or ``write``) the memory ``namespace``: a
        ``[[memory]]`` rule grants it (``protocol._memory_grants``). Deny by default."""
        if not (caller and namespace):
            return False
        return any(rule.matches(caller, namespace, access) for rule in self._memory)

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
        for gate in parsed.gate:
            for decider in gate.deciders:
                _known_role(decider, parsed.roles, source, "gate")
        for approval in parsed.approval:
            for decider in (*approval.deciders, *approval.escalate_to):
                _known_role(decider, parsed.roles, source, "approval")
        return cls(
            (
                PolicyRule(rule.caller, rule.target, frozenset(rule.capabilities))
                for rule in parsed.allow
            ),
            roles=parsed.roles,
            gate_deciders={gate.agent: gate.deciders for gate in reversed(parsed.gate)},
            approvals=(
                ApprovalRule(
                    agent=rule.agent,
                    tool=rule.tool,
                    when=rule.when,
                    prompt=rule.prompt,
                    deciders=tuple(rule.deciders),
                    timeout_s=rule.timeout_s,
                    on_timeout=rule.on_timeout,
                    escalate_after_s=rule.escalate_after_s,
                    escalate_to=tuple(rule.escalate_to),
                )
                for rule in parsed.approval
            ),
            memory=(rule.rule() for rule in parsed.memory),
            approve_goal_side_effects=parsed.goals.approve_side_effects,
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

    def extended(self, rules: Iterable[PolicyRule]) -> Policy:
        """This policy with more allow rules (its roles, gates and approvals kept)."""
        return Policy(
            [*self._rules, *rules],
            roles=self._roles,
            gate_deciders=self._gate_deciders,
            approvals=self._approvals,
            memory=self._memory,
        )

    def __repr__(self) -> str:
        return f"Policy({len(self._rules)} rules)"


def _known_role(decider: str, roles: Mapping[str, list[str]], source: str, where: str) -> None:
    if decider.startswith(ROLE_PREFIX) and decider[len(ROLE_PREFIX) :] not in roles:
        known = ", ".join(sorted(roles)) or "none"
        raise ProtocolUsageError(
            f"invalid policy {source}: {where}: {decider!r} names no role of [roles] "
            f"(roles: {known})"
        )
