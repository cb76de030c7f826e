"""Probing Ray's GCS for its authentication mode over a real (closed) port on 127.0.0.1."""

from __future__ import annotations

import socket

from stratagem.runtime.host._rayauth import RayAuth, probe_auth


def test_a_gcs_that_does_not_answer_is_unknown() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again before the probe
    assert probe_auth(f"127.0.0.1:{port}", timeout_s=2.0) is RayAuth.UNKNOWN
