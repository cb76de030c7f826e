"""``python -m tests.integration._model_caller URL FOLDER CALLS``: one process's model client (its
own ``OpenAIModelClient``, taking turns through a ``FileModelLimiter`` over ``FOLDER``) making
``CALLS`` chat calls one after another; prints one JSON line per call (its answer's length and
the turn's figures). The model-path tests start several of these against one scripted server."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from stratagem.agents import ChatMessage, ChatRequest, ModelConfig, OpenAIModelClient
from stratagem.runtime.host._model_slots import FileModelLimiter


async def main(url: str, folder: Path, calls: int) -> None:
    client = OpenAIModelClient(
        ModelConfig(url=url, model="scripted", timeout_s=60.0),
        limiter=FileModelLimiter(folder, 1),
    )
    for number in range(calls):
        request = ChatRequest(messages=(ChatMessage("user", f"call {number}"),), max_tokens=10)
        answer = await client.chat(request)
        print(json.dumps({"chars": len(answer.content), "queued_s": answer.queued_s}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])))
