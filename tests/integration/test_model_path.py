"""The model path under load, against a slow scripted model server (a real HTTP server on
127.0.0.1 that behaves as llama-cpp-python's does and records what it was asked to generate and
what was abandoned; ``tests/integration/_model_server.py``):

* a call that times out is abandoned at the server (its stream closed: generation stops) and is
  not sent again while the server is still busy with it;
* the turns at one server are shared by clients in several processes: the server never holds more
  than one request at a time;
* the model's time limit is a total: a server dripping a byte at a time is cut at it.

No timed assertions: what is checked is the order of events the server recorded.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from pathlib import Path

import pytest

from stratagem.agents import (
    ChatMessage,
    ChatRequest,
    ModelConfig,
    ModelPlanner,
    ModelPlanningConfig,
    OpenAIModelClient,
)
from stratagem.planning import Plan, TransientError
from stratagem.runtime.host._model_slots import FileModelLimiter, slots_folder
from tests.integration._model_server import ScriptedModelServer
from tests.unit.agents.test_model_planner import REQUEST, Deterministic, _registry

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
ASK = ChatRequest(messages=(ChatMessage("user", "Plan the beat."),), max_tokens=200)


def _client(server: ScriptedModelServer, folder: Path, timeout_s: float) -> OpenAIModelClient:
    return OpenAIModelClient(
        ModelConfig(url=server.url, model="scripted", timeout_s=timeout_s),
        limiter=FileModelLimiter(folder, 1),
    )


async def test_a_timed_out_call_stops_at_the_server_and_is_not_resent_while_it_is_busy(
    tmp_path: Path,
) -> None:
    # 200 tokens 20 ms apart: 4 s an answer; the client gives it 0.5 s.
    with ScriptedModelServer(tokens=200, token_s=0.02) as server:
        client = _client(server, slots_folder(tmp_path, server.url), timeout_s=0.5)
        planner = ModelPlanner(
            role="perception",
            plan_type=Plan,
            registry=_registry(),
            client=client,
            deterministic=Deterministic(),
            config=ModelPlanningConfig(transient_delays_s=(0.0, 0.0)),
        )
        with pytest.raises(TransientError, match=r"did not answer within 0.5 s"):
            await planner.plan("ExtractEntities", REQUEST, plan_id="goal-1")
        async with client.limiter.turn(None):  # once the last abandoned call settled
            served = server.snapshot()
        probes = list(server.probes)
    assert len(served) == 3  # the first try and the planner's two retries
    for call in served:
        assert call.stream
        assert call.abandoned
        # The closed stream stopped it: far fewer tokens than it was generating.
        assert 0 <= call.generated < call.planned
    for earlier, later in itertools.pairwise(served):
        # Sent again only once the server had stopped working on the abandoned call.
        assert later.arrived >= earlier.ended
    assert len(probes) == 3


async def test_one_queue_per_server_is_shared_by_clients_in_several_processes(
    tmp_path: Path,
) -> None:
    folder = slots_folder(tmp_path, "scripted")
    with ScriptedModelServer(tokens=10, token_s=0.02) as server:
        processes = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.integration._model_caller",
                server.url,
                str(folder),
                "3",
                cwd=REPO,
                stdout=asyncio.subprocess.PIPE,
            )
            for _ in range(3)
        ]
        outputs = [await p.communicate() for p in processes]
        served = server.snapshot()
        most = server.most_in_server
    assert [p.returncode for p in processes] == [0, 0, 0]
    answers = [json.loads(line) for out, _ in outputs for line in out.splitlines()]
    assert len(answers) == 9
    assert all(answer["chars"] == 50 for answer in answers)
    assert len(served) == 9
    assert not any(call.abandoned for call in served)
    # Nine calls from three processes, and never two at the server at once.
    assert most == 1
    assert sum(answer["queued_s"] > 0 for answer in answers) > 0


async def test_a_drip_is_cut_at_the_model_timeout_not_per_read(tmp_path: Path) -> None:
    # One byte every 0.2 s: never 1 s without a byte, and ~40 s for the whole answer.
    with ScriptedModelServer(drip_s=0.2) as server:
        client = _client(server, slots_folder(tmp_path, server.url), timeout_s=1.0)
        with pytest.raises(TransientError, match=r"did not answer within 1 s"):
            await client.chat(ASK)
        async with client.limiter.turn(None):  # once the server showed it was free
            (call,) = server.snapshot()
    assert call.abandoned
    assert call.generated < call.planned
