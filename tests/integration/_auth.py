"""Credentials for test clients: every deployment of the test session shares one cluster secret
(``STRATAGEM_SECRET_FILE``, set by the session fixture in ``conftest.py``).

The operator's credentials are what the CLI holds (its key signs only as the operator); a test that
must speak as an agent holds the cluster secret, as the agents do.
"""

from __future__ import annotations

from stratagem.protocol import OPERATOR, ClusterSecret, Credentials
from stratagem.runtime import credentials_for, load_settings


def credentials(identity: str = OPERATOR) -> Credentials | None:
    """What a client of ``identity`` sends to this session's agents."""
    settings = load_settings()
    if identity == OPERATOR or settings.auth != "token":
        return credentials_for(settings, identity)
    return credentials_for(settings, identity, ClusterSecret.load(settings.secret_path))
