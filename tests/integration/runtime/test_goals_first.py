"""Goals first: ``plans list`` and ``Operator.history(top_level=True)`` list one row per
top-level plan (a goal's, a plan run by hand) with its sub-plans counted, not one row per
sub-plan; ``--all`` and any filter list every plan. Four real agents on 127.0.0.1 (``_served``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from stratagem.runtime import SyncOperator
from stratagem.runtime._cli import _app as cli_app
from tests.integration.runtime._served import WHO_LEADS, Served, served_in_a_thread
from tests.integration.runtime.test_history import GOAL, stratagem


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    with served_in_a_thread(tmp_path / "state") as running:
        yield running


def test_plans_list_shows_goals_first_with_their_sub_plans_folded(served: Served) -> None:
    with SyncOperator(settings=served.settings, directory=served.directory) as op:
        first = op.submit(GOAL)
        op.run_plan(WHO_LEADS)
        second = op.submit(GOAL)
        everything = op.history(page_size=1000).plans
        subs = len(first.plans) - 1
        assert subs >= 3  # a goal causes sub-plans on the other agents
        tops = [second.plan_id, "who-leads", first.plan_id]
        folded = op.history(top_level=True)
        assert [v.plan_id for v in folded.plans] == tops
        assert folded.sub_plans == {first.plan_id: subs, second.plan_id: subs, "who-leads": 0}
        # A page at a time: one top-level plan a page, each counted whole (a later page's
        # sub-plans may have been made before the page starts).
        token, paged, counted = "", [], {}
        while True:
            page = op.history(top_level=True, page_size=1, page_token=token)
            assert len(page.plans) <= 1
            paged += [v.plan_id for v in page.plans]
            counted.update(page.sub_plans)
            token = page.next_page_token
            if not token:
                break
        assert paged == tops
        assert counted == folded.sub_plans
    assert len(everything) == 2 * len(first.plans) + 1
    # The CLI: three rows at 80 columns, each goal "+N"; --all and a filter: every plan.
    saved = cli_app.console.width
    cli_app.console.width = 80
    try:
        listed = stratagem(served, "plans", "list")
    finally:
        cli_app.console.width = saved
    assert listed.exit_code == 0, listed.output
    lines = listed.stdout.splitlines()
    assert max(map(len, lines)) <= 80
    rows = [line for line in lines if first.plan_id in line or second.plan_id in line]
    assert len(rows) == 2
    assert all(line.rstrip().endswith(f"+{subs}") for line in rows)
    assert f"3 plans and {2 * subs} sub-plans (--all lists them)" in listed.stdout
    as_json = json.loads(stratagem(served, "plans", "list", "--json").stdout)
    assert [p["plan_id"] for p in as_json["plans"]] == tops
    assert as_json["sub_plans"][first.plan_id] == subs
    every = json.loads(stratagem(served, "plans", "list", "--all", "--json").stdout)
    assert len(every["plans"]) == len(everything)
    assert every["sub_plans"] == {}
    filtered = json.loads(
        stratagem(served, "plans", "list", "--status", "succeeded", "--json").stdout
    )
    assert {p["plan_id"] for p in filtered["plans"]} == {v.plan_id for v in everything}
