"""The state of one run of one plan, and its one writer.

``_RunState`` (``_core``) holds what the parts of a run share (step statuses, outputs, attempts,
failures, the open gates, the stop reason, cancellation and pause, the steps in flight, the ready
queue, what is to be compensated). This package is the only code that changes it, split by
concern: ``_core`` the transitions of the run, its steps, its gates and its compensation (methods
of ``_RunState``); ``_map`` a map step's items and ``_loop`` a loop's (or a sub-plan's)
iterations, each kind's ledger (``_ledgers``) with its transitions; ``_resume`` what a resumed
run takes from its journal. Every transition records the change in the journal (when the run has
a store) and tells the observer, in that order. The other parts of the engine read the state's
fields and call its transitions; a unit test (``tests/unit/planning/test_engine_structure.py``)
checks that no module of the engine outside this package assigns them.
"""

from stratagem.planning._engine._state._core import _RunState
from stratagem.planning._engine._state._ledgers import (
    _Items,
    _Iterations,
    _Ready,
    expansion_key,
    key_owner,
)

__all__ = ["_Items", "_Iterations", "_Ready", "_RunState", "expansion_key", "key_owner"]
