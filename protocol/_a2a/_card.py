"""An agent's A2A card, made from what ``Describe`` answers.

Each capability is a skill (its id and name the capability's, its description the request model's
first docstring line, its examples the JSON Schema of its request); the bearer JWT the cluster
signs is the card's security scheme (none when authentication is off); the one interface is
JSON-RPC at the A2A base URL, protocol version 1.0; streaming is declared, push notifications not.
"""

from __future__ import annotations

import inspect
import json
from typing import Final

from a2a.types import (
    AgentCapabilities,
    AgentInterface,
    AgentSkill,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)
from a2a.types import AgentCard as A2ACard
from a2a.utils.constants import PROTOCOL_VERSION_CURRENT, TransportProtocol

from stratagem.protocol._capabilities import capability_for
from stratagem.protocol._models import AgentCard

__all__ = ["BEARER_SCHEME", "a2a_card"]

BEARER_SCHEME: Final = "bearer"
"""The name of the card's security scheme."""


def a2a_card(card: AgentCard, base_url: str, *, auth_mode: str) -> A2ACard:
    """The A2A card of an agent whose ``Describe`` answers ``card``, served at ``base_url``.

    Args:
        card: What the agent's ``Describe`` answers.
        base_url: The A2A base URL (``http://127.0.0.1:PORT/``), where JSON-RPC is posted.
        auth_mode: The deployment's authentication (``token``, ``mtls`` or ``none``).
    """
    skills = []
    for capability in card.capabilities:
        spec = capability_for(card.role, capability.name)
        doc = inspect.getdoc(spec.request) if spec is not None else None
        summary = (doc or f"{capability.name} on the {card.role} agent").splitlines()[0]
        schema = json.loads(capability.request_schema)
        skills.append(
            AgentSkill(
                id=capability.name,
                name=capability.name,
                description=summary,
                tags=[card.role, f"version {capability.version}"],
                examples=[json.dumps({"request_schema": schema}, sort_keys=True)],
                input_modes=["application/json", "text/plain"],
                output_modes=["application/json"],
            )
        )
    a2a = A2ACard(
        name=f"stratagem-{card.role}",
        description=(
            f"Stratagem's {card.role} agent: each skill is one of its capabilities; a message "
            "names it in its metadata ('skill') and carries its request as a JSON data part."
        ),
        version=card.version,
        supported_interfaces=[
            AgentInterface(
                url=base_url,
                protocol_binding=TransportProtocol.JSONRPC.value,
                protocol_version=PROTOCOL_VERSION_CURRENT,
            )
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=["application/json", "text/plain"],
        default_output_modes=["application/json"],
        skills=skills,
    )
    if auth_mode == "token":
        a2a.security_schemes[BEARER_SCHEME].CopyFrom(
            SecurityScheme(
                http_auth_security_scheme=HTTPAuthSecurityScheme(
                    scheme="Bearer",
                    bearer_format="JWT",
                    description="a token the deployment's cluster secret signed, naming the caller",
                )
            )
        )
        a2a.security_requirements.append(
            SecurityRequirement(schemes={BEARER_SCHEME: StringList(list=[])})
        )
    return a2a
