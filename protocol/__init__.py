"""Stratagem's wire layer: capability models, codec, errors, policy, audit, client and server."""

from protocol._capabilities import *  # noqa: F403  (filled in with explicit names by the protocol work)
from protocol._context import CallContext, current_call, remaining_time
from protocol._errors import *  # noqa: F403
