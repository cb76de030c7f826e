"""LangGraph's side of the branch-and-map comparison (``tests/bench/dynamic.py``).

Run with the python of the LangGraph peer's own venv (``.bench/peers/langgraph``); imports nothing
of Stratagem. The workflow is the one Stratagem's plan runs: a map over a list of N numbers (one
``work`` node per item, fanned out with ``Send``), a fan-in in item order, and a branch on the
fan-in (a conditional edge to ``high`` or ``low``), without a checkpointer and with LangGraph's
SQLite one (``AsyncSqliteSaver``, a file, a thread per run).

``drive ITEMS WARMUP REPEATS FOLDER``: prints one JSON line, ``{"memory": [s, ...], "sqlite":
[s, ...]}``, the wall time of each timed run, the two variants interleaved.
"""

from __future__ import annotations

import asyncio
import gc
import json
import operator
import sys
import time
import uuid
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

THRESHOLD = 10


class State(TypedDict):
    items: list[int]
    results: Annotated[list[dict[str, int]], operator.add]
    summary: str


class Item(TypedDict):
    index: int
    item: int


async def work(item: Item) -> dict[str, Any]:
    # The tool each item calls (Stratagem's bench tool does the same).
    return {"results": [{"index": item["index"], "n": item["item"] * 2}]}


def fan_out(state: State) -> list[Send]:
    return [Send("work", {"index": i, "item": n}) for i, n in enumerate(state["items"])]


def decide(state: State) -> str:
    ordered = sorted(state["results"], key=lambda r: r["index"])  # the fan-in, in item order
    return "high" if sum(r["n"] for r in ordered) > THRESHOLD else "low"


async def high(state: State) -> dict[str, Any]:
    return {"summary": f"high: {len(state['results'])} items"}


async def low(state: State) -> dict[str, Any]:
    return {"summary": f"low: {len(state['results'])} items"}


def build() -> StateGraph[Any]:
    graph = StateGraph(State)
    graph.add_node("work", work)
    graph.add_node("high", high)
    graph.add_node("low", low)
    graph.add_node("gather", lambda state: {})
    graph.add_conditional_edges(START, fan_out, ["work"])
    graph.add_edge("work", "gather")
    graph.add_conditional_edges("gather", decide, ["high", "low"])
    graph.add_edge("high", END)
    graph.add_edge("low", END)
    return graph


async def drive(items: int, warmup: int, repeats: int, folder: Path) -> dict[str, list[float]]:
    graph = build()
    plain = graph.compile()
    values = list(range(items))
    walls: dict[str, list[float]] = {"memory": [], "sqlite": []}
    async with AsyncSqliteSaver.from_conn_string(str(folder / "langgraph.db")) as saver:
        durable = graph.compile(checkpointer=saver)

        async def once(name: str) -> float:
            gc.collect()
            started = time.perf_counter()
            if name == "memory":
                out = await plain.ainvoke({"items": values, "results": []})
            else:
                config = {"configurable": {"thread_id": uuid.uuid4().hex}}
                out = await durable.ainvoke({"items": values, "results": []}, config)
            wall = time.perf_counter() - started
            if len(out["results"]) != items or not out["summary"]:
                raise RuntimeError(f"the {name} run ended with {out}")
            return wall

        for _ in range(warmup):
            for name in walls:
                await once(name)
        for repeat in range(repeats):
            names = list(walls)
            for name in names[repeat % 2 :] + names[: repeat % 2]:
                walls[name].append(await once(name))
    return walls


def main(argv: list[str]) -> None:
    if argv[0] != "drive":
        raise SystemExit(f"unknown command {argv[0]!r}")
    items, warmup, repeats = (int(n) for n in argv[1:4])
    walls = asyncio.run(drive(items, warmup, repeats, Path(argv[4])))
    print(json.dumps(walls), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
