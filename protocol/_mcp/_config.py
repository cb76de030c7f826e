"""How an MCP server is attached to an agent: one ``McpServerConfig`` per server."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Final

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

__all__ = ["MCP_SERVER_NAME_PATTERN", "McpServerConfig"]

MCP_SERVER_NAME_PATTERN: Final = r"[a-z][a-z0-9_-]{0,31}"
"""A server's name: its tools are ``<name>.<tool>`` in the agent's registry, and the policy
names it as the target ``mcp.<name>``."""

# The agent's own settings (its secret files, Ray's token): never a server's business.
_AGENT_PREFIXES: Final = ("STRATAGEM_", "RAY_")

ServerName = Annotated[str, StringConstraints(pattern=rf"^{MCP_SERVER_NAME_PATTERN}$")]


class McpServerConfig(BaseModel):
    """One MCP server whose tools become tools of an agent.

    Exactly one of ``command`` (a server started as a subprocess, spoken to over stdio) and
    ``url`` (a Streamable HTTP endpoint) is given.

    Attributes:
        agent: The role of the agent whose registry gets the tools.
        command: The executable of a stdio server.
        args: Its arguments.
        env: Environment variables of the subprocess, over a minimal default environment (the
            agent's own environment is not passed on); ``STRATAGEM_*`` and ``RAY_*`` are
            refused (the agent's settings and secrets stay with the agent).
        cwd: Its working directory (by default a fresh empty folder of its own, not the
            agent's: a relative path in ``command`` is resolved against the agent's first).
        url: The ``http(s)://.../mcp`` endpoint of a Streamable HTTP server.
        headers: HTTP headers sent with every request (an ``Authorization`` header, say); kept
            out of logs, spans and audit records.
        connect_timeout_s: How long starting (or restarting) the server and its handshake may
            take.
        call_timeout_s: How long one ``tools/call`` may take before the server is taken as hung:
            the call fails (``transient``) and the server is restarted.
        max_output_bytes: The largest message the server may send; a larger one fails the call
            (``logic``) and restarts the server, without holding more than this in memory.
        trust_annotations: Whether the tools' ``readOnlyHint`` / ``idempotentHint`` are believed;
            when false every tool is taken as side-effecting and not idempotent.
        cost: Cost units a call of one of its tools charges to a plan's budget.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    agent: Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,63}$")]
    command: str | None = Field(default=None, min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict, repr=False)
    cwd: Path | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict, repr=False)
    connect_timeout_s: float = Field(default=20.0, gt=0, le=600)
    call_timeout_s: float = Field(default=25.0, gt=0, le=3600)
    max_output_bytes: int = Field(default=1 << 20, ge=1024, le=64 << 20)
    trust_annotations: bool = True
    cost: float = Field(default=1.0, ge=0)

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either command (a stdio server) or url (Streamable HTTP)")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError("url must be an http:// or https:// URL")
        if self.url is None and self.headers:
            raise ValueError("headers are for a url server")
        if self.command is None and (self.args or self.env or self.cwd):
            raise ValueError("args, env and cwd are for a command server")
        for name in self.env:
            if name.upper().startswith(_AGENT_PREFIXES):
                raise ValueError(
                    f"env: {name} is one of the agent's settings; STRATAGEM_* and RAY_* "
                    "variables are not given to an MCP server"
                )
        return self

    @property
    def transport(self) -> str:
        """``stdio`` or ``streamable-http``."""
        return "stdio" if self.command is not None else "streamable-http"
