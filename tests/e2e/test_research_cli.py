"""``stratagem research`` and ``stratagem kb`` as a user runs them (docs/research.md): the README's
example, the knowledge base it keeps, bad input in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

STRATAGEM = str(Path(sys.executable).parent / "stratagem")
REPO = Path(__file__).resolve().parents[2]


SHIPPED_POLICY = (REPO / "protocol" / "default_policy.toml").read_text(encoding="utf-8")
# The knowledge base and the hypotheses tools keep what they find in the agents' own memory,
# which a policy file grants (the shipped policy grants agents none).
GRANTS = '[[memory]]\ncaller = "*"\nnamespaces = ["agent/{caller}"]\naccess = ["read", "write"]\n'


def _granting_policy(folder: Path) -> str:
    path = folder / "policy.toml"
    path.write_text(SHIPPED_POLICY + "\n" + GRANTS, encoding="utf-8")
    return str(path)


def run(*args: str, state_dir: Path, **env_extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, STRATAGEM_STATE_DIR=str(state_dir), COLUMNS="160", **env_extra)
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(
        [STRATAGEM, *args],
        capture_output=True,
        text=True,
        timeout=540,
        env=env,
        check=False,
        cwd=REPO,
    )


def test_the_readme_question_over_docs_cites_the_lines_that_say_each_claim(
    tmp_path: Path,
) -> None:
    odd = tmp_path / "scope" / "logo.dat"
    odd.parent.mkdir()
    odd.write_bytes(b"\x89PNG\x00\x00binary")
    result = run(
        "research", "How does a plan resume after a crash?", "--sources", "docs/",
        "--sources", str(odd), "--embedded", "--json", "--timeout", "300",
        state_dir=tmp_path / "state",
        STRATAGEM_RESEARCH_SCOPES=f"{REPO},{odd.parent}",
        STRATAGEM_POLICY_FILE=_granting_policy(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout)
    assert out["plan_id"].startswith("research-")
    report = out["report"]
    assert report["claims"]
    by_id = {s["id"]: s for s in report["sources"]}
    for claim in report["claims"]:
        first = claim["citations"][0]
        lines = Path(by_id[first["source"]]["locator"]).read_text().splitlines()
        cited = " ".join(
            " ".join(
                lines[first["location"]["line_start"] - 1 : first["location"]["line_end"]]
            ).split()
        )
        assert " ".join(claim["text"].split()).rstrip(".") in cited, claim
    unread = [s for s in report["sources"] if s["status"] == "unreadable"]
    assert [(s["locator"], s["reason"]) for s in unread] == [
        (str(odd), "a binary file (it holds NUL bytes), not text")
    ]
    assert "logo.dat: a binary file" in report["markdown"]
    assert "durability.md" in report["markdown"]
    # each source read is an artifact of the plan (docs/research.md), its provenance the step
    listed = run(
        "artifacts", "list", "--plan", out["plan_id"], "--all", "--json",
        state_dir=tmp_path / "state",
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr[-3000:]
    kept = {("sha256:" + a["digest"], a["name"]): a for a in json.loads(listed.stdout)}
    read = [s for s in report["sources"] if s["status"] == "read"]
    assert read
    for source in read:
        artifact = kept[(source["digest"], "research-" + Path(source["locator"]).name)]
        assert artifact["provenance"]["plan_id"] == out["plan_id"]
        assert artifact["provenance"]["step_id"].startswith("collect-")
        assert artifact["provenance"]["tool"] == "research_collect"
    assert (report["digest"], "research-report.md") in kept
    traced = run(
        "artifacts", "provenance", "research-durability.md", "--plan", out["plan_id"], "--json",
        state_dir=tmp_path / "state",
    )  # fmt: skip
    assert traced.returncode == 0, traced.stderr[-3000:]
    assert '"research_collect"' in traced.stdout


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--sources", "/etc/hostname"],
            "error: source /etc/hostname: outside the allowed file scopes",
        ),
        (["--sources", "no-such-folder/"], "error: source no-such-folder/: no such file or folder"),
        ([], "error: --sources: name at least one file or folder"),
        (["--sources", "mcp:files"], "error: source mcp:files: an MCP source is mcp:SERVER.TOOL"),
    ],
)
def test_a_bad_source_is_one_line_and_exit_2(tmp_path: Path, args: list[str], line: str) -> None:
    result = run("research", "Why?", *args, state_dir=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith(line)
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_a_question_of_100_kb_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = run("research", "w" * 100_000, "--sources", "docs/", state_dir=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: question: the question has 100000 characters; at most 2000 are taken (ask a "
        "question, not a document)"
    )


def test_kb_show_of_an_unknown_claim_is_one_line(tmp_path: Path) -> None:
    result = run("kb", "show", "c-000000000000", state_dir=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: claim c-000000000000: not in the knowledge base"


def test_a_goal_file_with_an_unknown_field_is_refused_naming_it(tmp_path: Path) -> None:
    goal = tmp_path / "goal.yaml"
    goal.write_text("question: Why?\nsources: [docs/]\nsauces: [docs/]\n")
    result = run("research", "--goal-file", str(goal), state_dir=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {goal}: sauces: not a field of a research goal"


def test_the_debug_template_plan_finds_its_root_cause_and_hypotheses_show_it(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    ran = run(
        "plans", "run", "examples/plans/debug.yaml", "--embedded", "--json", state_dir=state,
        STRATAGEM_POLICY_FILE=_granting_policy(tmp_path),
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    steps = {s["id"]: s["status"] for s in json.loads(ran.stdout)["steps"]}
    assert (steps["fix_text"], steps["fix_scope"], steps["escalate"]) == (
        "succeeded",
        "skipped",
        "skipped",
    )
    listed = run("hypotheses", "list", "--json", state_dir=state)
    assert listed.returncode == 0, listed.stderr[-2000:]
    [investigation] = json.loads(listed.stdout)
    assert investigation["id"] == "debug-unreadable-note"
    assert investigation["root_cause"].startswith("H1")
    shown = run("hypotheses", "show", "debug-unreadable-note", state_dir=state)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "## Decision table" in shown.stdout
    assert "| H1 | the file holds bytes that are not text | 0.50 | 0.90 | 1 |" in shown.stdout
    missing = run("hypotheses", "show", "nope", state_dir=state)
    assert missing.returncode == 2
    assert missing.stderr.strip() == "error: investigation nope: none kept"
