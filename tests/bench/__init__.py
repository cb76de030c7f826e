"""Stratagem's benchmarks, run by ``make bench`` (``python -m tests.bench``).

Two benchmarks, each beside a bare baseline measured in the same run:

* ``tests.bench.rpc``: cross-agent request latency and throughput, actor to actor on an embedded
  Ray, through ``AgentClient.call`` and ``AgentServer`` versus a bare ``grpc.aio`` echo;
* ``tests.bench.engine``: the engine's overhead per step on a layered plan of no-op tools versus a
  bare asyncio Kahn loop over the same DAG.

``tests.bench.report`` gathers the machine facts, judges the targets and writes
``.bench/results.json`` and ``BENCHMARKS.md``. Only ``tests.bench.rpc`` imports Ray, so the engine
benchmark runs (and is smoke-tested) without it.
"""
