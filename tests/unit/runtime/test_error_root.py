"""One error root for the runtime: every error class the runtime defines is a
``StratagemRuntimeError`` (or belongs to the wire's or pydantic-settings' tree, as documented in
``config/_errors.py``), and the CLI turns any of them into one line and the class's exit code
without a list of classes to keep (a new one, planted here, needs no change to the CLI)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import ClassVar

import pytest
import typer
from pydantic_settings import SettingsError

from stratagem.protocol import ProtocolError
from stratagem.runtime._cli._app import _errors
from stratagem.runtime.config._errors import InputError, LaunchError, StratagemRuntimeError
from stratagem.runtime.host._mcp import McpSetupError
from stratagem.runtime.host._notify import WebhookRefusedError
from stratagem.runtime.telemetry._backend import BackendError

RUNTIME = Path(__file__).resolve().parents[3] / "runtime"
# Trees of others the runtime's errors may extend instead: the wire's (identity refused) and
# pydantic-settings' (a state directory refused while loading settings).
OTHER_ROOTS = (ProtocolError, SettingsError)


def _error_classes() -> list[tuple[str, str]]:
    found = []
    for path in sorted(RUNTIME.rglob("*.py")):
        parts = list(path.relative_to(RUNTIME).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        module = ".".join(["stratagem.runtime", *parts])
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.ClassDef) and node.name.endswith("Error") and node.bases:
                found.append((module, node.name))
    return found


def test_the_runtime_defines_error_classes() -> None:
    assert len(_error_classes()) >= 6


@pytest.mark.parametrize(("module", "name"), _error_classes())
def test_every_runtime_error_is_under_the_root(module: str, name: str) -> None:
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, (StratagemRuntimeError, *OTHER_ROOTS)), (
        f"{module}.{name} is not a StratagemRuntimeError: the CLI would show its stack trace"
    )


class PlantedError(StratagemRuntimeError):
    """A runtime error the CLI was never told of."""

    exit_code: ClassVar[int] = 2


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (InputError("--timeout: must be positive"), 2),
        (LaunchError("no deployment runs"), 1),
        (BackendError("the backend answered 500"), 1),
        (WebhookRefusedError("the webhook URL is refused"), 1),
        (McpSetupError("the MCP server did not start"), 1),
        (PlantedError("a planted failure"), 2),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else str(value),
)
def test_the_cli_turns_any_runtime_error_into_one_line_and_its_exit_code(
    error: Exception, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(typer.Exit) as exited, _errors():
        raise error
    assert exited.value.exit_code == code
    err = capsys.readouterr().err
    assert err.strip() == f"error: {error}"
    assert "Traceback" not in err
