"""Run Arize Phoenix with its OTLP gRPC receiver on 127.0.0.1 only (used by otel_backend.sh).

``PHOENIX_HOST`` binds Phoenix's HTTP server (UI, API, OTLP/HTTP), but its gRPC receiver always
binds every interface (``[::]:PORT``). A development backend must not be reachable from the
network, so this wrapper rewrites that address to loopback before Phoenix starts its server.
Runs in Phoenix's own virtual environment, never in the project's.
"""

import sys

from grpc.aio import _server  # type: ignore[import-not-found]


def _loopback(address: str) -> str:
    host, _, port = address.rpartition(":")
    return f"127.0.0.1:{port}" if host in ("[::]", "0.0.0.0", "") else address


_insecure = _server.Server.add_insecure_port
_secure = _server.Server.add_secure_port
_server.Server.add_insecure_port = lambda self, address: _insecure(self, _loopback(address))
_server.Server.add_secure_port = lambda self, address, credentials: _secure(
    self, _loopback(address), credentials
)

from phoenix.server.main import main  # type: ignore[import-not-found]  # noqa: E402

if __name__ == "__main__":
    sys.argv[0] = "phoenix"
    sys.exit(main())
