"""What an operator runs against a deployment, from Python: ``Operator`` and ``SyncOperator``
(``_operator``, ``_operator_sync``), composed of one part per noun (``_compose``: the ``_link`` to
the agents, ``_agents``, ``_plans``, ``_watch``, ``_runs``, ``_goals``, ``_worlds``, ``_control``),
a goal run to its end (``_goal``), the plans' history and its views (``_history``, ``_diagram``,
``_render``, ``_show``), the audit log's verification (``_auditing``) and the checks of an
operator's input (``_input``).

It never imports Ray nor ``host`` (the import contracts in pyproject.toml hold it to that): where
the agents' published endpoints do not suffice it loads Ray's directory by name, through the one
seam ``_link.RAY_DIRECTORY`` (re-exported by ``_operator``). It may import ``config`` and
``telemetry``. The CLI and the console sit over it. Its modules are imported by path (this
package exports nothing).
"""
