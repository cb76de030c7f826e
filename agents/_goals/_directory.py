"""The capability directory: every capability a goal in plain words may be planned onto.

One entry per capability that declares intents (``CapabilitySpec.intents``), from the protocol's
registry: the built-in agents' and those of every extension loaded in the process (each agent
imports every extension, so the orchestrator's registry lists every deployed agent's). The
orchestrator's own capabilities are left out (a goal does not plan a goal). The directory says what
may be chosen; the policy still decides at run time whether the orchestrator may call it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from stratagem.protocol import CAPABILITIES, CapabilitySpec, Intent, check_intents, roles
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
    """

    agent: str
    spec: CapabilitySpec
    intents: tuple[Intent, ...]
    slots: dict[str, tuple[SlotType, dict[str, Any]]] = field(hash=False, compare=False)

    @property
    def name(self) -> str:
        """``agent.Capability``."""
        return f"{self.agent}.{self.spec.name}"


@dataclass(frozen=True, slots=True)
class CapabilityDirectory:
    """The capabilities with intents, in a stable order (role order, then name)."""

    entries: tuple[DirectoryEntry, ...]

    @classmethod
    def of(
        cls, specs: Iterable[CapabilitySpec], *, exclude: Iterable[str] = ()
    ) -> CapabilityDirectory:
        """The entries of ``specs`` that declare intents, leaving out roles in ``exclude``.

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
        return cls(tuple(found))

    @classmethod
    def registered(cls) -> CapabilityDirectory:
        """Every registered capability with intents but the orchestrator's."""
        return cls.of(list(CAPABILITIES.values()), exclude=("orchestrator",))

    @property
    def agents(self) -> list[str]:
        """The agents with an entry, in order."""
        return list(dict.fromkeys(e.agent for e in self.entries))
