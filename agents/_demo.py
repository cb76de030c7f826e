"""The built-in story goal that ``stratagem demo`` pursues (also ``examples/crown.yaml``)."""

from __future__ import annotations

from typing import Final

from stratagem.protocol import SubmitGoalRequest

__all__ = ["DEMO_GOAL"]

DEMO_GOAL: Final = SubmitGoalRequest(
    goal="Mira recovers the silver crown",
    passage=(
        "Mira waits in the courtyard. Mira wants the silver crown. The silver crown rests in the "
        "vault. The vault is locked. The iron key lies in the garden. The key opens the vault. "
        "The courtyard leads to the great hall. The great hall leads to the vault. "
        "The courtyard opens onto the garden. Old Tom sleeps in the great hall. "
        "Mira knows Old Tom. Long ago the crown was lost, and with it the trust of the kingdom. "
        "Mira must not fail."
    ),
    beats=3,
)
"""A locked-room quest in three beats: the means (the iron key), the threshold (the vault), the
prize (the silver crown)."""
