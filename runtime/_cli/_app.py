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
import dataclasses
import importlib
import importlib.metadata
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from stratagem.runtime._input import InputError, check_timeout, read_mapping

if TYPE_CHECKING:
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from stratagem.protocol import (
        ROLES,
        AgentClient,
        ChainVerdict,
        ClientConfig,
        MissingSecretError,
        ProtocolError,
        RemoteError,
        UnavailableError,
        load_or_create_key,
        verify_chain,
        verify_sealed,
    )
    from stratagem.runtime._launcher import Deployment
    from stratagem.runtime._local import LaunchError, published_endpoint
    from stratagem.runtime._security import credentials_for
    from stratagem.runtime._settings import Settings, load_settings
    from stratagem.runtime._stores import open_audit_heads, open_audit_log
    from stratagem.runtime._telemetry import setup_telemetry, shutdown_telemetry

# What the commands use beyond typer and rich's console: imported when a command runs (see
# _load_runtime), not when the module is, so `stratagem --help` and `--version` never load Ray,
# gRPC, OpenTelemetry's SDK or pydantic. A module with no names is bound under its own name.
_RUNTIME_IMPORTS: dict[str, tuple[str, ...]] = {
    "pydantic": ("ValidationError",),
    "pydantic_settings": ("SettingsError",),
    "rich.live": ("Live",),
    "rich.table": ("Table",),
    "stratagem.protocol": (
        "CAPABILITIES",
        "OPERATOR",
        "ROLES",
        "AgentCard",
        "AgentClient",
        "ChainVerdict",
        "ClientConfig",
        "ControlAction",
        "ControlRequest",
        "MissingSecretError",
        "PlanSnapshot",
        "ProtocolError",
        "RemoteError",
        "ReplayResult",
        "RevisionsResponse",
        "SubmitGoalRequest",
        "UnavailableError",
        "capability_for",
        "load_or_create_key",
        "verify_chain",
        "verify_sealed",
    ),
    "stratagem.runtime._backend": (
        "BackendError",
        "PhoenixTraces",
        "find_backend",
        "use_backend",
    ),
    "stratagem.runtime._diagram": ("DIAGRAM_FORMATS", "plan_diagram"),
    "stratagem.runtime._goal": (
        "GoalOutcome",
        "run_goal",
    ),
    "stratagem.runtime._local": (
        "LaunchError",
        "LocalCluster",
        "published_endpoint",
    ),
    "stratagem.runtime._render": (
        "Progress",
        "action_text",
        "plan_forest",
        "relation_text",
        "span_json",
        "span_tree",
    ),
    "stratagem.runtime._security": ("credentials_for",),
    "stratagem.runtime._settings": (
        "Settings",
        "load_settings",
    ),
    "stratagem.runtime._stores": ("open_audit_heads", "open_audit_log"),
    "stratagem.runtime._telemetry": (
        "SpanRecord",
        "read_spans",
        "setup_telemetry",
        "shutdown_telemetry",
    ),
}


# The agents and the planning engine: for the commands that build an agent or check a plan here
# (see _load_agents); a request to a running agent needs neither.
_AGENT_IMPORTS: dict[str, tuple[str, ...]] = {
    "stratagem.agents": ("DEMO_GOAL", "ExtensionError", "build_agent", "import_extensions"),
    "stratagem.planning": ("PlanStatus", "PlanValidationError", "validate_plan"),
}
# What joins Ray: imported only by the commands that do (see _deployment).
_RAY_IMPORTS: dict[str, tuple[str, ...]] = {
    "stratagem.runtime._directory": ("AgentInfo",),
    "stratagem.runtime._launcher": ("Deployment",),
}


_SCOPES: list[dict[str, Any]] = []
"""The globals of every command module (see ``lazy_scope``)."""
_BOUND: dict[str, Any] = {}
"""Every name bound so far, for a scope registered after its tier was loaded."""


def lazy_scope(scope: dict[str, Any]) -> None:
    """Have the tiers bind their names into ``scope`` (a command module's ``globals()``)."""
    _SCOPES.append(scope)
    scope.update(_BOUND)


def _bind(table: dict[str, tuple[str, ...]]) -> None:
    """Import each module of ``table`` and bind its names in every command module (a module with
    none: itself)."""
    for module_name, names in table.items():
        module = importlib.import_module(module_name)
        if not names:
            _BOUND[module_name.rpartition(".")[2]] = module
        for name in names:
            _BOUND[name] = getattr(module, name)
    for scope in _SCOPES:
        scope.update(_BOUND)


def _load_runtime() -> None:
    """Bind the names of ``_RUNTIME_IMPORTS`` (once): what every command needs."""
    if "load_settings" not in _BOUND:
        _bind(_RUNTIME_IMPORTS)


def _load_agents() -> None:
    """Bind the names of ``_AGENT_IMPORTS`` (once)."""
    if "build_agent" not in _BOUND:
        _bind(_AGENT_IMPORTS)


def _deployment(settings: Settings) -> Deployment:
    """A handle on the deployment ``settings`` name (this imports Ray)."""
    if "Deployment" not in _BOUND:
        _bind(_RAY_IMPORTS)
    _load_agents()  # what an embedded deployment builds
    return Deployment(settings)


__all__ = ["app", "lazy_scope", "main"]

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


console = Console()
err_console = Console(stderr=True)

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


def _fail(message: str, code: int) -> NoReturn:
    # The message is text, not markup: "stratagem[postgres]" must not become a style tag.
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _timeout_in_range(value: float | None) -> float | None:
    try:
        return check_timeout(value)
    except InputError as exc:
        _fail(str(exc), 2)


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
    except (InputError, MissingSecretError) as exc:
        _fail(str(exc), 2)
    except RemoteError as exc:
        _fail(str(exc), 1)
    except (LaunchError, ProtocolError) as exc:
        _fail(str(exc), 1)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    finally:
        if outermost:
            _guarded.clear()
            console.file = None  # type: ignore[assignment]  # rich: follow sys.stdout again


def _settings(address: str | None, state_dir: Path | None, **more: Any) -> Settings:
    try:
        profile = _PROFILE[0] if _PROFILE else None
        return load_settings(profile=profile, address=address, state_dir=state_dir, **more)
    except ValidationError as exc:
        raise InputError(_validation_line("settings", exc)) from exc
    except SettingsError as exc:  # a STRATAGEM_* value that is not the JSON it must be
        raise InputError(f"invalid settings: {exc}") from exc


def _unknown(what: str, name: str, valid: Iterable[str]) -> str:
    """One line for a name that is not one of ``valid``, listing them."""
    return f"unknown {what} {name!r}; valid: {', '.join(sorted(valid))}"


def _validation_line(what: str, exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        loc = ".".join(str(part) for part in err["loc"]) or what
        problems.append(f"{loc}: {err['msg']}")
    return f"invalid {what}: " + "; ".join(problems)


def _print_json(data: Any) -> None:
    console.file.write(json.dumps(data, indent=2, default=str) + "\n")
    console.file.flush()


def _print_json_line(data: Any) -> None:
    console.file.write(json.dumps(data, default=str) + "\n")
    console.file.flush()


def _run(coro_fn: Callable[[], Any]) -> Any:
    return asyncio.run(coro_fn())


def _read_mapping(path: Path, holds: str) -> dict[str, Any]:
    """A bounded YAML (or JSON) file's top-level mapping; ``holds`` says what it should contain."""
    return read_mapping(path, holds)


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


def _verify_audit(settings: Settings) -> tuple[ChainVerdict, str]:
    """Verify the deployment's audit chain (and its signed heads, when a sealing key exists);
    the verdict and the chain's head."""
    log = open_audit_log(settings)
    heads = open_audit_heads(settings)
    try:
        if settings.audit_key_path.exists():
            key = load_or_create_key(settings.audit_key_path)
            verdict = verify_sealed(log.records(), heads, key)
        else:
            verdict = verify_chain(log.records())
            if verdict.ok and heads.read():
                # Seals that cannot be checked vouch for nothing: a rewritten chain with
                # recomputed hashes would pass a chain-only check.
                verdict = dataclasses.replace(
                    verdict,
                    ok=False,
                    reason=(
                        f"signed heads exist in {heads.where} but the key to check them is missing "
                        f"({settings.audit_key_path}): the chain cannot be vouched for; restore "
                        "the key (or STRATAGEM_STATE_DIR's audit.key) and verify again"
                    ),
                )
        return verdict, log.head()
    finally:
        log.close()


def _with_agent(
    settings: Settings,
    role: str,
    caller: str,
    timeout: float | None,
    send: Callable[[AgentClient], Awaitable[T]],
) -> T:
    """Send one call to ``role``'s agent: on the running deployment, else on an embedded one.

    On this machine's local deployment the call goes straight to the endpoint the agent published
    (no Ray driver: see ``runtime._local``); when that agent does not answer there, or in any
    other case, the endpoint comes from Ray.
    """
    setup_telemetry("stratagem-cli", trace_file=settings.trace_file)
    published = published_endpoint(settings, role)
    if published is not None:
        config = ClientConfig(default_timeout_s=timeout or settings.request_timeout_s)

        async def direct() -> T:
            async with _client(settings, published, caller=caller, config=config) as client:
                return await send(client)

        try:
            found: T = asyncio.run(direct())
        except UnavailableError:
            logger.info("no answer at %s's published endpoint %s: asking Ray", role, published)
        else:
            shutdown_telemetry()
            return found
    with _deployment(settings).embedded() as dep:
        endpoint = dep.endpoint(role)
        config = ClientConfig(default_timeout_s=timeout or settings.request_timeout_s)

        async def call() -> T:
            async with _client(settings, endpoint, caller=caller, config=config) as client:
                return await send(client)

        answer: T = asyncio.run(call())
    shutdown_telemetry()
    return answer


def _deployed_endpoints(settings: Settings) -> dict[str, str]:
    """Each agent's endpoint on the running deployment (never an embedded one)."""
    with _running(_deployment(settings)) as deployment:
        return {info.role: info.endpoint for info in deployment.status()}


def _check_role(agent: str) -> None:
    if agent not in ROLES:
        raise InputError(_unknown("agent", agent, ROLES))


def _client(
    settings: Settings,
    endpoint: str,
    *,
    caller: str = _OPERATOR,
    config: ClientConfig | None = None,
) -> AgentClient:
    """A client of ``endpoint`` as ``caller``, with the credentials ``STRATAGEM_AUTH`` asks for."""
    return AgentClient(
        endpoint, caller=caller, credentials=credentials_for(settings, caller), config=config
    )


async def _owner_of(
    plan_id: str, endpoints: dict[str, str], settings: Settings, config: ClientConfig
) -> str:
    """The role of the agent that holds ``plan_id`` (asked through each agent's Plans RPC)."""
    for role, endpoint in endpoints.items():
        async with _client(settings, endpoint, config=config) as client:
            if any(snapshot.plan_id == plan_id for snapshot in await client.plans(plan_id)):
                return role
    raise InputError(f"no plan {plan_id!r} on any agent")


@contextmanager
def _running(deployment: Deployment) -> Iterator[Deployment]:
    """Connected to a running deployment (never an embedded one) for the block's duration."""
    deployment.connect(allow_embedded=False)
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
