"""The perception agent's world model and the stores that keep it across restarts.

``_model`` (the model and what applying actions means), ``_store`` (the ``WorldStore`` protocol and
the file store), ``_worlds`` (``Worlds``: the named worlds one agent keeps) and ``_postgres`` (the
PostgreSQL store: ``agents`` exports it on first use, for the ``postgres`` extra).
"""

from stratagem.agents._world._model import WorldModel, format_fact, run_actions
from stratagem.agents._world._store import FileWorldStore, WorldStore
from stratagem.agents._world._worlds import Worlds

__all__ = ["FileWorldStore", "WorldModel", "WorldStore", "Worlds", "format_fact", "run_actions"]
