"""``stratagem logs AGENT``: the end of the log files an agent published in the state directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stratagem.runtime._cli import _app as cli
from stratagem.runtime._cli._deploy import _tail
from stratagem.runtime.host._local import publish_endpoint, read_published

runner = CliRunner()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STRATAGEM_EXTENSIONS", raising=False)
    monkeypatch.setenv("STRATAGEM_CONFIG", "/nonexistent/config.toml")


def _published(tmp_path: Path, pid: int) -> Path:
    log = tmp_path / "logs" / f"worker-abc-{pid}.err"
    log.parent.mkdir()
    log.write_text("".join(f"line {i}\n" for i in range(1, 201)))
    publish_endpoint(tmp_path, "perception", "127.0.0.1:5", pid, [str(log)])
    return log


def test_the_tail_is_the_last_lines_however_long_the_file(tmp_path: Path) -> None:
    path = tmp_path / "big.log"
    path.write_bytes(b"".join(b"x" * 1000 + b" %d\n" % i for i in range(1000)))
    text, size = _tail(path, 3)
    assert text.decode().splitlines() == [f"{'x' * 1000} {i}" for i in (997, 998, 999)]
    assert size == path.stat().st_size
    assert _tail(path, 0)[0] == b""


def test_an_agent_log_ends_are_printed(tmp_path: Path) -> None:
    log = _published(tmp_path, os.getpid())
    assert read_published(tmp_path, "perception") is not None
    result = runner.invoke(cli.app, ["logs", "perception", "-n", "3", "--state-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["line 198", "line 199", "line 200"]
    assert log.exists()


def test_a_dead_agent_log_is_printed_with_a_warning(tmp_path: Path) -> None:
    _published(tmp_path, 2**22 + 12345)  # no such process
    result = runner.invoke(cli.app, ["logs", "perception", "-n", "1", "--state-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["line 200"]
    assert "has ended" in result.stderr


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["logs", "narrator"], 2, "unknown agent 'narrator'"),
        (["logs", "tactical"], 1, "agent tactical has not said where it logs"),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, args: list[str], code: int, message: str) -> None:
    _published(tmp_path, os.getpid())
    result = runner.invoke(cli.app, [*args, "--state-dir", str(tmp_path)])
    assert result.exit_code == code
    assert len(result.stderr.strip().splitlines()) == 1
    assert message in result.stderr
