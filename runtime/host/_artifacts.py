"""What an agent's process does for the deployment's artifacts besides serving the tools: their
housekeeping (``ArtifactHousekeeping``): the retention rules of ``STRATAGEM_ARTIFACTS_RETENTION``
applied, then the blobs no record names swept, at start and then at most once an hour.

Every agent does it (each is enough; doing it twice removes nothing more): a deployment of any
set of agents keeps its artifacts in bounds. The sweep spares blobs younger than the store's grace
period (an hour), so a save in progress in another process is never swept from under its record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

from stratagem.planning import ArtifactStore

__all__ = ["HOUSEKEEPING_EVERY_S", "ArtifactHousekeeping"]

logger = logging.getLogger(__name__)

HOUSEKEEPING_EVERY_S: Final = 3600.0


class ArtifactHousekeeping:
    """Prune and sweep ``store`` when due.

    Args:
        store: The deployment's artifact store.
        every_s: The least time between two rounds.
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        store: ArtifactStore,
        *,
        every_s: float = HOUSEKEEPING_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self._every_s = every_s
        self._clock = clock
        self._last: float | None = None

    async def maybe_run(self) -> bool:
        """One round when due (the first call always is); whether it ran. A failure is logged
        and tried again at the next round."""
        now = self._clock()
        if self._last is not None and now - self._last < self._every_s:
            return False
        self._last = now
        try:
            removed = await self.store.prune()
            swept = await self.store.sweep()
        except Exception:
            logger.exception("cannot apply the artifacts' retention")
            return True
        if removed or swept.blobs or swept.temporary:
            logger.info(
                "artifacts: %d versions past their retention removed, %d blobs and %d unfinished "
                "writes swept",
                len(removed),
                len(swept.blobs),
                swept.temporary,
            )
        return True
