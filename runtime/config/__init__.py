"""The base both programs of the runtime stand on: the settings (``_settings``), the deployment's
extension packages (``_extensions``), the deployed-package record (``_deployed``), the state
directory (``_statedir``) and what the deployment records there (``_published``: the local head and
the agents' endpoints; ``_restarts``: the restart budgets), the keys and credentials
(``_security``), the stores the settings open (``_stores``), the one lazy-import mechanism
(``_lazy``) and the runtime's error root (``_errors``).

It imports nothing else of the runtime, and no Ray (the import contracts in pyproject.toml hold it
to that). Its modules are imported by path: this package exports nothing, so that importing one of
them loads nothing else.
"""
