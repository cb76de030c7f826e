"""What runs in the agents' processes: the Ray actor hosting an agent (``_actor``) and its wire
faces (``_a2a``, ``_mcp``), the launcher (``_launcher``), the local Ray head (``_local``,
``_rayauth``), the directory (``_directory``, and ``_ray_directory``: the operator's fallback),
health (``_health``), its heap after startup (``_heap``), webhooks (``_notify``), the model server
(``_models``, ``_model_slots``) and key rotation (``_rotation``).

The only package of the runtime that imports Ray. It may import ``config`` and ``telemetry``, never
``operator``, the CLI or the console (the import contracts in pyproject.toml hold it to that). Its
modules are imported by path: this package exports nothing, so that importing one module does not
load Ray.
"""
