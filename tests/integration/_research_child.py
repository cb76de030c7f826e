"""A process that runs (or resumes) a research plan on a SQLite store: the kill -9 test's child.

``python _research_child.py run|resume STATE CORPUS``. Sources are cached in an artifact store
(``STATE/artifacts``, as a deployment's perception agent caches them). Every read of a source's
bytes appends the file's name to ``STATE/reads.log`` (the cache's ``put``); ``STATE/done.json``
gets the plan's status, its report and the plan's artifacts (name, version) when it ends.
``STRATAGEM_TEST_SLOW_S`` makes each collect step wait after it read its source, so the parent
can kill the process while sources are being collected.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from stratagem.agents import Tool, ToolRegistry
from stratagem.agents.research import (
    ArtifactSourceCache,
    FetchLedger,
    FileScopes,
    expand_sources,
    research_plan,
    research_tools,
)
from stratagem.planning import (
    ArtifactStore,
    Engine,
    EngineConfig,
    PlanResult,
    SqliteStateStore,
    ToolContext,
)

PLAN_ID = "research-kill"


class CountingCache(ArtifactSourceCache):
    """The cache, logging each source it is given (one line per read of a source's bytes)."""

    def __init__(self, store: ArtifactStore, log: Path) -> None:
        super().__init__(store)
        self.log = log

    def put(
        self,
        data: bytes,
        *,
        name: str,
        media_type: str,
        ctx: ToolContext | None = None,
        tool: str = "",
    ) -> str:
        if name != "report.md":
            with self.log.open("a") as out:
                out.write(name + "\n")
                out.flush()
                os.fsync(out.fileno())
        return super().put(data, name=name, media_type=media_type, ctx=ctx, tool=tool)


def _slowed(item: Tool[Any, Any], delay: float) -> Tool[Any, Any]:
    async def fn(data: Any, ctx: ToolContext) -> Any:
        result = await item.fn(data, ctx)
        await asyncio.sleep(delay)
        return result

    return Tool(
        name=item.name,
        description=item.description,
        input_model=item.input_model,
        output_model=item.output_model,
        fn=fn,
        side_effects=item.side_effects,
        idempotent=item.idempotent,
    )


async def main(mode: str, state: Path, corpus: Path) -> None:
    scopes = FileScopes.of([corpus])
    artifacts = ArtifactStore.open(state / "artifacts")
    cache = CountingCache(artifacts, state / "reads.log")
    registry = ToolRegistry("perception")
    delay = float(os.environ.get("STRATAGEM_TEST_SLOW_S", "0"))
    for item in research_tools(cache, FetchLedger(state / "fetched"), scopes):
        registry.register(_slowed(item, delay) if item.name == "research_collect" else item)
    store = SqliteStateStore(state / "plans.db")
    engine = Engine(EngineConfig(max_in_flight=1), tools=registry, agent="perception", store=store)
    result: PlanResult
    if mode == "run":
        files = expand_sources([str(corpus)], scopes, base=corpus)
        result = await engine.run(research_plan("How does a plan resume after a crash?", files,
                                                plan_id=PLAN_ID))  # fmt: skip
    else:
        result = await engine.resume(PLAN_ID)
    kept = artifacts.index.list(scope="plan", scope_id=PLAN_ID)
    (state / "done.json").write_text(
        json.dumps(
            {
                "status": result.status,
                "report": result.outputs.get("report"),
                "artifacts": [[record.name, record.version] for record in kept],
            }
        )
    )
    artifacts.index.close()
    await store.aclose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])))
