"""MCP servers' tools as research sources (docs/research.md): a tool's text is a source like a
file's; one that hangs, fails or is not attached is recorded as unreadable, in one line, and the
report says so."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from stratagem.agents import ToolRegistry
from stratagem.agents.research import (
    FetchLedger,
    FileScopes,
    InMemorySourceCache,
    Report,
    SourceRefusedError,
    ToolCaller,
    expand_sources,
    mcp_tool,
    research_plan,
    research_tools,
)
from stratagem.planning import Engine, LogicError, ToolContext

PAGE = """A plan that stopped in a crash is resumed from its journal.

Resume skips completed steps and re-runs an in-flight step only when it is idempotent.
"""


def _research(
    tmp_path: Path, call_tool: ToolCaller | None, locators: list[str], timeout_s: float = 5.0
) -> Report:
    scopes = FileScopes.of([tmp_path])
    registry = ToolRegistry("perception")
    tools = research_tools(
        InMemorySourceCache(), FetchLedger(None), scopes, call_tool=call_tool,
        mcp_timeout_s=timeout_s,
    )  # fmt: skip
    for item in tools:
        registry.register(item)
    files = expand_sources(locators, scopes, base=tmp_path)
    plan = research_plan("How does a plan resume after a crash?", files, plan_id="mcp-1")
    result = asyncio.run(Engine(tools=registry, agent="perception").run(plan))
    assert result.status == "succeeded", result.failures
    return Report.model_validate(result.outputs["report"])


def test_an_mcp_tools_text_is_a_source_with_claims(tmp_path: Path) -> None:
    calls: list[tuple[str, dict[str, Any]]] = []

    async def call_tool(name: str, arguments: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        calls.append((name, arguments))
        return {"text": PAGE, "structured": None}

    report = _research(tmp_path, call_tool, ["mcp:docs.fetch?url=https://example.test/resume"])
    assert calls == [("docs.fetch", {"url": "https://example.test/resume"})]
    (source,) = report.sources
    assert (source.kind, source.status) == ("mcp", "read")
    assert report.claims
    assert report.claims[0].citations[0].source == source.id


def test_an_mcp_source_that_hangs_is_recorded_within_its_timeout(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text(PAGE)

    async def hangs(name: str, arguments: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    started = time.monotonic()
    report = _research(tmp_path, hangs, [str(tmp_path / "a.md"), "mcp:slow.fetch"], timeout_s=0.2)
    assert time.monotonic() - started < 30  # answers instead of hanging for an hour
    unread = report.unreadable
    assert [(s.locator, s.reason) for s in unread] == [
        ("mcp:slow.fetch", "the MCP tool slow.fetch did not answer within 0.2 s")
    ]
    assert "mcp:slow.fetch: the MCP tool slow.fetch did not answer within 0.2 s" in report.markdown
    assert report.claims  # the file was read all the same


def test_an_mcp_source_that_fails_or_is_not_attached_is_recorded(tmp_path: Path) -> None:
    async def fails(name: str, arguments: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        raise LogicError("tool 'docs.fetch': 404 Not Found\ntraceback lines")

    report = _research(tmp_path, fails, ["mcp:docs.fetch"])
    assert (
        report.sources[0].reason
        == "the MCP tool docs.fetch failed: tool 'docs.fetch': 404 Not Found"
    )
    alone = _research(tmp_path, None, ["mcp:docs.fetch"])
    assert alone.sources[0].reason == "no MCP server is attached to the agent that runs research"


def test_an_mcp_locator_not_of_the_form_is_refused_in_one_line() -> None:
    assert mcp_tool("mcp:files.read?path=a.md&n=1") == ("files.read", {"path": "a.md", "n": "1"})
    with pytest.raises(
        SourceRefusedError, match=r"^source mcp:files: an MCP source is mcp:SERVER\.TOOL"
    ):
        mcp_tool("mcp:files")
