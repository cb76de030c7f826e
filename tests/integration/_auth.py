"""Credentials for test clients: every deployment of the test session shares one cluster secret
(``STRATAGEM_SECRET_FILE``, set by the session fixture in ``conftest.py``)."""

from __future__ import annotations

from stratagem.protocol import OPERATOR, Credentials
from stratagem.runtime import credentials_for, load_settings


def credentials(identity: str = OPERATOR) -> Credentials | None:
    """What a client of ``identity`` sends to this session's agents."""
    return credentials_for(load_settings(), identity)
