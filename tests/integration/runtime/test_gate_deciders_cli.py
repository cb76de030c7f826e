"""A named gate decider uses the CLI with a key of their own (docs/gates.md, "Who may decide"):
``stratagem secret issue ana --out ana.key`` on the deployment's machine, then on ana's
``STRATAGEM_OPERATOR_KEY_FILE=ana.key stratagem approve PLAN GATE --as ana``. The key signs as ana
and as no one else; an agent's identity gets no key.
"""

from __future__ import annotations

import json
import stat
import threading
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from stratagem.protocol import ClusterSecret, IdentityKey, Policy, RemoteError
from stratagem.runtime import SyncOperator
from stratagem.runtime._cli import app
from tests.integration.runtime._served import Served, gated_plan, served_in_a_thread

runner = CliRunner()

ANA = """
[[allow]]                     # the CLI asks every agent's Plans which one holds the plan
caller = "ana"
target = "*"
capabilities = ["Plans"]

[[allow]]
caller = "ana"
target = "strategic"
capabilities = ["Control.approve", "Control.reject", "Watch"]
"""


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    shipped = resources.files("stratagem.protocol").joinpath("default_policy.toml").read_text()
    with served_in_a_thread(tmp_path / "state", policy=Policy.from_toml(shipped + ANA)) as running:
        yield running


def stratagem(served: Served, *args: str, key: Path | None = None) -> Result:
    env = {
        "STRATAGEM_STATE_DIR": str(served.settings.state_dir),
        "STRATAGEM_SECRET_FILE": str(served.settings.secret_path),
        "STRATAGEM_OPERATOR_KEY_FILE": str(key) if key else None,
        "STRATAGEM_AUTH": "token",
        "STRATAGEM_ADDRESS": None,
        "RAY_ADDRESS": None,
        "COLUMNS": "160",
    }
    return runner.invoke(app, list(args), env=env)


@pytest.mark.parametrize("issued_by", ["cli", "python"])
def test_a_named_decider_approves_from_the_cli_with_a_key_of_their_own(
    served: Served, tmp_path: Path, issued_by: str
) -> None:
    key = tmp_path / "ana.key"
    if issued_by == "cli":
        issued = stratagem(served, "secret", "issue", "ana", "--out", str(key))
        assert issued.exit_code == 0, issued.output
    else:  # the same key, made with the protocol's API (what 'secret issue' writes)
        IdentityKey.derive(ClusterSecret.load(served.settings.secret_path), "ana").save(key)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert json.loads(key.read_text())["identity"] == "ana"

    ended: list[str] = []

    def run_gated() -> None:
        with SyncOperator(settings=served.settings, directory=served.directory) as op:
            try:
                ended.append(op.run_plan(gated_plan("held")).status)
            except RemoteError as exc:
                ended.append(exc.code.name)

    running = threading.Thread(target=run_gated)
    running.start()
    try:
        with SyncOperator(settings=served.settings, directory=served.directory) as op:
            for _ in range(400):
                if any(s.plan_id == "held" and s.status == "blocked" for s in op.plans()):
                    break
                time.sleep(0.025)
            else:
                pytest.fail("the plan never blocked at its gate")
        # ana's key signs as ana only: another identity is one line and exit 2, naming both.
        other = stratagem(
            served, "approve", "held", "ok", "--as", "bo", "--rationale", "x", key=key
        )
        assert other.exit_code == 2, other.output
        assert f"the key in {key}" in other.stderr
        assert "signs only as 'ana', not as 'bo'" in other.stderr
        assert len(other.stderr.strip().splitlines()) == 1
        # Without --as the commands act as the operator, which ana's key is not.
        plain = stratagem(served, "approve", "held", "ok", "--rationale", "x", key=key)
        assert plain.exit_code == 2, plain.output
        assert "not as 'operator'; call with --as ana" in plain.stderr
        approved = stratagem(
            served, "approve", "held", "ok", "--as", "ana", "--rationale", "fine", "--json", key=key
        )
        assert approved.exit_code == 0, approved.output
        gate = json.loads(approved.stdout)["gates"][0]
        assert (gate["decision"], gate["approver"]) == ("approved", "ana")
    finally:
        running.join(60)
    assert ended == ["succeeded"]
    # The token command speaks as the key's identity too.
    token = stratagem(served, "token", "--identity", "ana", key=key)
    assert token.exit_code == 0, token.output


def test_no_key_is_issued_for_an_agent_or_over_an_existing_file(
    served: Served, tmp_path: Path
) -> None:
    agent = stratagem(served, "secret", "issue", "tactical", "--out", str(tmp_path / "t.key"))
    assert agent.exit_code == 2
    assert "one of the deployment's agents" in agent.stderr
    assert not (tmp_path / "t.key").exists()
    taken = tmp_path / "taken.key"
    taken.write_text("mine")
    again = stratagem(served, "secret", "issue", "ana", "--out", str(taken))
    assert again.exit_code == 2
    assert "exists" in again.stderr
    assert taken.read_text() == "mine"
    bad = stratagem(served, "secret", "issue", "Not An Id", "--out", str(tmp_path / "x.key"))
    assert bad.exit_code == 2
    assert "is not an identity" in bad.stderr
