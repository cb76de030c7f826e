"""The operator's part for one agent at a time: where the agents are (``endpoints``), a
capability called on one (``call``), its health and its card (``describe``)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from stratagem.protocol import AgentCard, WireModel
from stratagem.runtime.operator._input import InputError, validation_line
from stratagem.runtime.operator._link import Link, capability_spec

__all__ = ["Agents"]


class Agents:
    """One agent at a time, through ``link``."""

    def __init__(self, link: Link) -> None:
        self._link = link

    async def endpoints(self, roles: Sequence[str] | None = None) -> dict[str, str]:
        """Each of ``roles``' endpoint (every agent's by default), found as ``Operator``'s
        docstring says."""
        return await self._link.endpoints(roles)

    async def call(
        self,
        agent: str,
        capability: str,
        payload: Mapping[str, Any] | WireModel | None = None,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
        request_id: str | None = None,
    ) -> WireModel:
        """Ask ``agent`` to serve ``capability`` (what ``stratagem request`` does).

        Args:
            agent: The role called.
            capability: The capability's name, e.g. ``ExtractEntities``.
            payload: Its request: the model, or a mapping validated into it (empty: ``{}``).
            timeout: Seconds to wait.
            request_id: The idempotency key (a fresh one when ``None``): a repeat gets the
                stored answer.

        Returns:
            The capability's response model (e.g. ``protocol.ExtractEntitiesResponse``).

        Raises:
            InputError: An unknown agent or capability, or a payload its model refuses.
        """
        spec = capability_spec(self._link.settings, agent, capability)
        if isinstance(payload, spec.request):
            body: WireModel = payload
        elif isinstance(payload, WireModel):
            raise InputError(
                f"{capability} takes a {spec.request.__name__}, not a {type(payload).__name__}"
            )
        else:
            try:
                body = spec.request.model_validate(dict(payload or {}))
            except ValidationError as exc:
                raise InputError(validation_line(f"{capability} request", exc)) from exc
        key = request_id or f"op-{uuid.uuid4().hex}"
        return await self._link.at(
            agent,
            lambda client: client.call(agent, capability, body, request_id=key, timeout=timeout),
        )

    async def health(self, agent: str) -> str:
        """``agent``'s gRPC health status (``SERVING``, ``NOT_SERVING``...).

        Raises:
            protocol.UnavailableError: It does not answer.
        """
        self._link.check_role(agent)
        return await self._link.at(agent, lambda client: client.health())

    async def describe(self, agent: str) -> AgentCard:
        """What ``agent`` serves: its capabilities (with their JSON schemas), versions, tools."""
        self._link.check_role(agent)
        return await self._link.at(agent, lambda client: client.describe())
