"""End-to-end tests run the CLI against deployments of their own state directories."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module", autouse=True)
def _own_secret_file() -> Iterator[None]:
    """Each deployment here keeps its secret in its own state directory: a ``STRATAGEM_SECRET_FILE``
    exported by ``tests/integration``'s session fixture (when those tests ran first in the same
    session) would send every ``up`` here to that one file instead."""
    exported = os.environ.pop("STRATAGEM_SECRET_FILE", None)
    yield
    if exported is not None:
        os.environ["STRATAGEM_SECRET_FILE"] = exported
