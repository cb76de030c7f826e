"""Vector recall through a real OpenAI-compatible ``/v1/embeddings`` endpoint on a socket (a
stdlib HTTP server speaking the protocol): the embedder's requests, and a failing endpoint that
leaves nothing written."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from stratagem.agents import EmbeddingError, OpenAIEmbedder, SqliteMemoryStore


class _Endpoint(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.server.fail:  # type: ignore[attr-defined]
            self.send_response(500)
            self.end_headers()
            return
        data = [
            {"index": i, "embedding": [float(len(text)), 1.0]}
            for i, text in enumerate(body["input"])
        ]
        answer = json.dumps({"object": "list", "data": data, "model": body["model"]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: object) -> None:
        return None


@pytest.fixture
def endpoint() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Endpoint)
    server.fail = False  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


async def test_openai_embedder_speaks_v1_embeddings(
    endpoint: ThreadingHTTPServer, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{endpoint.server_address[1]}/v1"
    embedder = OpenAIEmbedder(url, "tiny")
    assert await embedder.embed(["ab", "abcd"]) == [[2.0, 1.0], [4.0, 1.0]]
    store = SqliteMemoryStore(tmp_path / "memory.db", embedder=embedder)
    await store.start()
    try:
        await store.put(("agent", "x"), "k", "v")
        endpoint.fail = True  # type: ignore[attr-defined]
        with pytest.raises(EmbeddingError, match=r"^embeddings endpoint http://127.0.0.1:\d+/v1/"):
            await store.put(("agent", "x"), "k2", "v2")
        assert [item.key for item in await store.list(("agent",))] == ["k"]  # nothing half written
    finally:
        await store.aclose()
