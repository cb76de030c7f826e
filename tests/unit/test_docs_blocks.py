"""Every code block of the documentation pages runs, parses, or says why not (the rules:
``tests/docs_blocks.py``); the shell blocks and those needing a deployment run in
``tests/e2e/test_docs.py``.

Here: the markers, the data blocks (JSON, TOML, YAML plans, goals and fragments of steps) and the
Python blocks that need nothing, and the token recipe of ``docs/security.md``, executed as written
against the project's own signer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import jwt
import pytest
import yaml

from stratagem.planning import Plan
from stratagem.protocol import (
    AskGoalRequest,
    ClusterSecret,
    IdentityKey,
    SubmitGoalRequest,
    TokenSigner,
    UnauthenticatedError,
)
from tests.docs_blocks import DATA, NOT_CODE, PROGRAMS, REPO, Block, blocks, pages, token_recipe

ALL = [block for page in pages() for block in blocks(page)]


def test_every_block_has_a_known_language_and_every_marker_says_why() -> None:
    assert len(ALL) > 40  # the pages were read
    problems = []
    for block in ALL:
        if block.language not in NOT_CODE | DATA | PROGRAMS:
            problems.append(f"{block.where}: the runner does not know {block.language!r}")
        marked = block.not_run or block.deployed or block.run_by
        if marked and block.language in NOT_CODE:
            problems.append(f"{block.where}: a marker on a block that is not code")
        if block.not_run and len(block.not_run) < 10:
            problems.append(f"{block.where}: not-run says too little: {block.not_run!r}")
        if block.deployed and block.language != "python":
            problems.append(f"{block.where}: only Python runs on a page's deployment")
        if block.run_by:
            named = REPO / block.run_by
            if not block.run_by.startswith("tests/") or not named.is_file():
                problems.append(f"{block.where}: run by {block.run_by!r}, which is no test file")
            elif block.page.name not in named.read_text(encoding="utf-8"):
                problems.append(f"{block.where}: {block.run_by} does not name {block.page.name}")
    assert not problems, "\n".join(problems)


def _data(block: Block) -> None:
    if block.language == "json":
        json.loads(block.text)
    elif block.language == "toml":
        tomllib.loads(block.text)
    else:
        value = yaml.safe_load(block.text)
        if isinstance(value, dict) and "passage" in value:
            SubmitGoalRequest.model_validate(value)
            return
        if isinstance(value, dict) and "goal" in value and "steps" not in value:
            AskGoalRequest.model_validate(value)  # a goal in plain words (no passage)
            return
        # A plan, or a fragment of one (its steps, or fields with its steps): a plan's fields.
        fields = {"steps": value} if isinstance(value, list) else value
        assert isinstance(fields, dict), f"{block.where}: YAML that is no plan, goal or steps"
        Plan.model_validate({"id": "doc", "owner": "strategic", "goal": "doc", **fields})


@pytest.mark.parametrize(
    "block", [b for b in ALL if b.runs and b.language in DATA], ids=lambda b: b.where
)
def test_a_data_block_parses_and_a_plan_or_goal_validates(block: Block) -> None:
    _data(block)


def _python_pages() -> list[Path]:
    return sorted(
        {b.page for b in ALL if b.runs and b.language == "python" and not b.deployed},
        key=str,
    )


@pytest.mark.parametrize("page", _python_pages(), ids=lambda p: p.name)
def test_the_python_blocks_that_need_no_deployment_run(page: Path, tmp_path: Path) -> None:
    """A page's Python blocks that need nothing run in order in one interpreter."""
    code = "\n".join(
        b.text for b in blocks(page) if b.runs and b.language == "python" and not b.deployed
    )
    ran = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("STRATAGEM_")},
        check=False,
    )
    assert ran.returncode == 0, ran.stderr[-2000:]


def test_the_token_recipe_of_security_md_makes_tokens_the_agents_accept(tmp_path: Path) -> None:
    secret = ClusterSecret.generate()
    secret.save(tmp_path / "cluster.secret")
    operator = IdentityKey.derive(secret, "operator")
    operator.save(tmp_path / "operator.key")
    page: dict[str, Any] = {}
    exec(compile(token_recipe(), "docs/security.md", "exec"), page)

    # The page's derivation from the cluster secret is the deployment's.
    key_id, key = page["identity_key"](tmp_path / "cluster.secret", "operator")
    assert (key_id, key) == (operator.key_id, operator.reveal())
    # Its token verifies where an agent verifies one (with the cluster secret).
    token = page["operator_token"](tmp_path / "operator.key")
    assert TokenSigner(secret).verify(token)[0] == "operator"

    # The recipe the page gave before (one key for all, ...v1) is refused, as the page says.
    retired = (
        page["hmac"]
        .new(secret.reveal(), b"stratagem.jwt.hs256.v1", page["hashlib"].sha256)
        .digest()
    )
    now = int(time.time())
    old = jwt.encode(
        {"sub": "operator", "aud": "stratagem", "iat": now, "exp": now + 300},
        retired,
        algorithm="HS256",
        headers={"kid": secret.key_id},
    )
    with pytest.raises(UnauthenticatedError, match="its signature does not verify"):
        TokenSigner(secret).verify(old)
