"""The ``stratagem`` command line.

Every command turns bad input and runtime failures into one line on standard error and a non-zero
exit code (2: the input was wrong; 1: the runtime refused or failed); no stack trace reaches the
user. ``--json`` prints machine-readable output on standard output.
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
import sqlite3
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from stratagem.runtime._input import (
    InputError,
    check_encoded_size,
    check_plan_steps,
    check_timeout,
    parse_json_object,
    read_mapping,
)

if TYPE_CHECKING:
    from pydantic import ValidationError
    from pydantic_settings import SettingsError
    from rich.live import Live
    from rich.table import Table

    from stratagem.agents import DEMO_GOAL, ExtensionError, build_agent, import_extensions
    from stratagem.planning import PlanStatus, PlanValidationError, validate_plan
    from stratagem.protocol import (
        CAPABILITIES,
        OPERATOR,
        ROLES,
        AgentCard,
        AgentClient,
        ArchiveError,
        ChainVerdict,
        ClientConfig,
        ControlAction,
        ControlRequest,
        MissingSecretError,
        PlanSnapshot,
        ProtocolError,
        RemoteError,
        ReplayResult,
        RevisionsResponse,
        SubmitGoalRequest,
        UnavailableError,
        all_records,
        archive_audit,
        capability_for,
        load_or_create_key,
        verify_chain,
        verify_sealed,
    )
    from stratagem.runtime._backend import BackendError, PhoenixTraces, find_backend, use_backend
    from stratagem.runtime._diagram import DIAGRAM_FORMATS, plan_diagram
    from stratagem.runtime._directory import AgentInfo
    from stratagem.runtime._goal import GoalOutcome, run_goal
    from stratagem.runtime._launcher import Deployment
    from stratagem.runtime._local import LaunchError, LocalCluster, published_endpoint
    from stratagem.runtime._render import (
        Progress,
        action_text,
        plan_forest,
        relation_text,
        span_json,
        span_tree,
    )
    from stratagem.runtime._security import credentials_for
    from stratagem.runtime._settings import Settings, load_settings
    from stratagem.runtime._stores import open_audit_heads, open_audit_log
    from stratagem.runtime._telemetry import (
        SpanRecord,
        read_spans,
        setup_telemetry,
        shutdown_telemetry,
    )

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
        "ArchiveError",
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
        "all_records",
        "archive_audit",
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


def _bind(table: dict[str, tuple[str, ...]]) -> None:
    """Import each module of ``table`` and bind its names here (a module with none: itself)."""
    scope = globals()
    for module_name, names in table.items():
        module = importlib.import_module(module_name)
        if not names:
            scope[module_name.rpartition(".")[2]] = module
        for name in names:
            scope[name] = getattr(module, name)


def _load_runtime() -> None:
    """Bind the names of ``_RUNTIME_IMPORTS`` (once): what every command needs."""
    if "load_settings" not in globals():
        _bind(_RUNTIME_IMPORTS)


def _load_agents() -> None:
    """Bind the names of ``_AGENT_IMPORTS`` (once)."""
    if "build_agent" not in globals():
        _bind(_AGENT_IMPORTS)


def _deployment(settings: Settings) -> Deployment:
    """A handle on the deployment ``settings`` name (this imports Ray)."""
    if "Deployment" not in globals():
        _bind(_RAY_IMPORTS)
    _load_agents()  # what an embedded deployment builds
    return Deployment(settings)


__all__ = ["app", "main"]

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


# -- goals ---------------------------------------------------------------------------------------


def _read_mapping(path: Path, holds: str) -> dict[str, Any]:
    """A bounded YAML (or JSON) file's top-level mapping; ``holds`` says what it should contain."""
    return read_mapping(path, holds)


def _load_goal(path: Path) -> SubmitGoalRequest:
    raw = _read_mapping(path, "goal, passage and beats")
    try:
        return SubmitGoalRequest.model_validate(raw)
    except ValidationError as exc:
        raise InputError(_validation_line(f"goal file {path}", exc)) from exc


def _execute_goal(
    request: SubmitGoalRequest, settings: Settings, *, as_json: bool, timeout: float | None
) -> None:
    trace_file = settings.trace_file or settings.state_dir / "spans.jsonl"
    settings = settings.model_copy(update={"trace_file": trace_file})
    os.environ.setdefault("STRATAGEM_TRACE_FILE", str(trace_file))
    # `make otel-backend`'s Phoenix, when it runs and no OTLP endpoint is configured.
    backend = use_backend(settings.state_dir)
    if backend is not None and not as_json:
        err_console.print(f"[dim]exporting spans to {backend.kind} at {backend.url}[/]")
    provider = setup_telemetry("stratagem-cli", trace_file=trace_file)
    deployment = _deployment(settings)
    progress = Progress()
    with _errors():
        if not as_json:
            err_console.print("[dim]starting agents…[/]")
        with deployment.embedded() as dep:
            endpoints = {info.role: info.endpoint for info in dep.status()}
            if not as_json:
                err_console.print(
                    f"[dim]{dep.mode} Ray · agents: "
                    + ", ".join(f"{r}@{e}" for r, e in endpoints.items())
                    + "[/]"
                )
            deadline = timeout or settings.request_timeout_s
            operator = credentials_for(settings, OPERATOR)
            if as_json or not console.is_terminal:
                outcome = _run(
                    lambda: run_goal(endpoints, request, timeout_s=deadline, credentials=operator)
                )
            else:
                with Live(progress.render(), console=console, refresh_per_second=8) as live:

                    def on_event(event: Any) -> None:
                        progress.add(event)
                        live.update(progress.render())

                    outcome = _run(
                        lambda: run_goal(
                            endpoints,
                            request,
                            timeout_s=deadline,
                            on_event=on_event,
                            credentials=operator,
                        )
                    )
            dep.flush_telemetry()
        provider.force_flush()
        shutdown_telemetry()
        head = _audit_head(settings)
        spans = read_spans(trace_file, outcome.trace_id)
        if as_json:
            _print_json(
                {
                    "plan_id": outcome.plan_id,
                    "trace_id": outcome.trace_id,
                    "response": outcome.response.model_dump(mode="json"),
                    "plans": [json.loads(p.model_dump_json()) for p in outcome.plans],
                    "spans": len(spans),
                    "services": sorted({s.service for s in spans}),
                    "audit": head,
                }
            )
            return
        _print_outcome(outcome, spans, head)


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
    the chain's head."""
    log = open_audit_log(settings)
    heads = open_audit_heads(settings)
    records = all_records(log, archive or settings.audit_archive_dir)
    try:
        if settings.audit_key_path.exists():
            key = load_or_create_key(settings.audit_key_path)
            verdict = verify_sealed(records, heads, key)
        else:
            verdict = verify_chain(records)
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


def _print_outcome(outcome: GoalOutcome, spans: list[Any], head: dict[str, Any]) -> None:
    resp = outcome.response
    console.rule(f"[bold]goal {outcome.plan_id}: {resp.status}")
    console.print(plan_forest(outcome.plans, outcome.plan_id))
    beats = Table(title="Arc", title_justify="left")
    beats.add_column("beat")
    beats.add_column("title")
    beats.add_column("reached when")
    for beat in resp.beats:
        beats.add_row(beat.id, beat.title, ", ".join(relation_text(g) for g in beat.goals))
    console.print(beats)
    actions = Table(title="Action sequence", title_justify="left")
    actions.add_column("#", justify="right")
    actions.add_column("action")
    for i, action in enumerate(resp.actions, 1):
        actions.add_row(str(i), action_text(action))
    console.print(actions)
    changes = Table(title="World-state changes", title_justify="left")
    changes.add_column("change")
    changes.add_column("fact")
    for rel in resp.added:
        changes.add_row("[green]+ added", relation_text(rel))
    for rel in resp.removed:
        changes.add_row("[red]- removed", relation_text(rel))
    console.print(changes)
    services = sorted({s.service for s in spans})
    console.print(
        f"[bold]trace[/] {outcome.trace_id} · {len(spans)} spans from {len(services)} services"
    )
    console.print(span_tree(spans))
    console.print(
        f"[bold]audit[/] {head['records']} records · chain "
        + ("[green]verified[/]" if head["ok"] else "[red]BROKEN[/]")
        + f" · head {head['head'][:16]}"
    )


@app.command()
def demo(
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Start a local Ray, launch the four agents and pursue the built-in story goal."""
    with _errors():
        settings = _settings(address, state_dir)
    _load_agents()
    _execute_goal(DEMO_GOAL, settings, as_json=as_json, timeout=timeout)


@app.command()
def submit(
    goal_file: Annotated[Path, typer.Argument(help="YAML file with goal, passage and beats.")],
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Pursue the goal in GOAL_FILE across all agents."""
    with _errors():
        request = _load_goal(goal_file)
        settings = _settings(address, state_dir)
    _execute_goal(request, settings, as_json=as_json, timeout=timeout)


# -- one request ---------------------------------------------------------------------------------


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


@app.command()
def request(
    agent: Annotated[str, typer.Argument(help="Target agent role.")],
    capability: Annotated[str, typer.Argument(help="Capability name, e.g. ExtractEntities.")],
    payload: Annotated[str, typer.Option("--json", help="The request as a JSON object.")] = "{}",
    caller: Annotated[
        str,
        typer.Option("--as", help="Caller identity (trusted until identity authentication lands)."),
    ] = _OPERATOR,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    timeout: TimeoutOpt = None,
) -> None:
    """Send one cross-agent request and print the answer as JSON."""
    with _errors():
        settings = _settings(address, state_dir)
        if settings.extensions:  # they may register capabilities this command must encode
            _load_agents()
            try:
                import_extensions(settings.extensions)
            except ExtensionError as exc:
                raise InputError(str(exc)) from exc
        _check_role(agent)
        spec = capability_for(agent, capability)
        if spec is None:
            served = [name for name, item in CAPABILITIES.items() if item.role == agent]
            raise InputError(
                f"agent {agent!r} has no capability {capability!r}; valid: {', '.join(served)}"
            )
        raw = parse_json_object(payload, "--json")
        try:
            body = spec.request.model_validate(raw)
        except ValidationError as exc:
            raise InputError(_validation_line(f"{capability} request", exc)) from exc
        # One request id whichever way the call goes: a repeat gets the stored answer.
        request_id = f"cli-{uuid.uuid4().hex}"
        answer = _with_agent(
            settings,
            agent,
            caller,
            timeout,
            lambda client: client.call(agent, capability, body, request_id=request_id),
        )
        _print_json(answer.model_dump(mode="json"))


# -- plans ---------------------------------------------------------------------------------------


def _load_plan(path: Path, settings: Settings, *, plan_id: str = "") -> tuple[str, str]:
    """Read a plan file and check it the way its owner will: returns (owner, plan JSON).

    ``plan_id``, when given, replaces the file's id (a new revision of that plan).
    """
    raw = _read_mapping(path, "a plan's id, owner and steps")
    check_plan_steps(path, raw)
    if plan_id:
        raw["id"] = plan_id
    owner = raw.get("owner")
    if owner not in ROLES:
        raise InputError(f"{path}: owner must be one of {', '.join(ROLES)}, not {owner!r}")
    _load_agents()
    try:
        agent = build_agent(owner, extensions=settings.extensions)
    except ExtensionError as exc:
        raise InputError(str(exc)) from exc
    try:
        plan = agent.plan_type.model_validate(raw)
    except ValidationError as exc:
        raise InputError(_validation_line(f"plan in {path}", exc)) from exc
    try:
        validate_plan(plan, tools=agent.registry, roles=ROLES, capabilities=CAPABILITIES)
    except PlanValidationError as exc:
        raise InputError(f"plan {plan.id!r} refused: " + "; ".join(exc.problems)) from exc
    plan_json = plan.model_dump_json()
    check_encoded_size(path, plan_json, settings.max_message_bytes)
    return owner, plan_json


@plans_app.command("run")
def plans_run(
    plan_file: Annotated[Path, typer.Argument(help="YAML or JSON plan with id, owner and steps.")],
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Have the plan's owner validate and run a plan you wrote."""
    with _errors():
        settings = _settings(address, state_dir)
        owner, plan_json = _load_plan(plan_file, settings)
        snapshot = _with_agent(
            settings, owner, OPERATOR, timeout, lambda client: client.run_plan(plan_json)
        )
        if as_json:
            _print_json(json.loads(snapshot.model_dump_json()))
        else:
            console.print(plan_forest([snapshot], snapshot.plan_id))


@plans_app.command("show")
def plans_show(
    plan_id: Annotated[str, typer.Argument(help="A plan id, e.g. the goal id demo printed.")],
    revisions: Annotated[
        bool,
        typer.Option("--revisions", help="Print the plan's revision history from its owner."),
    ] = False,
    fmt: Annotated[
        str | None,
        typer.Option("--format", help="A picture of the DAG with step statuses: mermaid or dot."),
    ] = None,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show a plan and every sub-plan it caused, from a running deployment."""
    with _errors():
        if fmt is not None and fmt not in DIAGRAM_FORMATS:
            raise InputError(_unknown("format", fmt, DIAGRAM_FORMATS))
        settings = _settings(address, state_dir)
        with _running(_deployment(settings)) as deployment:
            endpoints = {info.role: info.endpoint for info in deployment.status()}
        if revisions:
            _show_revisions(plan_id, endpoints, settings, as_json=as_json)
            return

        async def collect() -> list[PlanSnapshot]:
            found: list[PlanSnapshot] = []
            for endpoint in endpoints.values():
                async with _client(settings, endpoint) as client:
                    found.extend(await client.plans(plan_id))
            return found

        snapshots = _run(collect)
        if not snapshots:
            raise InputError(f"no plan {plan_id!r} on any agent")
        if fmt is not None:
            console.file.write(plan_diagram(snapshots, plan_id, fmt))
        elif as_json:
            _print_json([json.loads(s.model_dump_json()) for s in snapshots])
        else:
            console.print(plan_forest(snapshots, plan_id))


def _deployed_endpoints(settings: Settings) -> dict[str, str]:
    """Each agent's endpoint on the running deployment (never an embedded one)."""
    with _running(_deployment(settings)) as deployment:
        return {info.role: info.endpoint for info in deployment.status()}


def _check_role(agent: str) -> None:
    if agent not in ROLES:
        raise InputError(_unknown("agent", agent, ROLES))


@plans_app.command("list")
def plans_list(
    agent: Annotated[
        str | None, typer.Option("--agent", help="Only this agent's plans (a role).")
    ] = None,
    status: Annotated[
        str | None, typer.Option("--status", help="Only plans in this status, e.g. blocked.")
    ] = None,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List the plans the agents hold: id, agent, revision, status."""
    with _errors():
        if agent is not None:
            _check_role(agent)
        _load_agents()
        statuses = [value.value for value in PlanStatus]
        if status is not None and status not in statuses:
            raise InputError(_unknown("status", status, statuses))
        settings = _settings(address, state_dir)
        endpoints = _deployed_endpoints(settings)
        roles = [agent] if agent is not None else list(endpoints)

        async def collect() -> list[PlanSnapshot]:
            found: list[PlanSnapshot] = []
            for role in roles:
                async with _client(settings, endpoints[role]) as client:
                    found.extend(await client.plans(""))
            return found

        snapshots = [s for s in _run(collect) if status is None or s.status == status]
        snapshots.sort(key=lambda s: (s.agent, s.plan_id))
        if as_json:
            _print_json(
                [
                    {"plan_id": s.plan_id, "agent": s.agent, "revision": s.revision}
                    | {"status": s.status}
                    for s in snapshots
                ]
            )
            return
        table = Table(box=None, pad_edge=False)
        for column in ("plan", "agent", "rev", "status"):
            table.add_column(column)
        for snap in snapshots:
            table.add_row(snap.plan_id, snap.agent, str(snap.revision), snap.status)
        console.print(table)
        console.print(f"{len(snapshots)} plans", highlight=False)


@plans_app.command("watch")
def plans_watch(
    plan_id: Annotated[str, typer.Argument(help="The plan to follow.")],
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per event.")] = False,
) -> None:
    """Follow a plan's events (and its sub-plans') as they happen, until the plan ends."""
    with _errors():
        settings = _settings(address, state_dir)
        endpoints = _deployed_endpoints(settings)
        config = ClientConfig(default_timeout_s=settings.request_timeout_s)

        async def follow() -> int:
            owner = await _owner_of(plan_id, endpoints, settings, config)
            seen = 0
            async with _client(settings, endpoints[owner]) as client:
                async for event in client.watch(plan_id):
                    seen += 1
                    if as_json:
                        _print_json_line(json.loads(event.model_dump_json()))
                    else:
                        step = f" step {event.step_id}" if event.step_id else ""
                        why = f" ({event.failure_class}: {event.message})" if event.message else ""
                        console.print(
                            f"{event.agent or owner} {event.plan_id}{step} -> "
                            f"[bold]{event.status}[/]{escape(why)}",
                            highlight=False,
                        )
            return seen

        seen = _run(follow)
        if not as_json:
            console.print(f"[dim]the plan ended; {seen} events[/]", highlight=False)


@app.command()
def describe(
    agent: Annotated[str, typer.Argument(help="An agent's role, e.g. perception.")],
    capability: Annotated[
        str | None, typer.Argument(help="One capability: its request and response schemas.")
    ] = None,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """What an agent serves: capabilities, versions, schemas, tools (the Describe RPC)."""
    with _errors():
        _check_role(agent)
        settings = _settings(address, state_dir)
        endpoint = _deployed_endpoints(settings)[agent]

        async def ask() -> AgentCard:
            async with _client(settings, endpoint) as client:
                return await client.describe()

        card = _run(ask)
        cards = {c.name: c for c in card.capabilities}
        if capability is not None and capability not in cards:
            raise InputError(_unknown(f"capability of {agent}", capability, cards))
        chosen = [cards[capability]] if capability is not None else list(cards.values())
        if as_json:
            _print_json(
                {
                    "role": card.role,
                    "version": card.version,
                    "tools": card.tools,
                    "capabilities": [
                        {
                            "name": c.name,
                            "version": c.version,
                            "request_schema": json.loads(c.request_schema),
                            "response_schema": json.loads(c.response_schema),
                        }
                        for c in chosen
                    ],
                }
            )
            return
        if capability is None:
            console.print(f"[bold]{card.role}[/] {card.version}", highlight=False)
            table = Table(box=None, pad_edge=False)
            for column in ("capability", "version", "request fields"):
                table.add_column(column)
            for c in chosen:
                fields = json.loads(c.request_schema).get("properties", {})
                table.add_row(c.name, c.version, ", ".join(fields))
            console.print(table)
            console.print(f"tools: {', '.join(card.tools)}", highlight=False, soft_wrap=True)
            return
        c = chosen[0]
        console.print(f"[bold]{card.role}.{c.name}[/] version {c.version}", highlight=False)
        for title, schema in (("request", c.request_schema), ("response", c.response_schema)):
            console.print(f"[bold]{title} schema[/]")
            console.print_json(schema)


def _show_revisions(
    plan_id: str, endpoints: dict[str, str], settings: Settings, *, as_json: bool
) -> None:
    config = ClientConfig(default_timeout_s=settings.request_timeout_s)

    async def fetch() -> RevisionsResponse:
        owner = await _owner_of(plan_id, endpoints, settings, config)
        async with _client(settings, endpoints[owner], config=config) as client:
            return await client.revisions(plan_id)

    history = _run(fetch)
    if as_json:
        _print_json(history.model_dump(mode="json"))
        return
    table = Table(title=f"Revisions of plan {plan_id} on {history.agent}", title_justify="left")
    for column in ("revision", "parent", "author", "rationale", "added", "removed", "changed"):
        table.add_column(column)
    for entry in history.revisions:
        table.add_row(
            str(entry.revision),
            str(entry.parent) if entry.parent else "-",
            entry.author or "-",
            entry.rationale or "-",
            ", ".join(entry.added) or "-",
            ", ".join(entry.removed) or "-",
            ", ".join(f"{c.step_id} ({', '.join(c.fields)})" for c in entry.changed) or "-",
        )
    console.print(table)


@app.command()
def replay(
    plan_id: Annotated[str, typer.Argument(help="A finished plan's id.")],
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Re-run a finished plan on its owner from its recorded outputs (no side effects) and report
    where decisions diverge; exit 1 when any does."""
    with _errors():
        settings = _settings(address, state_dir)
        with _running(_deployment(settings)) as deployment:
            endpoints = {info.role: info.endpoint for info in deployment.status()}
        config = ClientConfig(default_timeout_s=timeout or settings.request_timeout_s)

        async def send() -> ReplayResult:
            owner = await _owner_of(plan_id, endpoints, settings, config)
            async with _client(settings, endpoints[owner], config=config) as client:
                return await client.replay(plan_id)

        result = _run(send)
        if as_json:
            _print_json({**result.model_dump(mode="json"), "diverged": result.diverged})
        elif not result.diverged:
            console.print(
                f"no divergence: {result.decisions} decisions re-derived "
                f"(plan {result.plan_id} revision {result.revision} on {result.agent}, "
                f"{result.recorded_status})",
                highlight=False,
            )
        else:
            table = Table(
                title=f"Replay of plan {result.plan_id} revision {result.revision}: "
                f"{len(result.divergences)} of {result.decisions} decisions diverged",
                title_justify="left",
            )
            for column in ("step", "decision", "recorded", "replayed"):
                table.add_column(column)
            for d in result.divergences:
                table.add_row(d.step_id or "(plan)", d.decision, d.recorded, d.replayed)
            console.print(table)
    if result.diverged:
        raise typer.Exit(1)


# -- control -------------------------------------------------------------------------------------

PlanArg = Annotated[str, typer.Argument(help="The plan's id (stratagem plans show lists plans).")]
GateArg = Annotated[
    str, typer.Argument(help="The gate step's id, or the step a reconcile gate names.")
]
RationaleOpt = Annotated[
    str, typer.Option("--rationale", help="Why (recorded in the audit log, redacted).")
]


def _control(
    plan_id: str,
    action: ControlAction,
    *,
    address: str | None,
    state_dir: Path | None,
    as_json: bool,
    timeout: float | None,
    gate_id: str = "",
    rationale: str = "",
    output: str | None = None,
    plan_file: Path | None = None,
) -> None:
    """Send one control action to the agent that owns ``plan_id`` and print the plan's state."""
    with _errors():
        settings = _settings(address, state_dir)
        plan_json = ""
        if plan_file is not None:
            _, plan_json = _load_plan(plan_file, settings, plan_id=plan_id)
        recorded: dict[str, Any] | None = None
        if output is not None:
            recorded = parse_json_object(output, "--output")
        try:
            ControlRequest(
                plan_id=plan_id,
                action=action,
                gate_id=gate_id,
                rationale=rationale,
                output_json="" if recorded is None else json.dumps(recorded),
                plan_json=plan_json,
            )
        except ValidationError as exc:
            raise InputError(_validation_line(f"{action} of plan {plan_id!r}", exc)) from exc
        with _running(_deployment(settings)) as deployment:
            endpoints = {info.role: info.endpoint for info in deployment.status()}
        config = ClientConfig(default_timeout_s=timeout or settings.request_timeout_s)

        async def send() -> PlanSnapshot:
            owner = await _owner_of(plan_id, endpoints, settings, config)
            async with _client(settings, endpoints[owner], config=config) as client:
                return await client.control(
                    plan_id,
                    action,
                    gate_id=gate_id,
                    rationale=rationale,
                    output=recorded,
                    plan_json=plan_json,
                )

        snapshot = _run(send)
        if as_json:
            _print_json(json.loads(snapshot.model_dump_json()))
        else:
            gate = f" gate {gate_id}" if gate_id else ""
            console.print(
                f"{action}{gate}: plan {snapshot.plan_id} revision {snapshot.revision} on "
                f"{snapshot.agent} is [bold]{snapshot.status}[/]",
                highlight=False,
            )


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


@app.command()
def approve(
    plan_id: PlanArg,
    gate_id: GateArg,
    rationale: RationaleOpt,
    output: Annotated[
        str | None,
        typer.Option(
            "--output",
            help="For a reconcile gate: the step's output (a JSON object) to record instead of "
            "re-running it, when you found its effect done.",
        ),
    ] = None,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Approve a gate: its plan goes on (a reconciled step is re-run, or recorded with --output)."""
    _control(
        plan_id,
        "approve",
        gate_id=gate_id,
        rationale=rationale,
        output=output,
        address=address,
        state_dir=state_dir,
        as_json=as_json,
        timeout=timeout,
    )


@app.command()
def reject(
    plan_id: PlanArg,
    gate_id: GateArg,
    rationale: RationaleOpt,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Reject a gate: the gate (or reconciled step) fails, and so its plan, which is compensated."""
    _control(
        plan_id,
        "reject",
        gate_id=gate_id,
        rationale=rationale,
        address=address,
        state_dir=state_dir,
        as_json=as_json,
        timeout=timeout,
    )


@app.command()
def pause(
    plan_id: PlanArg,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Pause a plan: no new step starts, running ones finish; 'resume' continues it."""
    _control(
        plan_id, "pause", address=address, state_dir=state_dir, as_json=as_json, timeout=timeout
    )


@app.command()
def cancel(
    plan_id: PlanArg,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Cancel a plan for good: running steps are cancelled, completed ones compensated."""
    _control(
        plan_id, "cancel", address=address, state_dir=state_dir, as_json=as_json, timeout=timeout
    )


@app.command()
def resume(
    plan_id: PlanArg,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Resume a stored, unfinished plan that is not running (paused, or left by a stop)."""
    _control(
        plan_id, "resume", address=address, state_dir=state_dir, as_json=as_json, timeout=timeout
    )


@app.command()
def replan(
    plan_id: PlanArg,
    plan_file: Annotated[
        Path, typer.Argument(help="YAML or JSON plan: the new revision's owner and steps.")
    ],
    rationale: Annotated[
        str, typer.Option("--rationale", help="Why the plan changes (kept with the revision).")
    ],
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Make a new revision of a stored plan that is not running (pause it first); 'resume' runs
    it, with the results of unchanged completed steps carried over."""
    _control(
        plan_id,
        "replan",
        rationale=rationale,
        plan_file=plan_file,
        address=address,
        state_dir=state_dir,
        as_json=as_json,
        timeout=timeout,
    )


# -- deployment ----------------------------------------------------------------------------------


def _agents_table(infos: list[AgentInfo], mode: str | None) -> Table:
    table = Table(title=f"Stratagem agents ({mode} Ray)", title_justify="left")
    for column in (
        "agent",
        "health",
        "endpoint",
        "node",
        "pid",
        "restarts",
        "plans running",
        "blocked",
    ):
        table.add_column(column)
    for info in infos:
        health = {"serving": "[green]serving[/]", "unreachable": "[red]unreachable[/]"}.get(
            info.health, f"[yellow]{info.health} ({info.state.lower()})[/]"
        )
        if info.problem:
            health += f" [red]{escape(info.problem)}[/]"
        table.add_row(
            info.role,
            health,
            info.endpoint or "-",
            " ".join([info.node_id[:8] or "-", *(f"{k}={v}" for k, v in info.node_labels.items())]),
            str(info.pid or "-"),
            "?" if info.restarts is None else str(info.restarts),
            str(info.plans_running),
            str(info.plans_blocked),
        )
    return table


@contextmanager
def _running(deployment: Deployment) -> Iterator[Deployment]:
    """Connected to a running deployment (never an embedded one) for the block's duration."""
    deployment.connect(allow_embedded=False)
    try:
        yield deployment
    finally:
        deployment.disconnect()


def _show_agents(infos: list[AgentInfo], mode: str | None, as_json: bool) -> None:
    if as_json:
        _print_json(_infos_json(infos, mode))
    else:
        console.print(_agents_table(infos, mode))


def _infos_json(infos: list[AgentInfo], mode: str | None) -> dict[str, Any]:
    return {"mode": mode, "agents": [dataclasses.asdict(info) for info in infos]}


@app.command()
def up(
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    replace: Annotated[bool, typer.Option("--replace", help="Redeploy running agents.")] = False,
    allow_unauthenticated_ray: Annotated[
        bool | None,
        typer.Option(
            "--allow-unauthenticated-ray",
            help="Deploy onto an external Ray that asks for no token (anyone reaching it owns "
            "the agents).",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Deploy the four agents as detached actors (starting a local Ray head when no address)."""
    with _errors():
        settings = _settings(
            address, state_dir, allow_unauthenticated_ray=allow_unauthenticated_ray or None
        )
        # Agents also append their spans to a file in the state directory (on their own node),
        # so `stratagem trace` works without a backend on one machine.
        settings = settings.model_copy(
            update={"trace_file": settings.trace_file or settings.state_dir / "spans.jsonl"}
        )
        deployment = _deployment(settings)
        if settings.address is None and LocalCluster.find(settings.local_cluster_file) is None:
            if not as_json:
                err_console.print("[dim]starting a local Ray head…[/]")
            LocalCluster.start(settings)
        if not as_json:
            err_console.print("[dim]deploying the agents…[/]")
        with _running(deployment):
            infos = deployment.deploy(detached=True, replace=replace)
        for warning in deployment.warnings:
            err_console.print(f"[yellow]warning:[/] {warning}", soft_wrap=True, highlight=False)
        if as_json:
            _print_json({**_infos_json(infos, deployment.mode), "stale": deployment.stale})
            return
        console.print(_agents_table(infos, deployment.mode))
        if deployment.stale:
            err_console.print(
                f"[yellow]warning:[/] {', '.join(deployment.stale)} kept running with other "
                "settings than this command's; 'stratagem up --replace' redeploys them",
                soft_wrap=True,
            )


@app.command()
def status(
    address: AddressOpt = None, state_dir: StateDirOpt = None, as_json: JsonOpt = False
) -> None:
    """Show each agent's health, node, gRPC endpoint, process, restarts and running plans.

    Exits 1 when an agent is not serving (a readiness check for scripts)."""
    with _errors():
        deployment = _deployment(_settings(address, state_dir))
        with _running(deployment):
            infos = deployment.status()
        _show_agents(infos, deployment.mode, as_json)
        sick = [
            info.role + (f" ({info.problem})" if info.problem else "")
            for info in infos
            if info.health != "serving"
        ]
        if sick:
            raise LaunchError(f"not serving: {', '.join(sick)}")


@secret_app.command("rotate")
def secret_rotate(
    address: AddressOpt = None, state_dir: StateDirOpt = None, as_json: JsonOpt = False
) -> None:
    """Make a new cluster secret and redeploy the agents with it (as 'up --replace' does):
    tokens signed with the old secret stop passing; plans continue from their stores."""
    with _errors():
        from stratagem.runtime._rotation import rotate_secret  # joins Ray

        settings = _settings(address, state_dir)
        settings = settings.model_copy(
            update={"trace_file": settings.trace_file or settings.state_dir / "spans.jsonl"}
        )
        deployment = _deployment(settings)
        with _running(deployment):
            key_id, infos = rotate_secret(deployment)
        if as_json:
            _print_json({**_infos_json(infos, deployment.mode), "key_id": key_id})
            return
        console.print(_agents_table(infos, deployment.mode))
        err_console.print(
            f"new cluster secret {key_id} in {settings.secret_path}; copy it to every other "
            "operator machine (their old copy is refused now)",
            soft_wrap=True,
        )


@app.command()
def down(
    address: AddressOpt = None, state_dir: StateDirOpt = None, as_json: JsonOpt = False
) -> None:
    """Remove the four agents (and the local Ray head that 'up' started, if any)."""
    with _errors():
        settings = _settings(address, state_dir)
        deployment = _deployment(settings)
        recorded = None if settings.address else LocalCluster.recorded(settings.local_cluster_file)
        local = recorded if recorded is not None and recorded.alive else None
        removed: list[str] = []
        cleaned: list[str] = []
        if settings.address or (local is not None and settings.ray_token_path.is_file()):
            with _running(deployment):
                removed = deployment.teardown()
        # A local head whose token is gone cannot be joined: stopping it stops its agents too.
        if local is not None:
            local.stop()
            settings.local_cluster_file.unlink(missing_ok=True)
            settings.ray_token_path.unlink(missing_ok=True)
        elif recorded is not None:  # the head died: clean up after it
            cleaned = recorded.clean_up(settings)
        if as_json:
            _print_json(
                {"removed": removed, "stopped_local_ray": local is not None, "cleaned": cleaned}
            )
        elif recorded is not None and local is None:
            console.print(
                f"the local Ray head (pid {recorded.pid}) was already gone; cleaned up: "
                + (", ".join(cleaned) or "nothing was left"),
                soft_wrap=True,
                highlight=False,
            )
        elif not removed and local is None:
            console.print("nothing to stop: no Stratagem deployment found")
        else:
            console.print(
                f"removed agents: {', '.join(removed) or 'none'}"
                + ("; stopped the local Ray head" if local is not None else "")
            )


# -- traces --------------------------------------------------------------------------------------

_HEX = frozenset("0123456789abcdef")


def _trace_spans(path: Path, trace_id: str) -> list[SpanRecord]:
    """The spans of the one trace whose id is ``trace_id`` or starts with it (>= 8 hex chars)."""
    wanted = trace_id.strip().lower()
    if not 8 <= len(wanted) <= 32 or not set(wanted) <= _HEX:
        raise InputError(
            f"trace id {trace_id!r} must be 32 hex characters, or a prefix of at least 8"
        )
    if not path.is_file():
        raise InputError(f"no span file at {path} (set --file or STRATAGEM_TRACE_FILE)")
    by_trace: dict[str, list[SpanRecord]] = {}
    for record in read_spans(path):
        if record.trace_id.startswith(wanted):
            by_trace.setdefault(record.trace_id, []).append(record)
    if not by_trace:
        raise InputError(f"no trace {trace_id!r} in {path}")
    if len(by_trace) > 1:
        raise InputError(
            f"trace id prefix {trace_id!r} matches {len(by_trace)} traces in {path}; give more"
        )
    (spans,) = by_trace.values()
    return spans


def _backend_spans(url: str, project: str, trace_id: str) -> list[SpanRecord]:
    """The trace's spans from a Phoenix backend: empty when it has none or cannot be asked."""
    wanted = trace_id.strip().lower()
    if len(wanted) != 32 or not set(wanted) <= _HEX:
        return []  # the backend filters by the whole id; a prefix is looked up in the file
    try:
        return PhoenixTraces(url, project=project).spans(wanted)
    except BackendError as exc:
        err_console.print(f"[yellow]warning:[/] {exc}; reading the span file", soft_wrap=True)
        return []


@app.command("trace")
def trace_command(
    trace_id: Annotated[
        str, typer.Argument(help="The trace id demo printed (or a prefix of >= 8 hex chars).")
    ],
    file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            help="JSON-lines span file (default STRATAGEM_TRACE_FILE, else STATE_DIR/spans.jsonl).",
        ),
    ] = None,
    backend: Annotated[
        str | None,
        typer.Option(
            "--backend",
            envvar="STRATAGEM_TRACE_BACKEND",
            help="Phoenix URL to read the trace from (default: the one `make otel-backend` "
            "started, if it runs).",
        ),
    ] = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Print a trace as a waterfall: the span tree with services, timing, events and status."""
    with _errors():
        spans: list[SpanRecord] = []
        if file is None:
            settings = _settings(None, state_dir)
            project = "default"
            if backend is None and (found := find_backend(settings.state_dir)) is not None:
                backend, project = found.url, found.project
            if backend is not None:
                spans = _backend_spans(backend, project, trace_id)
            file = settings.trace_file or settings.state_dir / "spans.jsonl"
        if not spans:
            spans = _trace_spans(file, trace_id)
        if as_json:
            _print_json({"trace_id": spans[0].trace_id, "spans": span_json(spans)})
        else:
            console.print(span_tree(spans))


# -- audit ---------------------------------------------------------------------------------------


ArchiveOpt = Annotated[
    Path | None,
    typer.Option(
        "--archive",
        help="The folder of archived audit segments (default STATE_DIR/audit-archive).",
    ),
]


@audit_app.command("verify")
def audit_verify(
    state_dir: StateDirOpt = None, archive: ArchiveOpt = None, as_json: JsonOpt = False
) -> None:
    """Verify the audit chain (archived segments, then the live log) and its signed heads; name
    the first edited, deleted, reordered or missing record."""
    with _errors():
        settings = _settings(None, state_dir)
        if settings.store_url is None and not settings.audit_path.exists():
            raise InputError(f"no audit log at {settings.audit_path}")
        if archive is not None and not archive.is_dir():
            raise InputError(f"no folder of archived audit segments at {archive}")
        sealed = settings.audit_key_path.exists()
        try:
            verdict, head = _verify_audit(settings, archive)
        except ArchiveError as exc:
            _fail(f"{exc} (keep it as evidence and restore a copy to verify)", 1)
        except sqlite3.DatabaseError as exc:  # a damaged file: SQLite cannot read its pages
            _fail(
                f"audit log {settings.audit_path} cannot be read: {exc} (the file is damaged; "
                "keep it as evidence and restore a copy to verify)",
                1,
            )
        if as_json:
            _print_json(
                {
                    "ok": verdict.ok,
                    "records": verdict.count,
                    "head": head,
                    "signed_heads": verdict.sealed,
                    "first_broken_seq": verdict.first_broken_seq,
                    "heads_line": verdict.heads_line,
                    "reason": verdict.reason,
                }
            )
        elif verdict.ok:
            signed = (
                f", {verdict.sealed} signed heads verified"
                if sealed
                else f" (no signing key at {settings.audit_key_path}: chain only)"
            )
            console.print(
                f"audit chain verified: {verdict.count} records{signed}, head {head}",
                soft_wrap=True,
            )
        else:
            if verdict.first_broken_seq is not None:
                where = f" at record {verdict.first_broken_seq}"
            elif verdict.heads_line is not None:
                where = f" at line {verdict.heads_line} of the signed heads"
            else:
                where = ""
            err_console.print(
                f"[bold red]audit chain not verified[/]{where}: {escape(verdict.reason or '')}"
                if not where
                else f"[bold red]audit chain broken[/]{where}: {escape(verdict.reason or '')}",
                soft_wrap=True,
            )
        if not verdict.ok:
            raise typer.Exit(1)


@audit_app.command("archive")
def audit_archive(
    older_than_days: Annotated[
        float,
        typer.Option(
            "--older-than-days",
            min=0.0,
            max=36_500.0,
            help="Archive the records older than this many days (the newest record stays).",
        ),
    ] = 30.0,
    state_dir: StateDirOpt = None,
    archive: ArchiveOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Move old audit records into a compressed segment (the chain still verifies across it)."""
    with _errors():
        settings = _settings(None, state_dir)
        if settings.store_url is None and not settings.audit_path.exists():
            raise InputError(f"no audit log at {settings.audit_path}")
        folder = archive or settings.audit_archive_dir
        cutoff = (datetime.now(UTC) - timedelta(days=older_than_days)).isoformat(
            timespec="microseconds"
        )
        log = open_audit_log(settings)
        try:
            through = 0
            for record in log.records():
                if record.ts >= cutoff:
                    break
                through = record.seq
            segment = archive_audit(log, folder, through_seq=through) if through else None
        except ArchiveError as exc:
            _fail(str(exc), 1)
        finally:
            log.close()
        if as_json:
            _print_json(
                {
                    "archived": segment.count if segment else 0,
                    "segment": str(segment.path) if segment else None,
                    "first_seq": segment.first if segment else None,
                    "last_seq": segment.last if segment else None,
                }
            )
        elif segment is None:
            console.print(f"no audit record older than {older_than_days:g} days to archive")
        else:
            console.print(
                f"archived {segment.count} audit records ({segment.first}..{segment.last}) to "
                f"{segment.path}; keep the segments: audit verify reads them",
                soft_wrap=True,
            )


# -- certificates --------------------------------------------------------------------------------


@certs_app.command("init")
def certs_init(
    directory: Annotated[
        Path | None,
        typer.Option(
            "--dir", help="Where to write them (default STRATAGEM_TLS_DIR, STATE_DIR/tls)."
        ),
    ] = None,
    identities: Annotated[
        list[str] | None,
        typer.Option(
            "--identity",
            help="An identity to certify (repeatable; default: the agents + operator).",
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace existing files, CA included.")
    ] = False,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a CA (once) and a certificate and key per identity, for STRATAGEM_AUTH=mtls."""
    with _errors():
        settings = _settings(None, state_dir)
        folder = (directory.expanduser().resolve() if directory else None) or settings.tls_path
        names = identities or [*ROLES, OPERATOR]
        from stratagem.protocol import init_certificates

        written = init_certificates(folder, names, overwrite=force)
        if as_json:
            _print_json(
                {"dir": str(folder), "identities": names, "written": [str(p) for p in written]}
            )
        else:
            console.print(
                f"{len(written)} files written to {folder} for {', '.join(names)}; "
                "set STRATAGEM_AUTH=mtls (and STRATAGEM_TLS_DIR if not the default) to use them",
                soft_wrap=True,
                highlight=False,
            )


def main() -> None:
    """Console-script entry point."""
    # The CLI reports what matters itself, in one line; library logs are for STRATAGEM_LOG_LEVEL.
    logging.basicConfig(level=os.environ.get("STRATAGEM_LOG_LEVEL", "ERROR").upper())
    app()
