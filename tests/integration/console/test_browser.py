"""The console in a real browser: Debian's headless Chromium driven by Playwright, against the
four real agents over gRPC (see ``conftest``). Each test leaves screenshots in the artifacts
folder."""

from __future__ import annotations

import asyncio
import json
import re
import struct
import zlib
from pathlib import Path
from typing import Any

import httpx
import pytest

from stratagem.agents import DEMO_GOAL
from stratagem.planning import ArtifactProvenance, ArtifactStore
from stratagem.protocol import SqliteAuditLog
from stratagem.runtime._console._app import dom_id
from stratagem.runtime.config._artifacts import artifacts_dir
from tests.integration.console.conftest import Running
from tests.integration.runtime._served import gated_plan
from tests.unit.planning._support import rot_artifact

pytestmark = pytest.mark.timeout(180)

SCRIPT = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2">'


def _sign_in(page: Any, running: Running) -> None:
    page.goto(running.login_url())
    page.wait_for_url(re.compile(r".*/plans$"))


async def _until_status(running: Running, plan_id: str, status: str) -> None:
    async with running.served.operator() as op:
        for _ in range(400):
            if any(s.plan_id == plan_id and s.status == status for s in await op.plans()):
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"plan {plan_id} never became {status}")


def test_sign_in_find_a_finished_goal_and_see_a_step_output(
    running: Running, page: Any, artifacts: Path
) -> None:
    async def pursue() -> Any:
        async with running.served.operator() as op:
            return await op.submit(DEMO_GOAL, timeout=60)

    outcome = running.run(pursue(), timeout=90)
    goal_plan = outcome.plan_id
    _sign_in(page, running)
    cookies = {c["name"]: c for c in page.context.cookies()}
    cookie = cookies[running.server.console.config.cookie_name]
    assert cookie["httpOnly"]
    assert cookie["sameSite"] == "Strict"
    page.screenshot(path=str(artifacts / "plans.png"), full_page=True)
    # Find the orchestrator's plan of the goal through the filters, then open it.
    page.select_option("select[name=agent]", "orchestrator")
    page.wait_for_selector("table.plans tbody tr td.mono a")
    link = page.locator("table.plans tbody tr td.mono a").first
    assert link.count() >= 1
    plan_id = goal_plan
    page.locator("table.plans a", has_text=plan_id).first.click()
    page.wait_for_selector(f"#{dom_id(plan_id)}")
    assert page.inner_text(f"#{dom_id(plan_id)}") == "succeeded"
    # The DAG is drawn (Mermaid made an SVG of it) and the events came over the live stream.
    page.wait_for_selector("#dag svg")
    page.wait_for_selector("#events li")
    page.wait_for_selector("#live-state:has-text('the plan ended')")
    # A step's output.
    first = page.locator("table.steps details").first
    first.locator("summary").click()
    output = first.locator("pre.output").inner_text()
    assert output.strip() not in ("", "—")
    page.screenshot(path=str(artifacts / "plan-finished-goal.png"), full_page=True)
    assert page.errors == []


def test_approve_a_waiting_gate_and_watch_the_plan_finish_live(
    running: Running, page: Any, artifacts: Path
) -> None:
    async def gated() -> Any:
        async with running.served.operator() as op:
            return await op.run_plan(gated_plan("gated"), timeout=120)

    finished = running.start(gated())
    running.run(_until_status(running, "gated", "blocked"))
    _sign_in(page, running)
    page.goto(f"{running.url}/gates")
    page.wait_for_selector("form.gate")
    assert "Go on?" in page.inner_text("form.gate")
    page.screenshot(path=str(artifacts / "gates.png"), full_page=True)
    page.locator("form.gate a", has_text="gated").click()
    badge = f"#{dom_id('gated')}"
    page.wait_for_selector(badge)
    assert page.inner_text(badge) == "blocked"
    page.wait_for_selector("#events li")  # the live stream is open
    page.fill("#open-gates input[name=rationale]", "the browser test says yes")
    page.screenshot(path=str(artifacts / "plan-blocked.png"), full_page=True)
    page.click("#open-gates button.approve")
    # No reload: the badge turns as the events arrive over SSE.
    page.wait_for_selector(f"{badge}:has-text('succeeded')", timeout=30_000)
    page.wait_for_selector("#action-outcome .outcome.ok")
    assert finished.result(30).status == "succeeded"
    page.wait_for_selector(f"#{dom_id('gated', 'protagonist')}:has-text('succeeded')")
    # The plan's body is drawn again once it ends: the decided gate's form is gone.
    page.wait_for_selector("#open-gates button.approve", state="detached", timeout=10_000)
    page.screenshot(path=str(artifacts / "plan-approved-live.png"), full_page=True)
    # Audited as from the CLI: the operator's Control.approve, accepted and answered OK.
    records = list(SqliteAuditLog(running.served.settings.audit_path).records())
    approvals = [r for r in records if r.capability == "Control.approve"]
    assert {(r.actor, r.action, r.code) for r in approvals} >= {
        ("operator", "call.accepted", ""),
        ("operator", "call.outcome", "OK"),
    }
    # A second decision on the closed gate: a clear refusal, nothing applied again.
    page.goto(f"{running.url}/plans/gated")
    response = page.request.post(
        f"{running.url}/api/actions/approve",
        data={"plan_id": "gated", "gate_id": "ok", "rationale": "again"},
        headers={"X-CSRF-Token": page.get_attribute("meta[name=csrf-token]", "content")},
    )
    assert response.status == 409
    assert "not applied" in response.json()["message"]
    assert (
        len(
            [
                r
                for r in SqliteAuditLog(running.served.settings.audit_path).records()
                if r.capability == "Control.approve" and r.code == "OK"
            ]
        )
        == 1
    )
    assert page.errors == []


def test_a_step_output_with_script_renders_as_text(
    running: Running, page: Any, artifacts: Path
) -> None:
    plan = {
        "id": "xss",
        "owner": "strategic",
        "goal": f"Show {SCRIPT} as text",
        "steps": [
            {
                "kind": "tool",
                "id": "summary",
                "tool": "summarize_narrative",
                "input": {"protagonist": SCRIPT, "themes": ["<b>bold</b>"], "tension": 0.5},
            }
        ],
    }

    async def run() -> Any:
        async with running.served.operator() as op:
            return await op.run_plan(plan)

    assert running.run(run()).status == "succeeded"
    _sign_in(page, running)
    page.goto(f"{running.url}/plans?q=xss")
    assert SCRIPT in page.inner_text("table.plans")  # the goal, as text
    page.goto(f"{running.url}/plans/xss")
    page.wait_for_selector("#live-state:has-text('the plan ended')")
    page.locator("table.steps summary").first.click()
    assert SCRIPT in page.inner_text("#goal")
    output = page.locator("pre.output").first.inner_text()  # JSON: its quotes escaped
    assert "A story about <script>window.__xss = 1</script><img src=x onerror=" in output
    assert page.locator("table.steps img").count() == 0
    assert page.evaluate("window.__xss") is None
    page.screenshot(path=str(artifacts / "plan-script-as-text.png"), full_page=True)


def test_without_the_cookie_everything_is_refused(running: Running, page: Any) -> None:
    with httpx.Client(base_url=running.url) as client:
        api = client.get("/api/plans")
        assert api.status_code == 401
        assert "login URL" in api.json()["error"]
        assert client.get("/plans").status_code == 401
        assert client.post("/actions/cancel", data={"plan_id": "x"}).status_code == 401
    page.goto(f"{running.url}/plans")
    assert "Not signed in" in page.inner_text("main")
    # A login URL works once: a second browser with the same URL is refused.
    url = running.login_url()
    page.goto(url)
    page.wait_for_url(re.compile(r".*/plans$"))
    other = page.context.browser.new_context()
    try:
        second = other.new_page()
        answer = second.goto(url)
        assert answer is not None
        assert answer.status == 403
    finally:
        other.close()
    # An action without the session's CSRF token is refused, even with the cookie.
    refused = page.request.post(f"{running.url}/api/actions/cancel", data={"plan_id": "x"})
    assert refused.status == 403


def test_unknown_names_and_a_down_agent(running: Running, page: Any, artifacts: Path) -> None:
    _sign_in(page, running)
    answer = page.goto(f"{running.url}/plans/no-such-plan")
    assert answer is not None
    assert answer.status == 404
    assert "no-such-plan" in page.inner_text("#missing")
    answer = page.goto(f"{running.url}/agents/nobody")
    assert answer is not None
    assert answer.status == 404
    assert "nobody" in page.inner_text("#missing")
    # One agent down: its row says so, the others and the plans of the rest still show.
    running.run(running.served.stop_agent("perception"))
    page.goto(f"{running.url}/agents")
    page.wait_for_selector("table.agents")
    rows = page.inner_text("table.agents")
    assert "perception" in rows
    assert "down" in rows
    assert "SERVING" in rows
    # Its status row says so too, its plans not counted (not shown as none).
    gone = "#agent-status tr[data-role='perception']"
    page.wait_for_selector(gone, timeout=10_000)
    cells = page.locator(f"{gone} td").all_inner_texts()
    assert (cells[1], cells[6], cells[7]) == ("down", "?", "?")
    assert cells[8]
    assert page.locator("#agent-status tr[data-role='strategic'] td.running").inner_text() == "0"
    page.goto(f"{running.url}/plans")
    assert "perception" in page.inner_text(".problems")
    page.screenshot(path=str(artifacts / "agent-down.png"), full_page=True)


ASKING_PLAN: dict[str, Any] = {
    "id": "asks",
    "owner": "strategic",
    "goal": "ask for a budget and a region, then find the protagonist",
    "steps": [
        {
            "kind": "gate",
            "id": "budget",
            "prompt": "How much may it spend?",
            "input_schema": {
                "type": "object",
                "properties": {
                    "amount": {"type": "integer", "minimum": 1, "maximum": 500},
                    "note": {"type": "string"},
                },
                "required": ["amount"],
            },
        },
        {
            "kind": "gate",
            "id": "region",
            "prompt": "Which region first?",
            "choices": ["north", "south"],
        },
        {
            "kind": "tool",
            "id": "protagonist",
            "tool": "find_protagonist",
            "input": {"text": "Mira wants the silver crown.", "entities": []},
            "depends_on": ["budget", "region"],
        },
    ],
}
APPROVAL_POLICY = """
[[approval]]
agent = "strategic"
tool = "find_protagonist"
prompt = "Find the protagonist"
"""


def _gate(page: Any, gate_id: str) -> Any:
    return page.locator(f"#open-gates form.gate:has(input[name=gate_id][value='{gate_id}'])")


def _decide(page: Any, gate_id: str, rationale: str, *, ok: bool) -> str:
    """Approve ``gate_id`` from the plan's page; the outcome line it answers."""
    form = _gate(page, gate_id)
    form.locator("input[name=rationale]").fill(rationale)
    form.locator("button.approve").click()
    kind = "ok" if ok else "refused"
    page.wait_for_selector(f"#action-outcome .outcome.{kind}")
    return str(page.inner_text(f"#action-outcome .outcome.{kind}"))


def test_the_console_decides_what_the_cli_can_values_choices_and_edited_arguments(
    running: Running, page: Any, artifacts: Path
) -> None:
    from stratagem.protocol import Policy

    running.served.agents["strategic"].use_policy(Policy.from_toml(APPROVAL_POLICY))

    async def asks() -> Any:
        async with running.served.operator() as op:
            return await op.run_plan(ASKING_PLAN, timeout=150)

    finished = running.start(asks())
    running.run(_until_status(running, "asks", "blocked"))
    _sign_in(page, running)
    page.goto(f"{running.url}/plans/asks")
    page.wait_for_selector("#events li")  # the live stream is open
    # A value that does not fit its schema: refused in one line naming the field, nothing kept.
    budget = _gate(page, "budget")
    budget.locator("[data-field='value.amount']").fill("900")
    refused = _decide(page, "budget", "too much", ok=False)
    assert "value.amount" in refused
    assert "500" in refused
    page.screenshot(path=str(artifacts / "gate-value-refused.png"), full_page=True)
    _gate(page, "budget").locator("[data-field='value.amount']").fill("200")
    _gate(page, "budget").locator("[data-field='value.note']").fill("for the launch")
    assert "budget" in _decide(page, "budget", "within the limit", ok=True)
    # The line saying it was applied goes once read.
    page.wait_for_selector("#action-outcome .outcome", state="detached", timeout=15_000)
    page.wait_for_selector("#open-gates form.gate:has(input[value='budget'])", state="detached")
    # A gate with choices: a pick of them.
    _gate(page, "region").locator("select[data-field='value']").select_option('"south"')
    _decide(page, "region", "south first", ok=True)
    # The tool's approval: its arguments shown to edit; edits that do not fit its input model
    # are refused naming the field; edits that fit run as a new revision by the operator.
    page.wait_for_selector("#open-gates form.gate:has(input[value='protagonist'])", timeout=30_000)
    arguments = _gate(page, "protagonist").locator("textarea[name=arguments]")
    assert "Mira wants the silver crown." in arguments.input_value()
    arguments.fill('{"text": 5, "entities": []}')
    assert "arguments.text" in _decide(page, "protagonist", "a bad edit", ok=False)
    _gate(page, "protagonist").locator("textarea[name=arguments]").fill(
        '{"text": "Tomas keeps the iron key; Tomas waits.", "entities": []}'
    )
    page.screenshot(path=str(artifacts / "gate-tool-arguments.png"), full_page=True)
    _decide(page, "protagonist", "about Tomas instead", ok=True)
    assert finished.result(60).status == "succeeded"
    page.wait_for_selector(f"#{dom_id('asks')}:has-text('succeeded')", timeout=30_000)
    page.wait_for_selector("table.revisions td:has-text('operator')", timeout=10_000)
    page.screenshot(path=str(artifacts / "gate-decided.png"), full_page=True)

    async def history() -> Any:
        async with running.served.operator() as op:
            return await op.plan("asks")

    steps = {s.id: s for s in running.run(history()).plans[0].steps}
    assert steps["budget"].output is not None
    assert steps["budget"].output["value"] == {"amount": 200, "note": "for the launch"}
    assert steps["region"].output is not None
    assert steps["region"].output["value"] == "south"
    assert steps["protagonist"].output == {"protagonist": "tomas"}
    assert page.errors == []


STEP: dict[str, Any] = {
    "kind": "tool",
    "id": "protagonist",
    "tool": "find_protagonist",
    "input": {"text": "Mira wants the silver crown.", "entities": []},
}


def test_the_plans_page_shows_goals_first_and_expands_to_every_plan(
    running: Running, page: Any, artifacts: Path
) -> None:
    async def pursue() -> tuple[Any, Any]:
        async with running.served.operator() as op:
            first = await op.submit(DEMO_GOAL, timeout=60)
            await op.run_plan(
                {"id": "by-hand", "owner": "strategic", "goal": "run by hand", "steps": [STEP]}
            )
            return first, await op.submit(DEMO_GOAL, timeout=60)

    first, second = running.run(pursue(), timeout=150)
    subs = len(first.plans) - 1
    assert subs >= 3
    _sign_in(page, running)
    rows = page.locator("table.plans tbody tr")
    assert rows.count() == 3
    ids = [rows.nth(i).locator("td.mono a").first.inner_text() for i in range(3)]
    assert ids == [second.plan_id, "by-hand", first.plan_id]
    counted = rows.nth(0).locator("a.subs")
    assert counted.inner_text() == f"+{subs} sub-plans"
    assert rows.nth(1).locator("a.subs").count() == 0
    page.screenshot(path=str(artifacts / "plans-goals-first.png"), full_page=True)
    # The expand control: every plan, sub-plans as rows of their own (kept in the URL).
    page.check("#every")
    page.wait_for_selector("table.plans tbody tr:nth-child(4)")
    assert rows.count() == 2 * (subs + 1) + 1
    assert "all=1" in page.url
    assert page.locator("table.plans a.subs").count() == 0
    page.uncheck("#every")
    page.wait_for_selector("table.plans tbody tr:nth-child(4)", state="detached")
    assert rows.count() == 3
    assert page.errors == []


def test_the_agents_page_shows_their_status_from_the_console_itself(
    running: Running, page: Any, artifacts: Path
) -> None:
    import os

    async def gated() -> Any:
        async with running.served.operator() as op:
            return await op.run_plan(gated_plan("waits"), timeout=120)

    finished = running.start(gated())
    running.run(_until_status(running, "waits", "blocked"))
    _sign_in(page, running)
    page.goto(f"{running.url}/agents")
    row = "#agent-status tr[data-role='strategic']"
    page.wait_for_selector(row, timeout=10_000)
    assert page.inner_text(f"{row} td.blocked") == "1"
    assert page.inner_text(f"{row} td.running") == "0"
    cells = page.locator(f"{row} td").all_inner_texts()
    assert cells[1:5] == ["serving", "SERVING", "127.0.0.1", str(os.getpid())]
    assert page.locator("#agent-status tr[data-role]").count() == 4
    page.screenshot(path=str(artifacts / "agents-status.png"), full_page=True)

    async def approve() -> None:
        async with running.served.operator() as op:
            await op.approve("waits", "ok", "done looking")

    running.run(approve())
    assert finished.result(30).status == "succeeded"
    assert page.errors == []


def test_a_gate_approved_on_the_gates_page_leaves_it(
    running: Running, page: Any, artifacts: Path
) -> None:
    async def gated() -> Any:
        async with running.served.operator() as op:
            return await op.run_plan(gated_plan("leaves"), timeout=120)

    finished = running.start(gated())
    running.run(_until_status(running, "leaves", "blocked"))
    _sign_in(page, running)
    page.goto(f"{running.url}/gates")
    page.fill("form.gate input[name=rationale]", "yes")
    page.click("form.gate button.approve")
    page.wait_for_selector("form.gate .outcome.ok")
    assert finished.result(30).status == "succeeded"
    # The decided gate's form goes with the line saying it was applied.
    page.wait_for_selector("form.gate", state="detached", timeout=15_000)
    assert page.errors == []


def _png() -> bytes:
    """A real 2x1 PNG (red, blue), as Chromium decodes it."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body))
            + kind
            + body
            + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
        )

    header = struct.pack(">IIBBBBB", 2, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00\xff\x00\x00\x00\x00\xff")
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


def test_the_artifact_pages_render_escaped_and_link_the_step(
    running: Running, page: Any, artifacts: Path
) -> None:
    plan = {
        "id": "report",
        "owner": "strategic",
        "goal": "A report",
        "steps": [
            {
                "kind": "tool",
                "id": "summary",
                "tool": "summarize_narrative",
                "input": {"protagonist": "Mira", "themes": ["duty"], "tension": 0.5},
            }
        ],
    }

    async def run() -> Any:
        async with running.served.operator() as op:
            return await op.run_plan(plan)

    assert running.run(run()).status == "succeeded"
    store = ArtifactStore.open(artifacts_dir(running.served.settings))
    made = ArtifactProvenance(
        agent="strategic", plan_id="report", revision=1, step_id="summary", attempt=1
    )
    where = {"scope": "plan", "scope_id": "report", "provenance": made}
    notes = store.save_blocking(
        "notes.md", f"# Notes\n{SCRIPT}".encode(), media_type="text/markdown", **where
    )
    store.save_blocking(
        "facts.json", json.dumps({"who": SCRIPT}).encode(), media_type="application/json", **where
    )
    store.save_blocking("chart.png", _png(), media_type="image/png", **where)
    rotten = store.save_blocking("rotten.txt", b"fine", media_type="text/plain", **where)
    store.index.close()
    rot_artifact(artifacts_dir(running.served.settings), rotten.digest)

    _sign_in(page, running)
    page.goto(f"{running.url}/artifacts")
    listed = page.inner_text("#artifacts")
    for name in ("notes.md", "facts.json", "chart.png", "rotten.txt"):
        assert name in listed

    page.click("text=notes.md")
    page.wait_for_selector("#artifact-text")
    assert SCRIPT in page.inner_text("#artifact-text")  # Markdown as its source, escaped
    assert page.locator("#content img").count() == 0
    assert page.evaluate("window.__xss") is None
    assert notes.digest in page.inner_text("#digest")
    page.screenshot(path=str(artifacts / "artifact-markdown.png"), full_page=True)
    page.click("#made-by")  # provenance: the step that made it
    page.wait_for_url(re.compile(r".*/plans/report#"))
    page.wait_for_selector(f"#{dom_id('report', 'summary')}")

    page.goto(f"{running.url}/artifacts?scope=plan&scope_id=report")
    page.click("text=facts.json")
    text = page.inner_text("#artifact-text")
    assert '"who": ' in text
    assert "<script>" in text
    assert page.evaluate("window.__xss") is None

    page.goto(f"{running.url}/artifacts")
    page.click("text=chart.png")
    page.wait_for_selector("#artifact-image")
    page.wait_for_function("document.querySelector('#artifact-image').complete")
    assert page.evaluate("document.querySelector('#artifact-image').naturalWidth") == 2
    page.screenshot(path=str(artifacts / "artifact-image.png"), full_page=True)

    page.goto(f"{running.url}/artifacts")
    page.click("text=rotten.txt")
    problem = page.inner_text("#artifact-problem")
    assert rotten.digest in problem
    assert "corrupted" in problem
    assert "fine" not in page.inner_text("#content")


def test_a_plain_words_goals_plan_page_shows_its_route_scores_and_revisions(
    running: Running, page: Any, artifacts: Path
) -> None:
    # There is no world 'lab' yet: that step fails (logic) and is dropped by a replan
    # (revision 2); the passage is read anyway.
    goal = "show the world lab and read the passage Mira waits in the courtyard"

    async def pursue() -> Any:
        async with running.served.operator() as op:
            return await op.ask(goal, timeout=60)

    answer = running.run(pursue(), timeout=90)
    assert (answer.status, answer.revisions) == ("partial", 2)
    _sign_in(page, running)
    page.goto(f"{running.url}/plans/{answer.plan_id}")
    page.wait_for_selector("#goal-route")
    assert page.inner_text("#route-kind") == "plan"
    assert page.inner_text("#route-revised") == "replanned: revision 2"
    shown = page.locator(f"#route-{dom_id('show_world')}")
    assert "perception.ShowWorld" in shown.inner_text()
    assert shown.locator("td.score").inner_text() == "1.00"
    assert "dropped" in shown.inner_text()
    assert "show_world failed: no world 'lab'" in shown.inner_text()
    read = page.locator(f"#route-{dom_id('extract_entities')}")
    assert "perception.ExtractEntities" in read.inner_text()
    assert "matched 'read the passage {text}'" in read.inner_text()
    assert read.locator(".status").inner_text() == "succeeded"
    # The revisions table says why revision 2 was made.
    assert "step 'show_world' failed (logic)" in page.inner_text("table.revisions")
    page.screenshot(path=str(artifacts / "plan-goal-route.png"), full_page=True)
    assert page.errors == []
