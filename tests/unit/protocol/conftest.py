"""Fixtures for the protocol unit tests: certificate directories from ``init_certificates``."""

from __future__ import annotations

from pathlib import Path

import pytest

from stratagem.protocol import (
    OPERATOR,
    ROLES,
)
from stratagem.protocol._tls import init_certificates

IDENTITIES = (*ROLES, OPERATOR)


@pytest.fixture
def tls_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "tls"
    init_certificates(directory, IDENTITIES)
    return directory


@pytest.fixture
def foreign_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "foreign"
    init_certificates(directory, IDENTITIES)
    return directory
