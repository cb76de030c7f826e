"""Shared test set-up: keep Ray and every state file inside the test session's temporary folders."""

from __future__ import annotations

import os

# Ray started by tests runs without token authentication and without usage reporting.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
