"""The stratagem CLI as a user runs it: a subprocess, its exit code and its output."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

STRATAGEM = str(Path(sys.executable).parent / "stratagem")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


REPO = EXAMPLES.parent
# The deployment the module's tests share takes requests up to this size.
MAX_MESSAGE_BYTES = 16_384


def run(
    *args: str, state_dir: Path, timeout: float = 240, **env_extra: str
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, STRATAGEM_STATE_DIR=str(state_dir), COLUMNS="160", **env_extra)
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(
        [STRATAGEM, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
        cwd=REPO,
    )


def test_demo_exits_zero_and_reports_a_goal(tmp_path: Path) -> None:
    result = run("demo", "--json", state_dir=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads(result.stdout)
    assert out["response"]["status"] == "succeeded"
    assert out["response"]["actions"]
    assert {p["agent"] for p in out["plans"]} == {
        "orchestrator",
        "perception",
        "strategic",
        "tactical",
    }
    assert len(out["services"]) >= 3
    assert out["audit"]["ok"] is True
    assert out["audit"]["records"] > 0

    verify = run("audit", "verify", state_dir=tmp_path)
    assert verify.returncode == 0, verify.stderr
    assert f"{out['audit']['records']} records" in verify.stdout
    # The agents signed the chain's head as they stopped.
    assert out["audit"]["signed_heads"] >= 1
    assert "signed heads verified" in verify.stdout
    # Edit one record behind the log's back (dropping its append-only trigger first).
    with sqlite3.connect(tmp_path / "audit.sqlite3") as db:
        db.execute("DROP TRIGGER audit_no_update")
        db.execute("UPDATE audit SET detail = 'rewritten' WHERE seq = 3")
    broken = run("audit", "verify", state_dir=tmp_path)
    assert broken.returncode == 1
    assert broken.stderr.strip().splitlines() == [
        "audit chain broken at record 3: record 3 was edited: its hash does not match its contents"
    ]


def test_the_demo_trace_prints_as_a_waterfall(tmp_path: Path) -> None:
    result = run("demo", "--json", state_dir=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    trace_id = json.loads(result.stdout)["trace_id"]
    assert len(trace_id) == 32
    spans_file = str(tmp_path / "spans.jsonl")
    shown = run("trace", trace_id, "--file", spans_file, state_dir=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert f"trace {trace_id}" in shown.stdout
    # A tool step's span is its tool call: shown as "step {id} · tool {tool}".
    for name in ("invoke_agent orchestrator", "stratagem.v1.AgentService/Call", "· tool "):
        assert name in shown.stdout
    as_json = run("trace", trace_id[:12], "--file", spans_file, "--json", state_dir=tmp_path)
    assert as_json.returncode == 0, as_json.stderr
    tree = json.loads(as_json.stdout)
    assert tree["trace_id"] == trace_id
    services: set[str] = set()
    nodes = list(tree["spans"])
    while nodes:
        node = nodes.pop()
        services.add(node["service"])
        nodes.extend(node["children"])
    assert len(services) >= 3, services
    for service in services:
        assert service in shown.stdout
    unknown = run("trace", "0" * 32, "--file", spans_file, state_dir=tmp_path)
    assert unknown.returncode == 2
    assert len(unknown.stderr.strip().splitlines()) == 1


def test_demo_pretty_output_shows_trees_trace_and_audit(tmp_path: Path) -> None:
    result = run("demo", state_dir=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    for expected in ("Action sequence", "World-state changes", "trace ", "audit ", "orchestrator"):
        assert expected in result.stdout


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    state_dir = tmp_path_factory.mktemp("deployed")
    up = run(
        "up",
        "--json",
        state_dir=state_dir,
        STRATAGEM_MAX_MESSAGE_BYTES=str(MAX_MESSAGE_BYTES),
        STRATAGEM_EXTENSIONS="examples.extensions.word_count",
    )
    try:
        assert up.returncode == 0, up.stderr[-2000:]
        yield state_dir
    finally:
        down = run("down", "--json", state_dir=state_dir)
        assert down.returncode == 0, down.stderr[-2000:]
        assert json.loads(down.stdout)["stopped_local_ray"] is True


def test_up_is_idempotent_and_status_lists_agents(deployed: Path) -> None:
    first = json.loads(run("status", "--json", state_dir=deployed).stdout)
    again = run("up", "--json", state_dir=deployed)
    assert again.returncode == 0, again.stderr[-2000:]
    second = json.loads(run("status", "--json", state_dir=deployed).stdout)
    assert {a["role"] for a in first["agents"]} == {
        "orchestrator",
        "perception",
        "strategic",
        "tactical",
    }
    # Re-running up changed nothing: same processes, same endpoints.
    assert {a["pid"] for a in first["agents"]} == {a["pid"] for a in second["agents"]}
    for agent in second["agents"]:
        assert agent["endpoint"].rpartition(":")[2].isdigit()
        assert agent["node_id"]


def test_request_against_the_deployment(deployed: Path) -> None:
    payload = json.dumps({"text": "Mira waits in the courtyard. The courtyard leads to the gate."})
    result = run("request", "perception", "ExtractEntities", "--json", payload, state_dir=deployed)
    assert result.returncode == 0, result.stderr[-2000:]
    answer = json.loads(result.stdout)
    assert {"mira", "courtyard", "gate"} <= {e["id"] for e in answer["entities"]}


def test_an_operator_without_the_secret_is_told_where_it_comes_from(
    deployed: Path, tmp_path: Path
) -> None:
    payload = '{"text": "Mira waits."}'
    missing = tmp_path / "elsewhere" / "cluster.secret"
    # An operator machine needs only the operator's key, not the cluster secret.
    keyed = run(
        "request", "perception", "ExtractEntities", "--json", payload,
        state_dir=deployed, STRATAGEM_SECRET_FILE=str(missing),
    )  # fmt: skip
    assert keyed.returncode == 0, keyed.stderr[-2000:]
    no_key = tmp_path / "elsewhere" / "operator.key"
    result = run(
        "request", "perception", "ExtractEntities", "--json", payload,
        state_dir=deployed, STRATAGEM_SECRET_FILE=str(missing),
        STRATAGEM_OPERATOR_KEY_FILE=str(no_key),
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"no operator key at {no_key} (nor a cluster secret at {missing}" in lines[0]
    assert "copy" in lines[0]
    # No new secret or key was made: one would match no agent.
    assert not missing.exists()
    assert not no_key.exists()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("request", "narrator", "ExtractEntities"), "unknown agent 'narrator'"),
        (("request", "perception", "PlanNarrativeArc"), "has no capability 'PlanNarrativeArc'"),
        (("request", "perception", "ExtractEntities", "--json", "{not json"), "not valid JSON"),
        (("request", "perception", "ExtractEntities", "--json", '{"text": ""}'), "text"),
        (
            (
                "request",
                "strategic",
                "PlanNarrativeArc",
                "--json",
                '{"goal": "g", "protagonist": "mira", "beats": 99}',
            ),
            "beats",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: tuple[str, ...], fragment: str, tmp_path: Path
) -> None:
    result = run(*args, state_dir=tmp_path, timeout=60)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert fragment in lines[0]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "command",
    [
        ("demo",),
        ("submit", "examples/crown.yaml"),
        ("up",),
        ("status",),
        ("down",),
        ("request", "perception", "ExtractEntities"),
        ("plans", "show", "p1"),
        ("audit", "verify"),
    ],
)
@pytest.mark.parametrize(
    ("variable", "value", "fragment"),
    [
        ("STRATAGEM_MAX_RESTARTS", "often", "max_restarts"),
        ("STRATAGEM_PLACEMENT", "{not json", "placement"),
    ],
)
def test_a_bad_setting_is_one_line_and_exit_2_for_every_command(
    command: tuple[str, ...], variable: str, value: str, fragment: str, tmp_path: Path
) -> None:
    result = run(*command, state_dir=tmp_path, timeout=60, **{variable: value})
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "invalid settings" in lines[0]
    assert fragment in lines[0]
    assert not (tmp_path / "local-ray.json").exists()  # nothing started


@pytest.mark.parametrize(
    ("caller", "refusal"),
    [
        (
            "perception",
            "the operator cannot act as 'perception': it is one of the deployment's agents, "
            "which sign with keys the operator does not hold",
        ),
        (
            "orchestrator",
            "the operator cannot act as 'orchestrator': it is one of the deployment's agents, "
            "which sign with keys the operator does not hold",
        ),
        ("Bad Name", "'Bad Name' is not an identity (lowercase, ^[a-z][a-z0-9_-]{0,63}$)"),
        (
            "auditor",
            "the operator's key signs only as 'operator', not as 'auditor'; 'stratagem secret "
            "issue auditor --out FILE' writes a key for 'auditor' (then "
            "STRATAGEM_OPERATOR_KEY_FILE=FILE)",
        ),
    ],
)
def test_the_operator_cannot_pose_as_an_agent_or_another_identity(
    deployed: Path, caller: str, refusal: str
) -> None:
    payload = json.dumps({"text": "Mira waits in the courtyard."})
    result = run(
        "request",
        "strategic",
        "AnalyzeNarrative",
        "--as",
        caller,
        "--json",
        payload,
        state_dir=deployed,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [f"error: {refusal}"]
    verify = run("audit", "verify", "--json", state_dir=deployed)
    assert verify.returncode == 0, verify.stderr
    assert json.loads(verify.stdout)["ok"] is True


def test_a_deadline_no_goal_could_meet_is_refused_up_front(deployed: Path) -> None:
    # Before: DEADLINE_EXCEEDED, once the agents had been found (seconds later). The deadline
    # passing while a goal runs is tests/integration/runtime/test_goal_deadline.py's.
    result = run(
        "submit", str(EXAMPLES / "crown.yaml"), "--timeout", "0.005", state_dir=deployed, timeout=60
    )
    assert result.returncode == 2
    assert "--timeout 0.005 s is too short for a goal" in result.stderr
    assert "Traceback" not in result.stderr


def _plan_file(tmp_path: Path, steps: list[dict[str, object]], owner: str = "strategic") -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(json.dumps({"id": "mine", "owner": owner, "goal": "g", "steps": steps}))
    return path


@pytest.mark.parametrize(
    ("steps", "fragment"),
    [
        (
            [{"kind": "tool", "id": "apply", "tool": "apply_actions", "input": {}}],
            "step 'apply' uses tool 'apply_actions', which is not in the strategic agent's "
            "registry",
        ),
        (
            [
                {
                    "kind": "tool",
                    "id": "a",
                    "tool": "score_themes",
                    "input": {},
                    "depends_on": ["b"],
                },
                {
                    "kind": "tool",
                    "id": "b",
                    "tool": "score_themes",
                    "input": {},
                    "depends_on": ["a"],
                },
            ],
            "cycle: ",
        ),
    ],
    ids=["another-agents-tool", "cycle"],
)
def test_a_bad_plan_is_one_line_and_exit_2(
    steps: list[dict[str, object]], fragment: str, tmp_path: Path
) -> None:
    result = run("plans", "run", str(_plan_file(tmp_path, steps)), state_dir=tmp_path, timeout=60)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert fragment in lines[0]
    # Refused before anything started: no Ray, no state written.
    assert not (tmp_path / "audit.sqlite3").exists()


def test_a_written_plan_runs_on_its_owner(deployed: Path) -> None:
    result = run(
        "plans", "run", str(EXAMPLES / "plans" / "who-leads.yaml"), "--json", state_dir=deployed
    )
    assert result.returncode == 0, result.stderr[-2000:]
    snapshot = json.loads(result.stdout)
    assert (snapshot["plan_id"], snapshot["agent"], snapshot["status"]) == (
        "who-leads",
        "strategic",
        "succeeded",
    )
    shown = run("plans", "show", "who-leads", "--json", state_dir=deployed)
    assert shown.returncode == 0, shown.stderr
    assert [s["agent"] for s in json.loads(shown.stdout)["plans"]] == ["strategic"]


def test_an_oversized_request_is_resource_exhausted(deployed: Path) -> None:
    text = "Mira waits in the courtyard. " * 650  # ~19 KB: valid, but over the agents' limit
    assert MAX_MESSAGE_BYTES < len(text) < 20_000
    payload = json.dumps({"text": text})
    result = run("request", "perception", "ExtractEntities", "--json", payload, state_dir=deployed)
    assert result.returncode == 1
    assert "RESOURCE_EXHAUSTED" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_extension_capability_is_served_by_the_deployment(deployed: Path) -> None:
    result = run(
        "request",
        "strategic",
        "CountWords",
        "--json",
        '{"text": "the key, the crown, the tower"}',
        state_dir=deployed,
        STRATAGEM_EXTENSIONS="examples.extensions.word_count",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    answer = json.loads(result.stdout)
    assert (answer["words"], answer["distinct"], answer["most_common"][0]) == (6, 4, "the")


# -- control: approve, reject, pause, cancel, resume ---------------------------------------------


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("approve", "bad id!", "g", "--rationale", "ok"), "invalid approve of plan"),
        (("approve", "p", "g", "--rationale", "ok", "--output", "[1]"), "--output must be"),
        (("approve", "p", "g", "--rationale", "ok", "--output", "{"), "--output is not valid"),
        (("pause", "p"), "no Stratagem deployment found"),
    ],
)
def test_control_bad_input_is_one_line(
    args: tuple[str, ...], fragment: str, tmp_path: Path
) -> None:
    result = run(*args, state_dir=tmp_path, timeout=60)
    assert result.returncode == (1 if args[0] == "pause" else 2), result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert fragment in lines[0]
    assert "Traceback" not in result.stderr


def test_a_gate_is_approved_from_the_cli(deployed: Path, tmp_path: Path) -> None:
    text = "Mira waits in the courtyard. Mira wants the silver crown."
    plan = {
        "id": "cli-gated",
        "owner": "strategic",
        "goal": "wait for a yes",
        "steps": [
            {"kind": "gate", "id": "ok", "prompt": "Go on?"},
            {
                "kind": "tool",
                "id": "protagonist",
                "tool": "find_protagonist",
                "input": {"text": text, "entities": []},
                "depends_on": ["ok"],
            },
        ],
    }
    path = tmp_path / "gated.json"
    path.write_text(json.dumps(plan))
    missing = run("cancel", "no-such-plan", state_dir=deployed)
    assert missing.returncode == 2
    assert "no plan 'no-such-plan' on any agent" in missing.stderr
    # `plans run` returns as soon as the plan waits at its gate, naming the command to run.
    ran = run("plans", "run", str(path), "--json", state_dir=deployed)
    assert ran.returncode == 3, ran.stderr[-2000:]
    blocked = json.loads(ran.stdout)
    assert blocked["status"] == "blocked"
    assert blocked["approve"] == ["stratagem approve cli-gated ok --rationale 'why it may go on'"]
    assert len(blocked["trace_id"]) == 32
    wrong = run("reject", "cli-gated", "nope", "--rationale", "x", state_dir=deployed)
    assert wrong.returncode == 2  # a decision that does not apply is bad input
    assert "FAILED_PRECONDITION" in wrong.stderr
    approved = run(
        "approve", "cli-gated", "ok", "--rationale", "looks right", "--json", state_dir=deployed
    )
    assert approved.returncode == 0, approved.stderr
    assert json.loads(approved.stdout)["agent"] == "strategic"
    # Watch and show agree on how the plan ended.
    watched = run("plans", "watch", "cli-gated", state_dir=deployed, timeout=120)
    assert watched.returncode == 0, watched.stderr[-2000:]
    assert "step ok -> blocked, waiting for approval: Go on?" in watched.stdout
    shown = json.loads(run("plans", "show", "cli-gated", "--json", state_dir=deployed).stdout)
    assert shown["status"] == "succeeded"
    assert f"the plan ended {shown['status']};" in watched.stdout
    assert shown["plans"][0]["steps"][0]["message"] == "approved by operator: looks right"
    audit = sqlite3.connect(deployed / "audit.sqlite3")
    try:
        details = [
            row[0]
            for row in audit.execute(
                "SELECT detail FROM audit "
                "WHERE capability = 'Control.approve' AND actor = 'operator'"
            )
        ]
    finally:
        audit.close()
    assert any("gate ok by operator: looks right" in detail for detail in details)


def _one_line(result: subprocess.CompletedProcess[str], code: int, fragment: str) -> None:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == code, result.stderr
    assert len(lines) == 1, result.stderr
    assert fragment in lines[0], lines[0]
    assert "Traceback" not in result.stderr


def test_a_gate_that_asks_and_a_fork_from_the_cli(deployed: Path, tmp_path: Path) -> None:
    plan = {
        "id": "cli-asks",
        "owner": "strategic",
        "goal": "ask who leads, then read the answer",
        "steps": [
            {"kind": "gate", "id": "pick", "prompt": "Who leads?", "choices": ["Mira", "Tomas"]},
            {
                "kind": "tool",
                "id": "protagonist",
                "tool": "find_protagonist",
                "input": {
                    "text": {"$expr": "join(' ', [pick.value, 'wants the silver crown.'])"},
                    "entities": [],
                },
                "depends_on": ["pick"],
            },
        ],
    }
    path = tmp_path / "asks.json"
    path.write_text(json.dumps(plan))
    # `plans run` returns as soon as the plan waits at its gate (exit 3).
    ran = run("plans", "run", str(path), "--json", state_dir=deployed)
    assert ran.returncode == 3, ran.stderr[-2000:]
    blocked = json.loads(ran.stdout)
    assert blocked["status"] == "blocked"
    [gate] = blocked["gates"]
    assert json.loads(gate["choices_json"]) == ["Mira", "Tomas"]
    not_offered = run(
        "approve",
        "cli-asks",
        "pick",
        "--rationale",
        "r",
        "--value",
        '"Ana"',
        state_dir=deployed,
    )
    _one_line(not_offered, 2, "value: 'Ana' is not one of the choices 'Mira', 'Tomas'")
    approved = run(
        "approve",
        "cli-asks",
        "pick",
        "--rationale",
        "she does",
        "--value",
        '"Mira"',
        state_dir=deployed,
    )
    assert approved.returncode == 0, approved.stderr
    watched = run("plans", "watch", "cli-asks", "--json", state_dir=deployed, timeout=120)
    assert json.loads(watched.stdout.splitlines()[-1])["status"] == "succeeded"
    shown = json.loads(run("plans", "show", "cli-asks", "--json", state_dir=deployed).stdout)
    assert shown["status"] == "succeeded"
    closed = run(
        "approve",
        "cli-asks",
        "pick",
        "--rationale",
        "again",
        "--value",
        '"Mira"',
        state_dir=deployed,
    )
    _one_line(closed, 2, "FAILED_PRECONDITION")
    shown = run("plans", "show", "cli-asks", state_dir=deployed)
    assert 'approved by operator with "Mira"' in shown.stdout
    _one_line(run("plans", "fork", "cli-asks", "--at", "nope", state_dir=deployed), 2, "at_step")
    _one_line(
        run(
            "plans",
            "fork",
            "cli-asks",
            "--at",
            "protagonist",
            "--set",
            'protagonist.output={"x": 1}',
            state_dir=deployed,
        ),
        2,
        "step 'protagonist' is not before the fork point",
    )
    _one_line(
        run("plans", "fork", "cli-asks", "--set", "pick=1", state_dir=deployed),
        2,
        "expected STEP.output=JSON",
    )
    forked = run(
        "plans",
        "fork",
        "cli-asks",
        "--at",
        "protagonist",
        "--id",
        "cli-asks-2",
        "--set",
        'pick.output={"approved": true, "approver": "operator", "rationale": "", "value": "Tomas"}',
        "--json",
        state_dir=deployed,
    )
    assert forked.returncode == 0, forked.stderr
    assert json.loads(forked.stdout)["plan_id"] == "cli-asks-2"
    for _ in range(100):
        shown = run("plans", "show", "cli-asks-2", state_dir=deployed)
        if shown.returncode == 0 and "succeeded" in shown.stdout.splitlines()[1]:
            break
    else:
        pytest.fail(f"the fork did not finish: {shown.stdout[-500:]}")
    assert "forked from plan cli-asks revision 1 at step protagonist" in shown.stdout
    replayed = run("replay", "cli-asks-2", state_dir=deployed)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr


def _who_leads(tmp_path: Path, plan_id: str, text: str | None = None) -> Path:
    plan = yaml.safe_load((EXAMPLES / "plans" / "who-leads.yaml").read_text(encoding="utf-8"))
    plan["id"] = plan_id
    if text is not None:
        plan["steps"][-1]["input"]["text"] = text
    path = tmp_path / f"{plan_id}-{len(text or '')}.yaml"
    path.write_text(yaml.safe_dump(plan), encoding="utf-8")
    return path


def test_a_finished_plan_replays_without_divergence(deployed: Path, tmp_path: Path) -> None:
    ran = run("plans", "run", str(_who_leads(tmp_path, "cli-replayed")), state_dir=deployed)
    assert ran.returncode == 0, ran.stderr[-2000:]
    shown = run("replay", "cli-replayed", state_dir=deployed)
    assert shown.returncode == 0, shown.stderr[-2000:]
    # Two steps, four decisions each (order, outcomes, status, output), and the plan's status.
    assert "no divergence: 9 decisions re-derived" in shown.stdout
    as_json = run("replay", "cli-replayed", "--json", state_dir=deployed)
    assert as_json.returncode == 0, as_json.stderr[-2000:]
    report = json.loads(as_json.stdout)
    assert (report["agent"], report["diverged"], report["divergences"]) == ("strategic", False, [])
    missing = run("replay", "no-such-plan", state_dir=deployed)
    assert missing.returncode == 2
    assert "no plan 'no-such-plan'" in missing.stderr


def test_a_replanned_plan_shows_its_revisions(deployed: Path, tmp_path: Path) -> None:
    ran = run("plans", "run", str(_who_leads(tmp_path, "cli-revised")), state_dir=deployed)
    assert ran.returncode == 0, ran.stderr[-2000:]
    changed = _who_leads(tmp_path, "cli-revised", text="Oren wakes in the tower. Oren leads.")
    replanned = run(
        "replan", "cli-revised", str(changed), "--rationale", "new passage", state_dir=deployed
    )
    assert replanned.returncode == 0, replanned.stderr[-2000:]
    assert "revision 2" in replanned.stdout
    history = run("plans", "show", "cli-revised", "--revisions", "--json", state_dir=deployed)
    assert history.returncode == 0, history.stderr[-2000:]
    revisions = json.loads(history.stdout)["revisions"]
    assert [(r["revision"], r["parent"]) for r in revisions] == [(1, 0), (2, 1)]
    assert revisions[1]["rationale"] == "new passage"
    assert revisions[1]["author"] == "operator"
    assert [c["step_id"] for c in revisions[1]["changed"]] == ["themes"]
    table = run("plans", "show", "cli-revised", "--revisions", state_dir=deployed)
    assert table.returncode == 0, table.stderr[-2000:]
    assert "new passage" in table.stdout
    assert "themes (input)" in table.stdout


def test_describe_lists_capabilities_and_shows_one_schema(deployed: Path) -> None:
    listed = run("describe", "perception", state_dir=deployed)
    assert listed.returncode == 0, listed.stderr[-2000:]
    for name in ("ExtractEntities", "FindSpatialContext", "UpdateWorldState"):
        assert name in listed.stdout
    one = run("describe", "perception", "ExtractEntities", "--json", state_dir=deployed)
    assert one.returncode == 0, one.stderr[-2000:]
    card = json.loads(one.stdout)
    assert card["role"] == "perception"
    assert [c["name"] for c in card["capabilities"]] == ["ExtractEntities"]
    assert "text" in card["capabilities"][0]["request_schema"]["properties"]
    unknown = run("describe", "perception", "PlanNarrativeArc", state_dir=deployed)
    assert unknown.returncode == 2
    assert (
        "valid: ExtractEntities, FindSpatialContext, ListWorlds, ResetWorld, ShowWorld, "
        "UpdateWorldState" in unknown.stderr
    )


def test_plans_list_show_as_a_picture_and_watch(deployed: Path) -> None:
    payload = json.dumps({"text": "Ada waits in the tower."})
    made = run("request", "perception", "ExtractEntities", "--json", payload, state_dir=deployed)
    assert made.returncode == 0, made.stderr[-2000:]
    listed = run("plans", "list", "--agent", "perception", "--json", state_dir=deployed)
    assert listed.returncode == 0, listed.stderr[-2000:]
    plans = json.loads(listed.stdout)["plans"]
    assert plans
    assert {p["agent"] for p in plans} == {"perception"}
    done = run(
        "plans",
        "list",
        "--agent",
        "perception",
        "--status",
        "succeeded",
        "--json",
        state_dir=deployed,
    )
    plan_id = json.loads(done.stdout)["plans"][0]["plan_id"]

    picture = run("plans", "show", plan_id, "--format", "mermaid", state_dir=deployed)
    assert picture.returncode == 0, picture.stderr[-2000:]
    assert picture.stdout.startswith("flowchart TD\n")
    assert ":::succeeded" in picture.stdout
    dot = run("plans", "show", plan_id, "--format", "dot", state_dir=deployed)
    assert dot.stdout.startswith("digraph plan {")

    # A finished plan's stream replays its events and ends.
    watched = run("plans", "watch", plan_id, "--json", state_dir=deployed, timeout=60)
    assert watched.returncode == 0, watched.stderr[-2000:]
    events = [json.loads(line) for line in watched.stdout.splitlines()]
    assert events
    assert events[-1]["plan_id"] == plan_id
    assert events[-1]["status"] == "succeeded"


def test_status_from_another_folder_through_a_profile(deployed: Path, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'[profiles.here]\nstate_dir = "{deployed}"\n', encoding="utf-8")
    elsewhere = tmp_path / "some" / "other" / "folder"
    elsewhere.mkdir(parents=True)
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"STRATAGEM_STATE_DIR", "RAY_ADDRESS", "STRATAGEM_PROFILE"}
    }
    env.update(STRATAGEM_CONFIG=str(config), XDG_STATE_HOME=str(tmp_path / "state"))

    def there(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [STRATAGEM, *args],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=elsewhere,
            check=False,
        )

    found = there("--profile", "here", "status", "--json")
    assert found.returncode == 0, found.stderr[-2000:]
    assert len(json.loads(found.stdout)["agents"]) == 4
    # Without the profile, that folder has no deployment: the user's default is empty.
    plain = there("status")
    assert plain.returncode == 1
    assert "no Stratagem deployment found" in plain.stderr
    unknown = there("--profile", "nowhere", "status")
    assert unknown.returncode == 2
    assert "no profile 'nowhere'; valid: here" in unknown.stderr


# Runs the CLI's entry point in this process, then says whether it imported Ray.
_RAY_PROBE = """
import sys
from stratagem.runtime._cli import main
sys.argv = ["stratagem", *sys.argv[1:]]
try:
    main()
except SystemExit as exc:
    code = exc.code
else:
    code = 0
print(f"RAY={'ray' in sys.modules} EXIT={code}", file=sys.stderr)
"""


def _probe(*args: str, state_dir: Path) -> tuple[str, str]:
    env = dict(os.environ, STRATAGEM_STATE_DIR=str(state_dir))
    env.pop("RAY_ADDRESS", None)
    result = subprocess.run(
        [sys.executable, "-c", _RAY_PROBE, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=REPO,
        check=False,
    )
    status = next(line for line in result.stderr.splitlines() if line.startswith("RAY="))
    return status, result.stdout


def test_every_agent_serves_a2a_at_the_url_status_gives(deployed: Path) -> None:
    import httpx

    from stratagem.protocol import ClusterSecret, TokenSigner

    agents = json.loads(run("status", "--json", state_dir=deployed).stdout)["agents"]
    urls = {a["role"]: a["a2a_url"] for a in agents}
    assert set(urls) == {"orchestrator", "perception", "strategic", "tactical"}
    for url in urls.values():
        assert url.startswith("http://127.0.0.1:")  # loopback by default
    token = TokenSigner(ClusterSecret.load(deployed / "cluster.secret")).issue("operator", 600)
    with httpx.Client(timeout=30) as http:
        card = http.get(urls["perception"] + ".well-known/agent-card.json").json()
        assert card["supportedInterfaces"][0]["url"] == urls["perception"]
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "SendMessage",
            "params": {
                "message": {
                    "messageId": "e2e-1",
                    "role": "ROLE_USER",
                    "parts": [{"text": "Mira is a knight. Mira is in the courtyard."}],
                }
            },
        }
        headers = {"A2A-Version": "1.0"}
        refused = http.post(urls["perception"], json=body, headers=headers)
        assert refused.status_code == 401
        headers["Authorization"] = f"Bearer {token}"
        task = http.post(urls["perception"], json=body, headers=headers).json()["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    entities = task["artifacts"][0]["parts"][0]["data"]["entities"]
    assert {"mira", "courtyard"} <= {e["id"] for e in entities}


def test_request_reaches_the_published_endpoint_without_joining_ray(deployed: Path) -> None:
    published = json.loads((deployed / "endpoints" / "perception.json").read_text())
    agents = json.loads(run("status", "--json", state_dir=deployed).stdout)["agents"]
    perception = next(a for a in agents if a["role"] == "perception")
    logs = published.pop("logs")
    assert published == {"endpoint": perception["endpoint"], "pid": perception["pid"]}
    # Its Ray worker's .out and .err, for `stratagem logs perception`.
    assert sorted(Path(path).suffix for path in logs) == [".err", ".out"]

    payload = json.dumps({"text": "Mira waits in the courtyard."})
    status, out = _probe(
        "request", "perception", "ExtractEntities", "--json", payload, state_dir=deployed
    )
    assert status == "RAY=False EXIT=0"
    assert "mira" in {e["id"] for e in json.loads(out)["entities"]}
    # The plan commands, too, go to the published endpoints.
    status, out = _probe("plans", "list", "--agent", "perception", "--json", state_dir=deployed)
    assert status == "RAY=False EXIT=0"
    assert {p["agent"] for p in json.loads(out)["plans"]} == {"perception"}


def test_a_stale_published_endpoint_falls_back_to_ray(deployed: Path) -> None:
    path = deployed / "endpoints" / "perception.json"
    kept = path.read_text()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    try:
        path.write_text(json.dumps({"endpoint": "127.0.0.1:9", "pid": int(dead.stdout)}))
        status, out = _probe(
            "request",
            "perception",
            "ExtractEntities",
            "--json",
            json.dumps({"text": "Mira waits in the courtyard."}),
            state_dir=deployed,
        )
        assert status == "RAY=True EXIT=0"
        assert "mira" in {e["id"] for e in json.loads(out)["entities"]}
    finally:
        path.write_text(kept)


def _readme_python_examples() -> list[str]:
    """The examples of the Python API's page (the README links to it)."""
    page = (REPO / "docs" / "python-api.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", page, re.S)


def test_the_readme_python_api_runs_against_the_deployment(deployed: Path) -> None:
    examples = _readme_python_examples()
    assert len(examples) == 2
    env = dict(os.environ, STRATAGEM_STATE_DIR=str(deployed))
    env.pop("RAY_ADDRESS", None)
    outputs = []
    for code in examples:
        result = subprocess.run(
            [sys.executable, "-c", code + "\nimport sys\nprint('RAY', 'ray' in sys.modules)\n"],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=REPO,
            check=False,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        outputs.append(result.stdout.splitlines())
    blocking, asynchronous = outputs
    assert "'mira'" in blocking[0]
    assert blocking[1].startswith("who-leads-")
    assert blocking[1].endswith(" strategic succeeded")
    assert blocking[-2] == "(plan) succeeded"
    assert asynchronous[0].startswith("strategic ['AnalyzeNarrative'")
    assert "no plan 'no-such-plan' on any agent" in asynchronous
    # Neither example joined Ray: the published endpoints served them.
    assert blocking[-1] == asynchronous[-1] == "RAY False"


# Last in the module: it gives the shared deployment a new secret (and redeploys its agents).
def test_a_deleted_secret_is_noticed_by_up_and_mended_by_rotate(
    deployed: Path, tmp_path: Path
) -> None:
    secret = deployed / "cluster.secret"
    old = tmp_path / "old.secret"
    old.write_bytes(secret.read_bytes())
    old.chmod(0o600)
    old_key = tmp_path / "old-operator.key"
    old_key.write_bytes((deployed / "operator.key").read_bytes())
    old_key.chmod(0o600)
    secret.unlink()
    up = run("up", "--json", state_dir=deployed)
    assert up.returncode == 1, up.stderr[-2000:]
    lines = up.stderr.strip().splitlines()
    assert len(lines) == 1, up.stderr
    # A failing up changes nothing: it names the running agents' secret, writes none of its own.
    assert "hold a cluster secret" in lines[0]
    assert "up --replace" in lines[0]
    assert "(nothing was written)" in lines[0]
    assert not secret.exists()
    rotated = run(
        "secret",
        "rotate",
        "--json",
        state_dir=deployed,
        STRATAGEM_MAX_MESSAGE_BYTES=str(MAX_MESSAGE_BYTES),
        STRATAGEM_EXTENSIONS="examples.extensions.word_count",
    )
    assert rotated.returncode == 0, rotated.stderr[-2000:]
    key_id = json.loads(rotated.stdout)["key_id"]
    assert {a["secret_id"] for a in json.loads(rotated.stdout)["agents"]} == {key_id}
    payload = '{"text": "Mira waits."}'
    fresh = run("request", "perception", "ExtractEntities", "--json", payload, state_dir=deployed)
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    # Another operator machine's copy of the old operator key (or of the old secret) is refused.
    for copy in (
        {"STRATAGEM_OPERATOR_KEY_FILE": str(old_key)},
        {
            "STRATAGEM_OPERATOR_KEY_FILE": str(tmp_path / "none.key"),
            "STRATAGEM_SECRET_FILE": str(old),
        },
    ):
        stale = run(
            "request", "perception", "ExtractEntities", "--json", payload,
            state_dir=deployed, **copy,
        )  # fmt: skip
        assert stale.returncode == 1, stale.stderr[-2000:]
        assert "UNAUTHENTICATED" in stale.stderr


# After the secret test: it leaves the shared deployment's strategic agent without its store.
def test_status_names_a_deleted_plan_store(deployed: Path) -> None:
    plans = deployed / "strategic.plans.sqlite3"
    plans.unlink()
    result = run("status", state_dir=deployed)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(
        f"error: not serving: strategic (plan store missing: {plans} was deleted after"
    )
    assert "plan store missing" in result.stdout
