"""The protocol fixtures, shared with the protocol unit tests until the split that follows."""

from tests.unit.protocol.conftest import (  # noqa: F401
    audit,
    backend,
    connect,
    serve,
    server,
    tracing,
)
