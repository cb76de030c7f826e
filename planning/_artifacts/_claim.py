"""The claim check: a step output above a stated size is journaled as an artifact reference.

A tool step whose output, as compact JSON, is larger than ``ClaimCheck.max_inline_bytes`` has it
saved as the artifact ``<step>.output.json`` of its plan (scope ``plan``, media type
``application/json``, with the step's provenance), and the journal keeps the reference
(``{"$artifact": {...}}``) instead of the bytes. The running plan keeps the whole output in
memory, so later steps' references (``$ref``, ``$expr``) read it as usual; a resumed plan loads it
back from the artifact (its digest checked) before any step runs. ``plans show`` shows the
reference with its name, version, size and digest.

Not claim-checked: a map's items, gates' outputs and cross-agent answers (the agent's message
limit bounds those), and ``replay`` serves the recorded reference as the step's output.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from stratagem.planning._artifacts._store import ArtifactStore
from stratagem.planning._artifacts._types import ArtifactProvenance, ArtifactRef

__all__ = ["CLAIM_CHECK_BYTES", "ClaimCheck", "Claimed", "claim_output", "restore_claimed"]

CLAIM_CHECK_BYTES: Final = 1 << 20
"""The default size (1 MiB of compact JSON) above which an output goes out by reference."""


@dataclass(frozen=True, slots=True)
class ClaimCheck:
    """Where large step outputs go, and above which size.

    Attributes:
        store: The artifact store.
        max_inline_bytes: The largest output (compact JSON, UTF-8) journaled inline.
    """

    store: ArtifactStore
    max_inline_bytes: int = CLAIM_CHECK_BYTES

    def __post_init__(self) -> None:
        if self.max_inline_bytes < 1:
            raise ValueError("max_inline_bytes: must be >= 1")


class Claimed(dict[str, Any]):
    """A step output kept whole for the run, with the JSON its journal records instead (the
    reference): the engine journals ``journal_json`` when an output is one of these."""

    journal_json: str = ""


async def claim_output(
    check: ClaimCheck,
    output: dict[str, Any],
    *,
    agent: str,
    plan_id: str,
    revision: int,
    step_id: str,
    attempt: int,
) -> dict[str, Any]:
    """``output``, or a ``Claimed`` copy journaled as a reference when it is too large inline.

    Raises:
        ArtifactError: the artifact could not be saved (the step's attempt fails with it).
    """
    text = json.dumps(output, separators=(",", ":"), ensure_ascii=False).encode()
    if len(text) <= check.max_inline_bytes:
        return output
    record = await check.store.save(
        f"{step_id}.output.json",
        text,
        media_type="application/json",
        scope="plan",
        scope_id=plan_id,
        provenance=ArtifactProvenance(
            agent=agent,
            plan_id=plan_id,
            revision=revision,
            step_id=step_id,
            attempt=attempt,
            tool="claim-check",
        ),
    )
    claimed = Claimed(output)
    claimed.journal_json = json.dumps(record.ref.to_json())
    return claimed


async def restore_claimed(check: ClaimCheck, steps: dict[str, Any]) -> None:
    """Load back, in place, the outputs of ``steps`` (a folded journal's step states, each with
    an ``output``) that were journaled as references.

    Raises:
        ArtifactCorruptError: an output's blob is missing or corrupted (never served).
    """
    for state in steps.values():
        ref = ArtifactRef.from_json(getattr(state, "output", None))
        if ref is not None:
            state.output = json.loads(await check.store.load_ref(ref))
