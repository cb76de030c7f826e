"""A guaranteed final outcome when the target agent's process dies, and cancellation that reaches
the callee.

The target is a real OS process (``tests/integration/_target_process.py``): an ``AgentServer``
with token authentication on 127.0.0.1 whose ``ExtractEntities`` handlers never finish on their
own. The callers are ``AgentClient`` s in this process, over real sockets, with real tokens made
from the same cluster secret file. No Ray: what matters is that the process behind the endpoint
dies, and ``SIGKILL`` gives it no chance to answer or to close its connections gracefully.
``SIGSTOP`` is the harder case: a target that neither answers nor closes its connections.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Final

import pytest

from stratagem.protocol import (
    OPERATOR,
    AgentClient,
    ClientConfig,
    ClusterSecret,
    ExtractEntitiesRequest,
    FindSpatialContextRequest,
    RemoteError,
    TokenCredentials,
    TokenSigner,
)
from tests.unit.protocol._support import SAMPLES

pytestmark = pytest.mark.integration

REPO: Final = Path(__file__).resolve().parents[2]
TARGET: Final = "perception"
CALLS: Final = 100
"""Requests in flight when the target dies."""
CALLERS: Final = (("orchestrator", 2), (OPERATOR, 2))
"""Who calls, and with how many clients (one channel, so one connection, each)."""
DEADLINE_S: Final = 30.0
"""Every call's deadline."""
PROMPT_S: Final = 5.0
"""How soon after the kill every call must have its outcome: far below ``DEADLINE_S``."""
STARTUP_S: Final = 60.0
"""How long the target process may take to serve, and its handlers to start (2 shared cores)."""
SILENT_S: Final = 25.0
"""How soon a target that stops answering without closing its connections must be found out:
the client's keepalive (``protocol._rpc.KEEPALIVE_OPTIONS``: a ping after 10 s, 10 s for its
answer) and some slack, below ``DEADLINE_S``."""


class TargetProcess:
    """The target agent's process and what it has reported on its standard output."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.events: list[tuple[str, str]] = []
        self._changed = asyncio.Condition()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        stdout = self.process.stdout
        assert stdout is not None
        async for line in stdout:
            event, _, value = line.decode().strip().partition(" ")
            async with self._changed:
                self.events.append((event, value))
                self._changed.notify_all()

    def values(self, event: str) -> list[str]:
        """The values reported with ``event``, in order."""
        return [value for name, value in self.events if name == event]

    async def until(self, check: Callable[[], bool], timeout_s: float) -> None:
        """Wait until ``check()`` holds over the events reported so far."""
        async with asyncio.timeout(timeout_s), self._changed:
            await self._changed.wait_for(check)

    def kill(self, signum: int = signal.SIGKILL) -> float:
        """Send ``signum`` to the process by its PID; the ``time.monotonic()`` it was sent."""
        os.kill(self.process.pid, signum)
        return time.monotonic()

    async def stop(self) -> None:
        """Close its stdin (a graceful shutdown); kill it if it has not exited in 10 s."""
        if self.process.returncode is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                await asyncio.wait_for(self.process.wait(), 10.0)
            except TimeoutError:
                self.kill()
        await self.process.wait()
        await self._reader


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.secret"
    ClusterSecret.load_or_create(path)
    return path


@pytest.fixture
def signer(secret_file: Path) -> TokenSigner:
    return TokenSigner(ClusterSecret.load_or_create(secret_file))


@pytest.fixture
async def target(secret_file: Path) -> AsyncIterator[tuple[TargetProcess, str]]:
    """The target process, serving; and its endpoint."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.integration._target_process",
        str(secret_file),
        cwd=REPO,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    served = TargetProcess(process)
    try:
        await served.until(lambda: bool(served.values("port")), STARTUP_S)
        yield served, f"127.0.0.1:{served.values('port')[0]}"
    finally:
        await served.stop()


def _client(endpoint: str, signer: TokenSigner, identity: str) -> AgentClient:
    return AgentClient(
        endpoint,
        credentials=TokenCredentials(signer, identity),
        config=ClientConfig(default_timeout_s=DEADLINE_S),
    )


async def _fan_out_then(
    served: TargetProcess, endpoint: str, signer: TokenSigner, signum: int
) -> tuple[collections.Counter[str], list[float]]:
    """``CALLS`` calls in flight, then ``signum`` to the target; the calls' outcomes, and how long
    after the signal each ended (sorted)."""
    clients = [
        _client(endpoint, signer, identity) for identity, count in CALLERS for _ in range(count)
    ]
    ended: dict[str, tuple[str, float]] = {}

    async def call(client: AgentClient, request_id: str) -> None:
        try:
            await client.call(
                TARGET,
                "ExtractEntities",
                ExtractEntitiesRequest(text="Mira waits in the hall."),
                timeout=DEADLINE_S,
                request_id=request_id,
            )
            outcome = "OK"
        except RemoteError as exc:
            outcome = exc.code.value
        assert request_id not in ended, f"{request_id} ended twice"
        ended[request_id] = (outcome, time.monotonic())

    ids = [f"death-{index:03d}" for index in range(CALLS)]
    started = time.monotonic()
    calls = [
        asyncio.create_task(call(clients[index % len(clients)], request_id))
        for index, request_id in enumerate(ids)
    ]
    try:
        await served.until(lambda: len(served.values("started")) >= CALLS, STARTUP_S)
        assert sorted(served.values("started")) == ids
        assert not ended, f"calls ended before the kill: {ended}"
        in_flight_after_s = time.monotonic() - started
        signalled_at = served.kill(signum)
        await asyncio.wait_for(asyncio.gather(*calls), DEADLINE_S + 5.0)
    finally:
        for task in calls:
            task.cancel()
        for client in clients:
            await client.aclose()

    assert sorted(ended) == ids  # every call ended, exactly once
    outcomes = collections.Counter(outcome for outcome, _ in ended.values())
    waits = sorted(at - signalled_at for _, at in ended.values())
    print(
        f"\n{CALLS} calls in flight after {in_flight_after_s:.2f} s; after "
        f"{signal.Signals(signum).name}: outcomes {dict(outcomes)}, time to outcome min "
        f"{waits[0] * 1e3:.1f} ms, median {waits[len(waits) // 2] * 1e3:.1f} ms, max "
        f"{waits[-1] * 1e3:.1f} ms (deadline {DEADLINE_S:g} s)"
    )
    return outcomes, waits


async def test_killing_the_target_gives_every_call_in_flight_a_prompt_final_outcome(
    target: tuple[TargetProcess, str], signer: TokenSigner
) -> None:
    served, endpoint = target
    outcomes, waits = await _fan_out_then(served, endpoint, signer, signal.SIGKILL)
    assert "DEADLINE_EXCEEDED" not in outcomes
    assert "OK" not in outcomes
    assert set(outcomes) <= {"UNAVAILABLE", "CANCELLED", "INTERNAL"}, outcomes
    assert waits[-1] < PROMPT_S, f"the slowest call ended {waits[-1]:.2f} s after the kill"

    # A call made after the death fails as promptly: the target is gone, not slow.
    async with _client(endpoint, signer, OPERATOR) as late:
        begun = time.monotonic()
        with pytest.raises(RemoteError) as raised:
            await late.call(
                TARGET,
                "ExtractEntities",
                ExtractEntitiesRequest(text="Anyone there?"),
                timeout=DEADLINE_S,
            )
        late_s = time.monotonic() - begun
    print(f"a call after the kill: {raised.value.code.value} in {late_s * 1e3:.1f} ms")
    assert raised.value.code.value == "UNAVAILABLE"
    assert late_s < PROMPT_S


async def test_a_caller_cancelling_its_call_cancels_the_callees_work(
    target: tuple[TargetProcess, str], signer: TokenSigner
) -> None:
    served, endpoint = target
    async with _client(endpoint, signer, "orchestrator") as client:
        call = asyncio.create_task(
            client.call(
                TARGET,
                "ExtractEntities",
                ExtractEntitiesRequest(text="Mira waits in the hall."),
                timeout=DEADLINE_S,
                request_id="cancel-me",
            )
        )
        await served.until(lambda: "cancel-me" in served.values("started"), STARTUP_S)
        cancelled_at = time.monotonic()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await served.until(lambda: "cancel-me" in served.values("cancelled"), PROMPT_S)
        print(f"\nthe handler saw CancelledError {(time.monotonic() - cancelled_at) * 1e3:.1f} ms")

        # The agent keeps serving: the cancelled call took nothing down with it.
        answer = await client.call(
            TARGET, "FindSpatialContext", FindSpatialContextRequest(entity_ids=["mira"])
        )
        assert answer == SAMPLES["FindSpatialContext"][1]


async def test_a_frozen_target_is_found_out_by_keepalive_before_the_deadline(
    target: tuple[TargetProcess, str], signer: TokenSigner
) -> None:
    # SIGSTOP: the process neither answers nor closes its connections, like a hung or
    # partitioned host; only the client's keepalive can tell.
    served, endpoint = target
    try:
        outcomes, waits = await _fan_out_then(served, endpoint, signer, signal.SIGSTOP)
    finally:
        served.kill()  # a stopped process still dies of SIGKILL
    assert set(outcomes) == {"UNAVAILABLE"}, outcomes
    assert waits[-1] < SILENT_S, f"the slowest call ended {waits[-1]:.2f} s after SIGSTOP"
