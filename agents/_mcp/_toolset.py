"""An MCP server's tools as tools of an agent's registry.

``McpToolset`` connects to one server (``McpServerConfig``), lists its tools and registers each
one the agent may use as ``<server>.<tool>``: typed by the tool's JSON Schemas
(``json_schema_model``), with ``side_effects`` and ``idempotent`` from its annotations, and a
function that calls the server. The connection lives in a task of the agent's event loop (the
agent's process: its Ray actor), opened at ``start`` and reopened on demand after the server
crashed, hung or flooded.

What a call's failure becomes (the step's failure class):

===========================================  ===================================================
what happened                                the step fails with
===========================================  ===================================================
the server cannot be (re)started             ``transient`` (nothing was sent; retried)
it crashed or hung (``call_timeout_s``)      ``transient`` for an idempotent tool (retried);
during the call; it is restarted             ``policy`` for any other: its effect is unknown,
                                             so it is not repeated by itself (a step with
                                             ``on_policy_failure = "gate"`` waits for a person)
it sent a message past ``max_output_bytes``  ``logic``; the server is restarted
the input or output breaks its schema        ``logic``, one line naming the fields
the tool answered ``isError``, or the        ``logic``, with the server's message
server refused the request (JSON-RPC error)
===========================================  ===================================================

Every call leaves one audit record (``mcp.call``: the agent as actor, ``mcp.<server>`` as target,
the tool as capability, the step's call id, ``OK`` or the failure class, digests of input and
output). The engine's ``execute_tool`` span of the attempt gets ``stratagem.mcp.server``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from mcp import Client, MCPError
from mcp_types import CONNECTION_CLOSED, CallToolResult, TextContent, ToolAnnotations
from mcp_types import Tool as McpTool
from opentelemetry import trace
from pydantic import BaseModel, ConfigDict, Field

from stratagem.agents._mcp._schema import JsonSchemaModel, json_schema_model
from stratagem.agents._mcp._transport import transport_for
from stratagem.agents._tool import Tool, ToolRegistry
from stratagem.agents._wire import one_line
from stratagem.planning import LogicError, PolicyError, ToolContext, TransientError
from stratagem.protocol import AuditLog, McpServerConfig, digest

__all__ = ["McpLoadError", "McpResult", "McpToolset", "tool_effects"]

logger = logging.getLogger(__name__)

_TOOL_NAME: Final = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_MESSAGE_CHARS: Final = 300
_CLOSE_S: Final = 5.0


class McpLoadError(Exception):
    """An MCP server's tools could not be loaded (the message is one line)."""


class McpResult(BaseModel):
    """The output of an MCP tool that declares no ``outputSchema``.

    Attributes:
        text: Its text content blocks, joined by newlines.
        content: Every content block as the server sent it.
        structured: Its ``structuredContent``, when it sent one.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str = ""
    content: list[dict[str, Any]] = Field(default_factory=list)
    structured: Any = None


def tool_effects(annotations: ToolAnnotations | None, *, trusted: bool = True) -> tuple[bool, bool]:
    """``(side_effects, idempotent)`` of an MCP tool from its annotations.

    ``readOnlyHint: true`` is a tool without side effects (so idempotent); any other tool has side
    effects and is idempotent only with ``idempotentHint: true`` (``destructiveHint`` says how bad
    the effect is, not whether repeating it is). No annotations, or untrusted ones: side effects,
    not idempotent.
    """
    if annotations is None or not trusted:
        return True, False
    if annotations.read_only_hint is True and annotations.destructive_hint is not True:
        return False, True
    return True, annotations.idempotent_hint is True


@dataclass(slots=True)
class _Outcome:
    """Why the connection a call used was given up (``None``: it was not)."""

    reason: str | None = None
    flooded: bool = False


class _Connection:
    """One open session with the server, held by a task of its own (the SDK's transports are
    entered and left in one task)."""

    def __init__(self, config: McpServerConfig) -> None:
        self.config = config
        self.client: Client | None = None
        self.broken = _Outcome()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def _flooded(self, reason: str) -> None:
        self.broken = _Outcome(reason, flooded=True)

    def _exited(self, reason: str) -> None:
        if self.broken.reason is None:
            self.broken = _Outcome(reason)

    async def open(self) -> Client:
        ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._hold(ready))
        try:
            async with asyncio.timeout(self.config.connect_timeout_s):
                return await asyncio.shield(ready)
        except BaseException:
            await self.close()
            raise

    async def _hold(self, ready: asyncio.Future[Client]) -> None:
        try:
            client = Client(
                transport_for(self.config, self._flooded, self._exited), raise_exceptions=False
            )
            async with client:
                # The registry checks a tool's structured output against its outputSchema, off
                # the event loop and within a deadline (ToolRegistry.run_tool); the SDK's own check
                # would match the schema's patterns with Python's re on the loop, unbounded (a
                # backtracking pattern held the agent for a minute).
                client.session.validate_tool_result = _checked_by_the_registry  # type: ignore[method-assign]
                self.client = client
                if not ready.done():
                    ready.set_result(client)
                await self._stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(
                    exc if isinstance(exc, Exception) else ConnectionError(str(exc))
                )
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self.client = None

    async def close(self) -> None:
        self._stop.set()
        task = self._task
        if task is None or task.done():
            return
        try:
            async with asyncio.timeout(_CLOSE_S):
                await asyncio.shield(task)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        except BaseException:
            return


class McpToolset:
    """The tools of one MCP server, registered on one agent.

    Args:
        name: The server's name (its tools are ``<name>.<tool>``).
        config: How to reach it.
        allow: Whether the agent may use a tool (by the tool's name on the server); the policy's
            ``Policy.allows_tool`` in a deployment. Tools it refuses are not registered.
        audit: Where each call is recorded (``None``: nowhere).
    """

    def __init__(
        self,
        name: str,
        config: McpServerConfig,
        *,
        allow: Callable[[str], bool] = lambda _: True,
        audit: AuditLog | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self._allow = allow
        self._audit = audit
        self._connection: _Connection | None = None
        self._lock = asyncio.Lock()
        self.tools: list[Tool[Any, Any]] = []
        self.denied: list[str] = []
        self.restarts = 0

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self, registry: ToolRegistry) -> list[Tool[Any, Any]]:
        """Connect, list the server's tools and register those the agent may use.

        Returns:
            The tools registered.

        Raises:
            McpLoadError: The server cannot be reached, its tools cannot be listed, or a tool's
                schema or name is unusable (one line naming the server and the reason).
        """
        try:
            client = await self._client()
            listed = await self._list(client)
        except McpLoadError:
            raise
        except Exception as exc:
            connection = self._connection
            ended = connection.broken.reason if connection is not None else None
            await self.aclose()
            raise McpLoadError(
                f"MCP server {self.name!r} ({self.config.transport}) did not load its tools: "
                f"{_reason(exc)}" + (f" ({ended})" if ended else "")
            ) from exc
        tools = []
        for item in listed:
            if not self._allow(item.name):
                self.denied.append(item.name)
                continue
            try:
                tools.append(self._tool(item))
            except ValueError as exc:
                await self.aclose()
                raise McpLoadError(
                    f"MCP server {self.name!r} ({self.config.transport}) did not load its tools: "
                    f"{one_line(str(exc))[:_MESSAGE_CHARS]}"
                ) from None
        for made in tools:
            registry.register(made)
        self.tools = tools
        logger.info(
            "agent %s: MCP server %s gave %d tools (%d the policy denies)",
            registry.agent,
            self.name,
            len(tools),
            len(self.denied),
        )
        return tools

    async def _list(self, client: Client) -> list[McpTool]:
        listed: list[McpTool] = []
        cursor: str | None = None
        for _ in range(100):
            async with asyncio.timeout(self.config.connect_timeout_s):
                page = await client.list_tools(cursor=cursor)
            listed.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return listed
        raise McpLoadError(f"MCP server {self.name!r} lists tools without end (100 pages)")

    async def aclose(self) -> None:
        """Close the session (a stdio server's process stops)."""
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()

    # --- the tools ---------------------------------------------------------------------------

    def _tool(self, item: McpTool) -> Tool[Any, Any]:
        if not _TOOL_NAME.fullmatch(item.name):
            raise ValueError(f"tool name {item.name[:80]!r} is not usable ([A-Za-z0-9_.-]{{1,64}})")
        full = f"{self.name}.{item.name}"
        input_model = _schema_model(item.name, _class_name(full, "Input"), item.input_schema)
        output_model: type[BaseModel] = (
            _schema_model(item.name, _class_name(full, "Output"), item.output_schema)
            if item.output_schema is not None
            else McpResult
        )
        side_effects, idempotent = tool_effects(
            item.annotations, trusted=self.config.trust_annotations
        )
        description = one_line(item.description or item.title or full)[:_MESSAGE_CHARS]

        async def call(data: BaseModel, ctx: ToolContext) -> dict[str, Any]:
            return await self._call(
                item.name, data, ctx, idempotent=idempotent, output=output_model
            )

        return Tool(
            name=full,
            description=description,
            input_model=input_model,
            output_model=output_model,
            fn=call,
            side_effects=side_effects,
            idempotent=idempotent,
            cost=self.config.cost,
        )

    async def _call(
        self,
        tool: str,
        data: BaseModel,
        ctx: ToolContext,
        *,
        idempotent: bool,
        output: type[BaseModel],
    ) -> dict[str, Any]:
        arguments = data.model_dump(mode="json")
        call_id = f"{ctx.plan_id}@{ctx.revision}:{ctx.step_id}#{ctx.attempt}"
        trace.get_current_span().set_attribute("stratagem.mcp.server", self.name)
        answer: dict[str, Any] | None = None
        code = "OK"
        try:
            result = await self._send(tool, arguments, idempotent=idempotent)
            answer = _output(tool, result, output, self.name)
            return answer
        except (LogicError, PolicyError, TransientError) as exc:
            code = exc.failure_class.value
            raise
        except asyncio.CancelledError:
            code = "cancelled"
            raise
        finally:
            await self._record(tool, call_id, ctx.agent, code, arguments, answer)

    async def _send(self, tool: str, arguments: dict[str, Any], *, idempotent: bool) -> Any:
        try:
            client = await self._client()
        except Exception as exc:
            raise TransientError(
                f"MCP server {self.name!r} cannot be started: {_reason(exc)}"
            ) from None
        connection = self._connection
        try:
            async with asyncio.timeout(self.config.call_timeout_s):
                return await client.call_tool(tool, arguments)
        except TimeoutError:
            what = f"did not answer {tool!r} within {self.config.call_timeout_s:g}s (hung)"
        except MCPError as exc:
            if exc.code != CONNECTION_CLOSED and (connection is None or _alive(connection)):
                raise LogicError(
                    f"MCP server {self.name!r} refused {tool!r}: {one_line(exc.message)[:300]}"
                ) from None
            what = f"failed during {tool!r} ({exc.message})"
        except RuntimeError as exc:  # the SDK's own check of structured output
            said = (str(exc).splitlines() or [""])[0]
            said = said.split(f"returned by tool {tool}: ", 1)[-1]
            raise LogicError(
                f"tool '{self.name}.{tool}': invalid output: {one_line(said)[:_MESSAGE_CHARS]}"
            ) from None
        except Exception as exc:
            what = f"failed during {tool!r} ({_reason(exc)})"
        flooded = connection is not None and connection.broken.flooded
        if flooded and connection is not None and connection.broken.reason:
            what = f"{connection.broken.reason} answering {tool!r}"
        await self._restart(connection)
        message = f"MCP server {self.name!r} {what}; restarted it"
        if flooded:
            raise LogicError(message)
        if idempotent:
            raise TransientError(message)
        raise PolicyError(
            f"{message}; tool '{self.name}.{tool}' is not idempotent, so it is not repeated by "
            "itself: its effect is unknown"
        )

    async def _client(self) -> Client:
        async with self._lock:
            connection = self._connection
            if connection is not None and connection.client is not None and _alive(connection):
                return connection.client
            if connection is not None:
                await connection.close()
            connection = _Connection(self.config)
            self._connection = connection
            return await connection.open()

    async def _restart(self, used: _Connection | None) -> None:
        """Give up the connection a failed call used (a later call opens a new one)."""
        async with self._lock:
            if used is not None and self._connection is used:
                self._connection = None
                self.restarts += 1
                logger.warning("MCP server %s: restarting (%d so far)", self.name, self.restarts)
                await used.close()

    async def _record(
        self,
        tool: str,
        call_id: str,
        agent: str,
        code: str,
        arguments: dict[str, Any],
        answer: dict[str, Any] | None,
    ) -> None:
        audit = self._audit
        if audit is None:
            return
        sent = json.dumps(arguments, sort_keys=True, separators=(",", ":")).encode()
        detail = f"in {digest(sent)[:16]}"
        if answer is not None:
            received = json.dumps(answer, sort_keys=True, separators=(",", ":")).encode()
            detail += f" out {digest(received)[:16]} ({len(received)} bytes)"
        fields = {
            "actor": agent,
            "action": "mcp.call",
            "target": f"mcp.{self.name}",
            "capability": tool,
            "request_id": call_id[:200],
            "code": code,
            "detail": detail,
            "digest": digest(sent),
        }
        try:
            append_async = getattr(audit, "append_async", None)
            if append_async is not None:  # protocol.AsyncAuditLog: no thread needed
                await asyncio.shield(append_async(**fields))
            else:
                await asyncio.shield(asyncio.to_thread(audit.append, **fields))
        except Exception:
            logger.exception("cannot audit the MCP call %s of %s", call_id, tool)


async def _checked_by_the_registry(name: str, result: CallToolResult) -> None:
    """Stands in for the SDK's check of a tool's structured output (see ``_Connection._hold``)."""


def _alive(connection: _Connection) -> bool:
    task = connection._task
    return connection.broken.reason is None and task is not None and not task.done()


def _output(
    tool: str, result: CallToolResult, output: type[BaseModel], server: str
) -> dict[str, Any]:
    """The tool's output from its result (the registry validates it against the tool's output
    model); an ``isError`` result is a logic failure."""
    texts = [block.text for block in result.content if isinstance(block, TextContent)]
    if result.is_error:
        said = one_line(" ".join(texts))[:_MESSAGE_CHARS] or "no message"
        raise LogicError(f"tool '{server}.{tool}' failed: {said}")
    if issubclass(output, JsonSchemaModel):
        structured = result.structured_content
        if not isinstance(structured, dict):
            raise LogicError(
                f"tool '{server}.{tool}': invalid output: the structured content is "
                f"{type(structured).__name__}, not an object"
            )
        return structured
    return {
        "text": "\n".join(texts),
        "content": [
            block.model_dump(mode="json", by_alias=True, exclude_none=True)
            for block in result.content
        ],
        "structured": result.structured_content,
    }


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ExceptionGroup):
        return "; ".join(_reason(inner) for inner in exc.exceptions[:3])
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = one_line(str(exc)) or type(exc).__name__
    return text[:_MESSAGE_CHARS]


def _schema_model(tool: str, name: str, schema: Any) -> type[JsonSchemaModel]:
    """``json_schema_model``, its refusal naming the tool and which of its schemas (``inputSchema``
    or ``outputSchema``) rather than the class made for it."""
    try:
        return json_schema_model(name, dict(schema))
    except ValueError as exc:
        which = "inputSchema" if name.endswith("Input") else "outputSchema"
        reason = str(exc).removeprefix(f"{name}: ")
        raise ValueError(f"tool {tool[:80]!r}, {which}: {reason}") from None


def _class_name(tool: str, suffix: str) -> str:
    return "".join(part.capitalize() for part in re.split(r"[^A-Za-z0-9]+", tool)) + suffix
