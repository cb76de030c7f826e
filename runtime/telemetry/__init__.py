"""Tracing set-up and the spans' way out: the tracer provider and the JSON-lines span file
(``_telemetry``), the span exporters (``_export``) and the tracing backends the CLI reads traces
from (``_backend``).

It may import ``config`` only; ``host``, ``operator``, the CLI and the console import it. Its
modules are imported by path (this package exports nothing).
"""
