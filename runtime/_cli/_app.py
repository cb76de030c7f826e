"""What every command shares: the typer apps, options, output, the error guard, settings, and the
tiers of lazily imported names.

The commands import typer and rich's console only; what they use beyond that is bound into each
command module on first use (see ``_load_runtime``), not when the module is imported, so
`stratagem --help` and `--version` never load Ray, gRPC, OpenTelemetry's SDK or pydantic. Each
command module imports the names it binds under ``TYPE_CHECKING`` (for the type checker) and calls
``lazy_scope(globals())`` (a unit test keeps both equal to the tiers below).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import logging
import os
import re
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.segment import Segment

from stratagem.runtime.config._errors import StratagemRuntimeError
from stratagem.runtime.config._lazy import load
from stratagem.runtime.operator._input import InputError, check_timeout

if TYPE_CHECKING:
    from stratagem.protocol import (
        ChainVerdict,
        DeadlineExceededError,
        MissingSecretError,
        ProtocolError,
        RemoteError,
    )
    from stratagem.runtime.config._settings import Settings
    from stratagem.runtime.host._launcher import Deployment
    from stratagem.runtime.host._ray_directory import RayDirectory
    from stratagem.runtime.operator._auditing import verify_audit
    from stratagem.runtime.operator._operator import Operator, operator_settings

# What the commands use beyond typer and rich's console: imported when a command runs (see
# _load_runtime), not when the module is, so `stratagem --help` and `--version` never load Ray,
# gRPC, OpenTelemetry's SDK or pydantic. A module with no names is bound under its own name.
_RUNTIME_IMPORTS: dict[str, tuple[str, ...]] = {
    "yaml": (),
    "pydantic": ("ValidationError",),
    "rich.live": ("Live",),
    "rich.table": ("Table",),
    "stratagem.protocol": (
        "ArchiveError",
        "AskGoalRequest",
        "ChainVerdict",
        "ControlAction",
        "FailedPreconditionError",
        "InvalidArgumentError",
        "DeadlineExceededError",
        "MissingSecretError",
        "OPERATOR",
        "PlanSnapshot",
        "ProtocolError",
        "ProtocolUsageError",
        "RemoteError",
        "RevisionsResponse",
        "StorageCorruptError",
        "SubmitGoalRequest",
        "TokenSigner",
        "UnavailableError",
        "archive_audit",
        "init_certificates",
    ),
    "stratagem.runtime.telemetry._backend": ("BackendError", "PhoenixTraces", "find_backend"),
    "stratagem.runtime.config._deployed": (
        "DeploymentRecord",
        "absolute_extensions",
        "read_record",
        "remove_record",
        "write_record",
    ),
    "stratagem.runtime.operator._auditing": ("verify_audit",),
    "stratagem.runtime.operator._artifacts": ("ArtifactsClient",),
    "stratagem.runtime.operator._diagram": ("DIAGRAM_FORMATS", "plan_diagram"),
    "stratagem.runtime.config._extensions": ("settings_roles",),
    "stratagem.runtime.operator._goal": ("GoalOutcome", "new_goal_id"),
    "stratagem.runtime.operator._ask": (
        "WIDE",
        "ask_request",
        "goal_file_asks",
        "steps_blocks",
        "steps_table",
    ),
    "stratagem.runtime.operator._history": ("PlanHistory", "PlanView"),
    "stratagem.runtime.operator._research": (
        "ResearchOutcome",
        "investigations",
        "knowledge",
        "research_plan_for",
    ),
    "stratagem.runtime.host._local": ("LaunchError", "LocalCluster", "read_published"),
    "stratagem.runtime.host._ray_directory": ("RayDirectory",),
    "stratagem.runtime.operator._operator": (
        "Operator",
        "capability_spec",
        "check_role",
        "check_status",
        "operator_settings",
    ),
    "stratagem.runtime.operator._show": (
        "approve_commands",
        "event_line",
        "history_table",
        "plan_details",
        "traces_table",
    ),
    "stratagem.runtime.operator._render": (
        "Progress",
        "action_text",
        "plan_forest",
        "relation_text",
        "span_json",
        "span_tree",
    ),
    "stratagem.runtime.config._security": (
        "check_operator_identity",
        "credentials_for",
        "issue_identity_key",
        "operator_key",
    ),
    "stratagem.runtime.config._settings": ("Settings",),
    "stratagem.runtime.config._stores": ("open_audit_log",),
    "stratagem.runtime.telemetry._telemetry": (
        "SpanRecord",
        "read_spans",
        "setup_telemetry",
        "shutdown_telemetry",
    ),
}


# The agents: for the commands that start agents here (see _load_agents); a request to a running
# agent needs none (the operator API imports the agents itself where it checks a plan).
_AGENT_IMPORTS: dict[str, tuple[str, ...]] = {
    "stratagem.agents": ("DEMO_GOAL",),
    "stratagem.runtime.operator._memory": ("SyncMemoryClient",),
    "stratagem.agents.research": (
        "Investigation",
        "KbEntry",
        "kb_export",
        "kb_markdown",
        "postmortem_markdown",
    ),
}
# What joins Ray: imported only by the commands that do (see _deployment, _load_ray).
_RAY_IMPORTS: dict[str, tuple[str, ...]] = {
    "stratagem.runtime.host._directory": ("AgentInfo",),
    "stratagem.runtime.host._launcher": ("AgentStartError", "Deployment"),
    "stratagem.runtime.host._rotation": ("rotate_secret",),
}
# The web console (Starlette, uvicorn): imported only by `stratagem console` (see _load_console).
_CONSOLE_IMPORTS: dict[str, tuple[str, ...]] = {
    "stratagem.runtime._console": ("ConsoleConfig", "ConsoleServer", "check_host"),
    "stratagem.runtime._console._assets": ("Assets",),
    "stratagem.runtime._console._serve": ("TlsFiles",),
}
TIERS: tuple[dict[str, tuple[str, ...]], ...] = (
    _RUNTIME_IMPORTS,
    _AGENT_IMPORTS,
    _RAY_IMPORTS,
    _CONSOLE_IMPORTS,
)
"""Every tier: the CLI's one table of what it imports lazily (a command module imports nothing
else inside a function: a unit test checks it)."""


_SCOPES: list[dict[str, Any]] = []
"""The globals of every command module (see ``lazy_scope``)."""
_BOUND: dict[str, Any] = {}
"""Every name bound so far, for a scope registered after its tier was loaded."""
_LOADED: set[int] = set()
"""The tiers bound (by ``id``)."""


def lazy_scope(scope: dict[str, Any]) -> None:
    """Have the tiers bind their names into ``scope`` (a command module's ``globals()``)."""
    _SCOPES.append(scope)
    scope.update(_BOUND)


def _bind(table: dict[str, tuple[str, ...]]) -> None:
    """Import each module of ``table`` and bind its names in every command module (a module with
    none: itself), once."""
    if id(table) in _LOADED:
        return
    for module_name, names in table.items():
        if not names:
            _BOUND[module_name.rpartition(".")[2]] = load(module_name)
        for name in names:
            _BOUND[name] = load(f"{module_name}:{name}")
    for scope in _SCOPES:
        scope.update(_BOUND)
    _LOADED.add(id(table))


def _load_runtime() -> None:
    """Bind the names of ``_RUNTIME_IMPORTS`` (once): what every command needs."""
    _bind(_RUNTIME_IMPORTS)


def _load_agents() -> None:
    """Bind the names of ``_AGENT_IMPORTS`` (once)."""
    _bind(_AGENT_IMPORTS)


def _load_ray() -> None:
    """Bind the names of ``_RAY_IMPORTS`` (once; this imports Ray)."""
    _bind(_RAY_IMPORTS)


def _load_console() -> None:
    """Bind the names of ``_CONSOLE_IMPORTS`` (once)."""
    _bind(_CONSOLE_IMPORTS)


def _deployment(settings: Settings) -> Deployment:
    """A handle on the deployment ``settings`` name (this imports Ray)."""
    _load_ray()
    _load_agents()  # what an embedded deployment builds
    return Deployment(settings)


__all__ = ["TIERS", "app", "lazy_scope", "main"]

logger = logging.getLogger(__name__)

_CONTEXT: dict[str, Any] = {"help_option_names": ["-h", "--help"]}
app = typer.Typer(
    name="stratagem",
    help="Stratagem: role agents on Ray, typed plans, a validated gRPC cross-agent protocol.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings=_CONTEXT,
)
audit_app = typer.Typer(
    help="The hash-chained audit log.", no_args_is_help=True, context_settings=_CONTEXT
)
app.add_typer(audit_app, name="audit")
plans_app = typer.Typer(
    help="Plans written by you, and plans the agents made.",
    no_args_is_help=True,
    context_settings=_CONTEXT,
)
app.add_typer(plans_app, name="plans")
certs_app = typer.Typer(
    help="Certificates for mutual TLS (STRATAGEM_AUTH=mtls).",
    no_args_is_help=True,
    context_settings=_CONTEXT,
)
app.add_typer(certs_app, name="certs")
world_app = typer.Typer(
    help="The perception agent's worlds: each goal's facts, by name.",
    no_args_is_help=True,
    context_settings=_CONTEXT,
)
app.add_typer(world_app, name="world")
secret_app = typer.Typer(
    help="The cluster secret that signs tokens (STRATAGEM_AUTH=token).",
    no_args_is_help=True,
    context_settings=_CONTEXT,
)
app.add_typer(secret_app, name="secret")


def _version() -> str:
    try:
        return importlib.metadata.version("stratagem")
    except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
        return "unknown"


_PROFILE: list[str] = []
"""The config file's profile ``--profile`` chose (empty: STRATAGEM_PROFILE, else none)."""


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"stratagem {_version()}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            "-V",
            help="Print Stratagem's version and exit.",
            callback=_print_version,
            is_eager=True,
        ),
    ] = False,
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile",
            help="A profile of the config file (STRATAGEM_CONFIG, default "
            "~/.config/stratagem/config.toml); also STRATAGEM_PROFILE.",
        ),
    ] = None,
) -> None:
    """Stratagem: role agents on Ray, typed plans, a validated gRPC cross-agent protocol."""
    _PROFILE.clear()
    if profile:
        _PROFILE.append(profile)


# C0 controls but tab and newline, DEL and C1: what a terminal acts on instead of showing.
_TERMINAL_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def terminal_safe(text: str) -> str:
    """``text`` with each terminal control character written out (``ESC`` as ``\\x1b``)."""
    return _TERMINAL_CONTROL.sub(lambda found: f"\\x{ord(found.group()):02x}", text)


class _SafeConsole(Console):
    """A console that never lets stored data drive the terminal: every text it renders (a
    goal, a step's message, a world's entity, wherever it sits in a table or a tree) has its
    control characters written out; rich's own styling is control segments, left as they are."""

    def render(self, renderable: Any, options: Any = None) -> Iterator[Segment]:
        for segment in super().render(renderable, options):
            if segment.control is None and _TERMINAL_CONTROL.search(segment.text):
                yield Segment(terminal_safe(segment.text), segment.style)
            else:
                yield segment


console: Console = _SafeConsole()
err_console: Console = _SafeConsole(stderr=True)

T = TypeVar("T")
_OPERATOR = "operator"
"""``protocol.OPERATOR``, the CLI's identity, as a default before the protocol is imported (a test
checks that the two agree)."""

AddressOpt = Annotated[
    str | None,
    typer.Option("--address", help="Ray cluster address (auto, HOST:PORT, ray://HOST:10001)."),
]
StateDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        help="State directory (else STRATAGEM_STATE_DIR, the profile's, the nearest .stratagem "
        "folder here or above, ~/.local/state/stratagem).",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
FullOpt = Annotated[
    bool,
    typer.Option(
        "--full",
        help="Step inputs and outputs whole (as far as the agents' message limit allows; a cut "
        "value says so), not cut to a preview.",
    ),
]


def _fail(message: str, code: int) -> NoReturn:
    # The message is text, not markup: "stratagem[postgres]" must not become a style tag.
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _fail_traced(
    exc: RemoteError,
    *,
    as_json: bool,
    plan_id: str,
    failure: str = "",
    failed_at: str = "",
    cause: str = "",
    status: str = "failed",
) -> NoReturn:
    """Fail with ``exc`` (exit 1), naming where it went wrong, its trace and the plan on standard
    error (and with ``--json``, the same on standard output, with the plan's ``status`` when it
    is known).

    With the plan's history read (``cause``, ``failed_at``: ``PlanHistory``'s), the failure is
    said once: the deepest failed step, its class and why, then where; the error's own text, which
    carries every level's copy of the same reason, is left out.
    """
    if as_json:
        _print_json(
            {
                "plan_id": plan_id,
                "status": status,
                "trace_id": exc.trace_id,
                "error": str(exc),
                "failure": failure,
            }
        )
    line = cause or str(exc)
    hints = [f"where: {failed_at}"] if cause and failed_at else []
    if exc.trace_id:
        hints.append(f"trace {exc.trace_id} (stratagem trace {exc.trace_id})")
    if plan_id:
        hints.append(f"stratagem plans show {plan_id}")
    _fail(line + "".join(f"\n  {hint}" for hint in hints), 1)


def _timeout_in_range(value: float | None) -> float | None:
    try:
        return check_timeout(value)
    except InputError as exc:
        _fail(str(exc), 2)


def _planner_choice(value: str | None) -> str | None:
    if value is not None and value not in ("deterministic", "model"):
        raise typer.BadParameter(f"{value!r} is not 'deterministic' or 'model'")
    return value


PlannerOpt = Annotated[
    str | None,
    typer.Option(
        "--planner",
        help="How the agents plan: deterministic or model (else STRATAGEM_PLANNER; a model "
        "planner needs STRATAGEM_MODEL_URL or 'make model-server').",
        callback=_planner_choice,
    ),
]
EmbeddedOpt = Annotated[
    bool,
    typer.Option(
        "--embedded",
        help="Run on agents of this command's own, on an embedded Ray started and removed here "
        "(refused where a deployment runs: it is used as it is, never changed).",
    ),
]
TimeoutOpt = Annotated[
    float | None,
    typer.Option("--timeout", help="Deadline in seconds.", callback=_timeout_in_range),
]


_guarded: list[bool] = []  # non-empty while an `_errors` block runs


@contextmanager
def _errors() -> Iterator[None]:
    """Turn every expected failure into one line and an exit code.

    Inside, standard output carries only what the command prints (tables, ``--json``): Ray
    ``print()``s cluster events (a node marked dead, ...) to ``sys.stdout``, so other writers go to
    standard error while the command runs.
    """
    _load_runtime()
    outermost = not _guarded
    if outermost:
        console.file = sys.stdout
        _guarded.append(True)
    try:
        with contextlib.redirect_stdout(sys.stderr) if outermost else contextlib.nullcontext():
            yield
    except StratagemRuntimeError as exc:  # the runtime's one root: its class says the code
        _fail(str(exc), exc.exit_code)
    except MissingSecretError as exc:
        _fail(str(exc), 2)
    except ProtocolError as exc:  # the wire's root (a RemoteError: the agent refused or failed)
        _fail(str(exc), 1)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    finally:
        if outermost:
            _guarded.clear()
            console.file = None  # type: ignore[assignment]  # rich: follow sys.stdout again


def _settings(address: str | None, state_dir: Path | None, **more: Any) -> Settings:
    profile = _PROFILE[0] if _PROFILE else None
    return operator_settings(state_dir, address=address, profile=profile, **more)


def _print_json(data: Any) -> None:
    console.file.write(json.dumps(data, indent=2, default=str) + "\n")
    console.file.flush()


def _print_json_line(data: Any) -> None:
    console.file.write(json.dumps(data, default=str) + "\n")
    console.file.flush()


def _audit_head(settings: Settings) -> dict[str, Any]:
    if settings.store_url is None and not settings.audit_path.exists():
        return {"records": 0, "head": "", "ok": True, "signed_heads": 0}
    verdict, head = _verify_audit(settings)
    return {
        "records": verdict.count,
        "head": head,
        "ok": verdict.ok,
        "signed_heads": verdict.sealed,
    }


def _verify_audit(settings: Settings, archive: Path | None = None) -> tuple[ChainVerdict, str]:
    """Verify the deployment's audit chain, its archived segments first (``archive``, default
    ``STATE_DIR/audit-archive``), and its signed heads when a sealing key exists; the verdict and
    the chain's head (``runtime.operator._auditing.verify_audit``, which the console's audit page
    reads)."""
    check = verify_audit(settings, archive)
    return check.verdict, check.head


def _operate(
    settings: Settings,
    use: Callable[[Operator], Awaitable[T]],
    *,
    timeout: float | None = None,
    caller: str = _OPERATOR,
    embedded: bool | None = None,
    endpoints: dict[str, str] | None = None,
    bounded: bool = True,
) -> T:
    """Run ``use`` with an ``Operator`` of the deployment, closed after, all within ``timeout``
    (finding the agents included).

    Args:
        settings: The deployment's settings.
        use: What to do with it.
        timeout: The command's deadline (``request_timeout_s`` when ``None``).
        caller: The identity the calls are made as.
        embedded: ``True``: agents of the command's own on an embedded Ray (``--embedded``; see
            ``RayDirectory``); ``False``: a running deployment, and the error when there is none
            names ``--embedded``; ``None``: a running deployment (the command has no such flag).
        endpoints: The agents' endpoints when known (no published files, no Ray).
        bounded: Whether ``timeout`` bounds the whole of ``use`` (not for ``watch``, which
            follows a plan until it ends).

    Raises:
        DeadlineExceededError: ``timeout`` passed (the message says so, and what to raise).
    """
    limit = timeout or settings.request_timeout_s

    async def run() -> T:
        async with Operator(
            settings=settings,
            caller=caller,
            timeout_s=timeout,
            endpoints=endpoints,
            directory=RayDirectory(
                settings,
                embedded=bool(embedded),
                embedded_hint=embedded is False,
                timeout_s=min(10.0, limit),
            ),
        ) as operator:
            try:
                async with asyncio.timeout(limit if bounded else None):
                    return await use(operator)
            except TimeoutError:
                raise DeadlineExceededError(
                    f"the command did not finish within {limit:g} s (finding the agents "
                    "included): raise --timeout (or STRATAGEM_REQUEST_TIMEOUT_S)"
                ) from None

    return asyncio.run(run())


@contextmanager
def _running(deployment: Deployment, *, embedded_hint: bool = False) -> Iterator[Deployment]:
    """Connected to a running deployment (never an embedded one) for the block's duration
    (``embedded_hint``: the error when there is none names ``--embedded``)."""
    deployment.connect(allow_embedded=False, embedded_hint=embedded_hint)
    try:
        yield deployment
    finally:
        deployment.disconnect()


def main() -> None:
    """Console-script entry point."""
    # The CLI reports what matters itself, in one line; library logs are for STRATAGEM_LOG_LEVEL.
    logging.basicConfig(level=os.environ.get("STRATAGEM_LOG_LEVEL", "ERROR").upper())
    app()


lazy_scope(globals())
