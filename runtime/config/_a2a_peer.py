"""An external A2A agent as the settings name it (``STRATAGEM_A2A_AGENTS``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, SecretStr

__all__ = ["A2APeer"]


class A2APeer(BaseModel):
    """An external A2A agent plans may call.

    Attributes:
        url: Its A2A base URL (where its card's ``/.well-known/agent-card.json`` is).
        token: A bearer token it accepts; ``None``: none sent. A secret: never logged.
        skill: The skill a step's message names when the step gives none.
        timeout_s: The most one call may take (a step's own deadline may be shorter).
        read_only_skills: Its skills that change nothing. Every other skill is taken to have
            side effects: a goal in plain words holds it at its approval gate (``--approve``,
            the policy's ``[goals]``).
    """

    model_config = ConfigDict(extra="forbid")

    url: str = Field(pattern=r"^https?://[^\s]+$", max_length=2000)
    # Passed to the agents apart from the settings they are given (as the model's key is).
    token: SecretStr | None = Field(default=None, exclude=True)
    skill: str = Field(default="", max_length=200)
    timeout_s: float = Field(default=60.0, gt=0, le=3600)
    read_only_skills: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        default_factory=list, max_length=64
    )
