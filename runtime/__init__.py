"""Ray actors, gRPC wiring, settings, telemetry, audit store and the CLI."""
