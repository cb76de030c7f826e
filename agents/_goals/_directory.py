"""The capability directory: every capability a goal in plain words may be planned onto.

One entry per capability that declares intents (``CapabilitySpec.intents``), from the protocol's
registry: the built-in agents' and those of every extension loaded in the process (each agent
imports every extension, so the orchestrator's registry lists every deployed agent's); and one per
skill of a configured external A2A agent whose card lists examples (the examples are its intents,
without slots: the clause is the message's text). The orchestrator's own capabilities are left out
(a goal does not plan a goal). The directory says what may be chosen; the policy still decides at
run time whether the orchestrator may call it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stratagem.protocol import (
    CAPABILITIES,
    CapabilitySpec,
    Intent,
    IntentError,
    check_intents,
    parse_intent,
    roles,
)
from stratagem.protocol._a2a._client import SEND_A2A_MESSAGE, A2ASkill
from stratagem.protocol._intents import SlotType, slot_types

__all__ = ["CapabilityDirectory", "DirectoryEntry"]


@dataclass(frozen=True, slots=True)
class DirectoryEntry:
    """One capability a goal may be planned onto.

    Attributes:
        agent: The role that serves it.
        spec: The capability.
        intents: Its parsed intents.
        slots: The request fields a slot may fill: name -> (type, JSON Schema).
        external: For an external A2A agent's skill: the agent's name ("" otherwise; ``agent``
            is then ``a2a`` and ``spec`` ``SendA2AMessage``).
        skill: That skill's id.
        external_side_effects: For an external skill, whether it may change something (a card
            does not say: yes, unless the deployment declared it read-only).
    """

    agent: str
    spec: CapabilitySpec
    intents: tuple[Intent, ...]
    slots: dict[str, tuple[SlotType, dict[str, Any]]] = field(hash=False, compare=False)
    external: str = ""
    skill: str = ""
    external_side_effects: bool = True

    @property
    def side_effects(self) -> bool:
        """Whether running it may change something (a goal's approval gate holds it)."""
        return self.external_side_effects if self.external else self.spec.side_effects

    @property
    def name(self) -> str:
        """``agent.Capability``, or ``a2a.AGENT.SKILL`` for an external agent's skill."""
        if self.external:
            return f"a2a.{self.external}.{self.skill}"
        return f"{self.agent}.{self.spec.name}"


@dataclass(frozen=True, slots=True)
class CapabilityDirectory:
    """The capabilities with intents, in a stable order (role order, then name; external
    agents' skills last)."""

    entries: tuple[DirectoryEntry, ...]

    @classmethod
    def of(
        cls,
        specs: Iterable[CapabilitySpec],
        *,
        exclude: Iterable[str] = (),
        external: Mapping[str, Sequence[A2ASkill]] | None = None,
    ) -> CapabilityDirectory:
        """The entries of ``specs`` that declare intents, leaving out roles in ``exclude``, then
        the skills of the ``external`` A2A agents (by name) whose cards list examples.

        Raises:
            protocol.IntentError: An intent that does not parse or fit its request model.
        """
        left_out = set(exclude)
        order = {role: i for i, role in enumerate(roles())}
        found = [
            DirectoryEntry(
                agent=spec.role,
                spec=spec,
                intents=tuple(check_intents(spec)),
                slots=slot_types(spec),
            )
            for spec in specs
            if spec.intents and spec.role not in left_out
        ]
        found.sort(key=lambda e: (order.get(e.agent, len(order)), e.spec.name))
        for name in sorted(external or {}):
            for skill in (external or {})[name]:
                intents = _examples(skill.examples)
                if intents:
                    found.append(
                        DirectoryEntry(
                            agent="a2a",
                            spec=SEND_A2A_MESSAGE,
                            intents=intents,
                            slots={},
                            external=name,
                            skill=skill.skill,
                            external_side_effects=skill.side_effects,
                        )
                    )
        return cls(tuple(found))

    @classmethod
    def registered(
        cls, external: Mapping[str, Sequence[A2ASkill]] | None = None
    ) -> CapabilityDirectory:
        """Every registered capability with intents but the orchestrator's, and the skills of
        ``external`` agents (by name) whose cards list examples."""
        return cls.of(list(CAPABILITIES.values()), exclude=("orchestrator",), external=external)

    @property
    def agents(self) -> list[str]:
        """The agents with an entry, in order (an external A2A agent by its name)."""
        return list(dict.fromkeys(e.external or e.agent for e in self.entries))


def _examples(examples: Sequence[str]) -> tuple[Intent, ...]:
    """A card's examples as intents without slots (a brace is a plain character there); an
    example that is no phrasing (empty, only punctuation) is left out."""
    found = []
    for example in examples:
        try:
            found.append(parse_intent(example.replace("{", "(").replace("}", ")")))
        except IntentError:
            continue
    return tuple(found)
