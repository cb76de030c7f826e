"""Per-role model tiers: the seed's weak, default and strong models.

The ``default`` tier is ``STRATAGEM_MODEL`` at ``STRATAGEM_MODEL_URL`` (or the embedded server);
``STRATAGEM_MODEL_TIERS`` names the ``weak`` and ``strong`` models (each a model name, optionally
at a server of its own), and ``STRATAGEM_ROLE_TIERS`` puts a role on one of them. A role not
named stays on ``default``, which is every role's model when nothing is set.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["TIERS", "ModelTier", "RoleModel", "Tier", "check_role_tiers", "check_tier_names"]

Tier = Literal["weak", "default", "strong"]
TIERS: tuple[Tier, ...] = ("weak", "default", "strong")


class ModelTier(BaseModel):
    """One tier's model (an entry of ``STRATAGEM_MODEL_TIERS``; a plain string is its ``model``).

    Attributes:
        model: The model's name at its server.
        url: The OpenAI-compatible base URL (``.../v1``) of its server; ``None``: the default
            tier's (``STRATAGEM_MODEL_URL``, or the embedded server). ``STRATAGEM_MODEL_API_KEY``
            is sent only to that default server, never to a tier's own.
        api_key_file: A file holding the key of the tier's own server (read by each agent when
            it makes its model client; keep it mode 0600); only with ``url``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1, max_length=200)
    url: str | None = Field(default=None, pattern=r"^https?://\S+$", max_length=2000)
    api_key_file: Path | None = None

    @model_validator(mode="before")
    @classmethod
    def _named(cls, value: Any) -> Any:
        return {"model": value} if isinstance(value, str) else value

    @field_validator("api_key_file")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        # Actors run with another working directory: hand them an absolute path.
        return None if value is None else value.expanduser().resolve()

    @model_validator(mode="after")
    def _key_with_url(self) -> ModelTier:
        if self.api_key_file is not None and self.url is None:
            raise ValueError(
                "api_key_file needs the tier's own url (the default server's key is "
                "STRATAGEM_MODEL_API_KEY)"
            )
        return self


class RoleModel(BaseModel):
    """The model one role plans (and researches) with: its tier, model name and server.

    Attributes:
        tier: ``weak``, ``default`` or ``strong``.
        model: The model's name at ``url``.
        url: The server's base URL; ``None`` while no server is settled (no model planner).
        own_server: Whether ``url`` is the tier's own rather than the default tier's server
            (``STRATAGEM_MODEL_API_KEY`` is then not sent; ``api_key_file``'s key is).
        api_key_file: The file of the own server's key, if any.
    """

    model_config = ConfigDict(frozen=True)

    tier: Tier
    model: str
    url: str | None
    own_server: bool = False
    api_key_file: Path | None = None

    def __str__(self) -> str:
        where = f" at {self.url}" if self.own_server and self.url else ""
        return f"{self.model or '(unnamed)'} ({self.tier}){where}"


def check_tier_names(value: Mapping[str, object]) -> None:
    """Refuse a ``model_tiers`` key other than ``weak`` or ``strong`` (``default`` is
    ``STRATAGEM_MODEL``, set there)."""
    for name in sorted(value):
        if name == "default":
            raise ValueError(
                "the default tier is STRATAGEM_MODEL (and STRATAGEM_MODEL_URL); "
                "name only weak and strong here"
            )
        if name not in TIERS:
            raise ValueError(f"{name!r} is not a tier; tiers are: weak, strong")


def check_role_tiers(value: Mapping[str, str], configured: Mapping[str, object]) -> None:
    """Refuse a role put on a tier ``configured`` (``model_tiers``) does not name."""
    for role in sorted(value):
        tier = value[role]
        if tier != "default" and tier not in configured:
            raise ValueError(
                f"{role} is on the {tier!r} tier, which is not configured: "
                f'name its model in STRATAGEM_MODEL_TIERS (e.g. \'{{"{tier}": "MODEL"}}\')'
            )
