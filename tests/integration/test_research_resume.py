"""A research plan killed with SIGKILL while it collects sources, then resumed in a new process:
each source is read once, and the report holds no duplicate claim.

The kill lands while a collect step that read and recorded its source waits, its result not yet in
the plan's journal: the resumed plan runs that step again (it is idempotent), which must not read
the source again. (A kill in the instant between a read and its ledger entry re-reads that one
file; docs/research.md says so.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

CHILD = Path(__file__).with_name("_research_child.py")
SOURCES = 8


def _corpus(root: Path) -> None:
    root.mkdir()
    for n in range(1, SOURCES + 1):
        (root / f"note-{n}.md").write_text(
            f"# Note {n}\n\nA plan resumed after a crash skips the steps it completed (note {n}).\n"
            "\nResume re-runs an in-flight step only when the step is idempotent.\n"
        )
    (root / "broken.txt").write_bytes(b"\x00\x01\x02 not text")


def _child(mode: str, state: Path, corpus: Path, slow: float) -> subprocess.Popen[bytes]:
    env = {**os.environ, "STRATAGEM_TEST_SLOW_S": str(slow)}
    return subprocess.Popen([sys.executable, str(CHILD), mode, str(state), str(corpus)], env=env)


def _recorded(state: Path) -> int:
    folder = state / "fetched"
    return len(list(folder.glob("*.json"))) if folder.exists() else 0


def _reads(state: Path) -> list[str]:
    log = state / "reads.log"
    return log.read_text().split() if log.exists() else []


def test_a_killed_research_plan_resumes_reading_each_source_once(tmp_path: Path) -> None:
    corpus, state = tmp_path / "corpus", tmp_path / "state"
    _corpus(corpus)
    state.mkdir()
    first = _child("run", state, corpus, slow=1.0)
    try:
        deadline = time.monotonic() + 120
        # Three sources read and recorded: the third step sleeps after its read, uncommitted in
        # the plan's journal, so the resumed plan runs it again.
        while _recorded(state) < 4:
            assert first.poll() is None, "the child ended before it was killed"
            assert time.monotonic() < deadline, "the child read fewer than 3 sources in 120 s"
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    before = _reads(state)
    assert 3 <= len(before) < SOURCES, before  # broken.txt is recorded without a read
    assert not (state / "done.json").exists()

    second = _child("resume", state, corpus, slow=0.0)
    assert second.wait(timeout=300) == 0
    done = json.loads((state / "done.json").read_text())
    assert done["status"] == "succeeded"
    reads = Counter(_reads(state))
    assert reads == Counter(f"note-{n}.md" for n in range(1, SOURCES + 1))  # each once
    report = done["report"]
    ids = [claim["id"] for claim in report["claims"]]
    assert ids
    assert len(ids) == len(set(ids))
    texts = [claim["text"] for claim in report["claims"]]
    assert len(texts) == len(set(texts))
    unread = [s["locator"] for s in report["sources"] if s["status"] != "read"]
    assert unread == [str(corpus / "broken.txt")]
    assert "broken.txt: a binary file" in report["markdown"]
    # each source is one artifact of the plan, one version (the killed run's saves not repeated)
    assert sorted(done["artifacts"]) == sorted(
        [[f"research-note-{n}.md", 1] for n in range(1, SOURCES + 1)] + [["research-report.md", 1]]
    )
