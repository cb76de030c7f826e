"""The console's memory page in a real browser (Debian's headless Chromium, see ``conftest``):
a namespace's items, recall by words, values shown as text, a refusal named on the page."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from stratagem.runtime import MemoryClient
from tests.integration.console.conftest import Running

pytestmark = pytest.mark.timeout(180)

SCRIPT = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2">'


def _fill(running: Running) -> None:
    async def fill() -> None:
        async with MemoryClient(settings=running.served.settings) as memory:
            await memory.put("user/ana", "likes", {"text": "ripe pears and figs"})
            await memory.put("user/ana", "html", {"text": SCRIPT})
            await memory.put("user/bo", "likes", {"text": "plums"}, ttl_s=3600)

    # On the agents' loop: Playwright's sync API keeps a loop running in the test's thread.
    running.run(fill())


def test_the_memory_page_lists_recalls_and_shows_values_as_text(
    running: Running, page: Any, artifacts: Path
) -> None:
    _fill(running)
    page.goto(running.login_url())
    page.wait_for_url(re.compile(r".*/plans$"))
    page.click("nav a[href='/memory']")
    page.fill("input[name=namespace]", "user")
    page.click("#memory-form button[type=submit]")
    page.wait_for_selector("#memory-items")
    keys = page.locator("#memory-items tbody tr").evaluate_all(
        "rows => rows.map(r => r.querySelector('td').innerText + ' ' + r.dataset.key)"
    )
    assert keys == ["user/ana html", "user/ana likes", "user/bo likes"]
    shown = page.inner_text("#memory-items tr[data-key='html'] pre.output")  # JSON: quotes escaped
    assert "<script>window.__xss = 1</script><img src=x onerror=" in shown
    assert page.locator("#memory-items img").count() == 0
    assert page.evaluate("window.__xss") is None
    page.screenshot(path=str(artifacts / "memory-list.png"), full_page=True)

    page.fill("input[name=q]", "pears")
    page.click("#memory-form button[type=submit]")
    page.wait_for_url(re.compile(r".*q=pears"))
    rows = page.locator("#memory-items tbody tr")
    assert rows.count() == 1
    assert rows.first.get_attribute("data-key") == "likes"
    assert "ripe pears and figs" in rows.first.inner_text()
    page.screenshot(path=str(artifacts / "memory-recall.png"), full_page=True)

    page.goto(f"{running.url}/memory?namespace=user//x")
    assert page.inner_text("#memory-problem").startswith("namespace: part '' is not")
    assert page.errors == []


def test_a_namespace_the_policy_refuses_is_named_and_the_api_agrees(
    running: Running, page: Any, tmp_path: Path
) -> None:
    _fill(running)
    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[[allow]]\ncaller = "operator"\ntarget = "*"\ncapabilities = ["*"]\n\n'
        '[[memory]]\ncaller = "operator"\nnamespaces = ["user/ana"]\naccess = ["read"]\n'
    )
    console = running.server.console
    console.config = dataclasses.replace(
        console.config,
        settings=running.served.settings.model_copy(update={"policy_file": policy}),
    )
    page.goto(running.login_url())
    page.wait_for_url(re.compile(r".*/plans$"))
    page.goto(f"{running.url}/memory?namespace=user/bo")
    assert page.inner_text("#memory-problem") == (
        "namespace: 'operator' may not read memory namespace 'user/bo' (no [[memory]] rule of "
        "the policy allows it)"
    )
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    allowed = httpx.get(
        f"{running.url}/api/memory", params={"namespace": "user/ana", "q": "figs"}, cookies=cookies
    )
    assert allowed.status_code == 200
    assert [item["key"] for item in allowed.json()] == ["likes"]
    refused = httpx.get(f"{running.url}/api/memory", params={"namespace": "user"}, cookies=cookies)
    assert refused.status_code == 400
    assert "may not read memory namespace 'user'" in refused.json()["error"]
