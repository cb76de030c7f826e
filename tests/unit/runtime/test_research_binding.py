"""The research tools as a deployment binds them (runtime/host/_research.py, docs/research.md): an
MCP source's tool the policy asks an approval for is not called; the others are, by name."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pydantic import BaseModel

from stratagem.agents import InMemoryMemoryStore, PerceptionAgent, tool
from stratagem.planning import ToolContext
from stratagem.protocol import Policy
from stratagem.runtime import load_settings
from stratagem.runtime.host._research import bind_research_tools

SHIPPED = (Path(__file__).resolve().parents[3] / "protocol" / "default_policy.toml").read_text()
GRANTS = """
[[memory]]
caller = "*"
namespaces = ["agent/{caller}"]
access = ["read", "write"]
"""

POLICY = """
[[approval]]
agent = "perception"
tool = "files.delete"
prompt = "Delete a file"
"""


class Answer(BaseModel):
    """What an MCP tool answers, as the agent's MCP toolset gives it."""

    text: str


def test_an_mcp_tool_that_asks_an_approval_is_not_called_by_research(tmp_path: Path) -> None:
    called: list[str] = []

    @tool(name="files.read")
    async def read(path: str) -> Answer:
        called.append("read")
        return Answer(text=f"The note at {path} says the plan resumes from its journal.")

    @tool(name="files.delete", side_effects=True)
    async def delete(path: str) -> Answer:
        called.append("delete")
        return Answer(text="deleted")

    agent = PerceptionAgent()
    agent.registry.register(read)
    agent.registry.register(delete)
    settings = load_settings(state_dir=tmp_path / "state", research_scopes=[tmp_path])
    bind_research_tools(agent, settings, InMemoryMemoryStore(), Policy.from_toml(POLICY))
    ctx = ToolContext(plan_id="p", step_id="collect-1", attempt=1, agent="perception")

    async def collect(locator: str, index: int) -> dict[str, object]:
        return await agent.registry.run_tool(
            "research_collect", {"locator": locator, "index": index}, ctx
        )

    refused = asyncio.run(collect("mcp:files.delete?path=a.md", 1))
    assert refused["status"] == "unreadable"
    assert refused["reason"] == (
        "the MCP tool files.delete failed: files.delete asks an approval ([[approval]]): "
        "research does not call it"
    )
    read_ = asyncio.run(collect("mcp:files.read?path=a.md", 2))
    assert (read_["status"], read_["kind"]) == ("read", "mcp")
    assert called == ["read"]


def test_the_agents_model_writes_the_research_sub_questions(tmp_path: Path) -> None:
    import json

    from stratagem.agents import ScriptedModelClient

    model = ScriptedModelClient([json.dumps({"sub_questions": ["Where does a plan restart?"]})])
    agent = PerceptionAgent()
    settings = load_settings(state_dir=tmp_path / "state", research_scopes=[tmp_path])
    bind_research_tools(agent, settings, InMemoryMemoryStore(), None, model)
    ctx = ToolContext(plan_id="p", step_id="scope", attempt=1, agent="perception")
    scoped = asyncio.run(
        agent.registry.run_tool("research_scope", {"question": "How does a plan resume?"}, ctx)
    )
    texts = [q["text"] for q in scoped["sub_questions"]]
    assert texts == ["How does a plan resume?", "Where does a plan restart?"]
    assert len(model.requests) == 1


def test_the_knowledge_base_and_investigations_are_written_under_the_policy_and_audited(
    tmp_path: Path,
) -> None:
    from stratagem.protocol import InMemoryAuditLog

    (tmp_path / "a.md").write_text(
        "# Notes\n\nA plan that stopped in a crash is resumed from its journal.\n"
    )
    agent = PerceptionAgent()
    settings = load_settings(state_dir=tmp_path / "state", research_scopes=[tmp_path])
    audit = InMemoryAuditLog()
    memory = InMemoryMemoryStore()
    bind_research_tools(agent, settings, memory, Policy.from_toml(SHIPPED + GRANTS), None, audit)
    ctx = ToolContext(plan_id="p", step_id="s", attempt=1, agent="perception")

    async def go() -> None:
        source = await agent.registry.run_tool(
            "research_collect", {"locator": str(tmp_path / "a.md"), "index": 1}, ctx
        )
        scoped = await agent.registry.run_tool(
            "research_scope", {"question": "How does a plan resume after a crash?"}, ctx
        )
        passages = await agent.registry.run_tool(
            "research_recall", {"sub_questions": scoped["sub_questions"], "sources": [source]}, ctx
        )
        claims = await agent.registry.run_tool(
            "research_claims",
            {"sub_questions": scoped["sub_questions"], "passages": passages["passages"]},
            ctx,
        )
        await agent.registry.run_tool(
            "research_report",
            {"question": "How does a plan resume after a crash?",
             "sub_questions": scoped["sub_questions"], "sources": [source],
             "claims": claims["claims"]},
            ctx,
        )  # fmt: skip
        await agent.registry.run_tool(
            "hypotheses.open", {"investigation": "inv", "context": {"symptom": "x"}}, ctx
        )

    asyncio.run(go())
    written = [r for r in audit.records() if r.action.startswith("memory.")]
    namespaces = {r.target for r in written}
    assert any("agent/perception/kb" in t for t in namespaces), namespaces
    assert any("agent/perception/hypotheses" in t for t in namespaces), namespaces
    kept = asyncio.run(memory.list(("agent", "perception", "kb")))
    assert len(kept) == 1


def test_under_the_shipped_policy_research_keeps_nothing_and_no_agent_gets_hypotheses(
    tmp_path: Path,
) -> None:
    from stratagem.agents import StrategicAgent
    from stratagem.agents.research import HYPOTHESIS_TOOLS

    settings = load_settings(state_dir=tmp_path / "state", research_scopes=[tmp_path])
    perception, strategic = PerceptionAgent(), StrategicAgent()
    for agent in (perception, strategic):
        bind_research_tools(agent, settings, InMemoryMemoryStore(), Policy.default())
        assert not set(HYPOTHESIS_TOOLS) & set(agent.registry.names())
    granted = StrategicAgent()
    bind_research_tools(
        granted, settings, InMemoryMemoryStore(), Policy.from_toml(SHIPPED + GRANTS)
    )
    assert set(HYPOTHESIS_TOOLS) <= set(granted.registry.names())


def test_a_deployed_research_step_caches_each_source_as_an_artifact_of_its_plan(
    tmp_path: Path,
) -> None:
    """The actor hands its artifact store to the research tools: each source a collect step reads
    is an artifact of the plan (provenance: that step), listed by ``artifacts list --plan``, kept
    once when the step is retried, and nothing is cached under ``STATE_DIR/research/blobs``."""
    import json
    import shutil

    from typer.testing import CliRunner

    from stratagem.runtime._cli import app
    from stratagem.runtime.config._artifacts import open_artifact_store

    corpus = tmp_path / "docs"
    corpus.mkdir()
    (corpus / "resume.md").write_text("A plan resumes from its journal after a crash.\n")
    settings = load_settings(state_dir=tmp_path / "state", research_scopes=[corpus])
    store = open_artifact_store(settings)
    agent = PerceptionAgent()
    bind_research_tools(agent, settings, None, None, artifacts=store)

    async def collect(attempt: int) -> dict[str, object]:
        ctx = ToolContext(
            plan_id="research-1", step_id="collect-1", attempt=attempt, agent="perception"
        )
        return await agent.registry.run_tool(
            "research_collect", {"locator": str(corpus / "resume.md"), "index": 1}, ctx
        )

    first = asyncio.run(collect(1))
    # a retried step after a crash between the cache and the fetch ledger: the same bytes again
    shutil.rmtree(settings.research_dir / "fetched")
    again = asyncio.run(collect(2))
    assert first["digest"] == again["digest"]
    store.index.close()
    assert not (settings.research_dir / "blobs").exists()

    result = CliRunner().invoke(
        app,
        ["artifacts", "list", "--state-dir", str(settings.state_dir), "--plan", "research-1",
         "--all", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    listed = json.loads(result.stdout)
    assert [(a["name"], a["version"], a["scope"]) for a in listed] == [
        ("research-resume.md", 1, "plan")
    ]
    assert "sha256:" + listed[0]["digest"] == first["digest"]
    provenance = listed[0]["provenance"]
    assert (provenance["plan_id"], provenance["step_id"], provenance["tool"]) == (
        "research-1",
        "collect-1",
        "research_collect",
    )


def test_a_research_plan_for_a_model_limits_its_model_steps_to_the_planning_limit(
    tmp_path: Path,
) -> None:
    """The engine's default step limit (30 s) is shorter than one CPU model call: the research
    plan's model steps take the limit ``Research.research`` reads from the settings (the
    perception agent's planning limit)."""
    from stratagem.runtime.config._settings import load_settings
    from stratagem.runtime.operator._research import research_plan_for

    (tmp_path / "a.md").write_text("A plan resumes from its journal.\n", encoding="utf-8")
    settings = load_settings(state_dir=tmp_path / "state", planner="model", model_timeout_s=120)
    limit = settings.planning_timeout_s("perception")
    assert limit >= 120
    plan = research_plan_for("How?", ["a.md"], [tmp_path], base=tmp_path, model_timeout_s=limit)
    raw_steps = plan["steps"]
    assert isinstance(raw_steps, list)
    steps = {step["id"]: step.get("timeout_s") for step in raw_steps}
    assert steps["scope"] == steps["report"] == limit
