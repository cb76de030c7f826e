"""Reading what a deployment left behind: ``trace``, ``audit verify``; ``certs init``."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from stratagem.runtime._cli._app import (
    JsonOpt,
    StateDirOpt,
    _errors,
    _fail,
    _operate,
    _print_json,
    _settings,
    _verify_audit,
    app,
    audit_app,
    certs_app,
    console,
    err_console,
    lazy_scope,
    secret_app,
)
from stratagem.runtime.operator._input import (
    InputError,
)

if TYPE_CHECKING:
    from stratagem.protocol import (
        OPERATOR,
        ArchiveError,
        ProtocolUsageError,
        StorageCorruptError,
        TokenSigner,
        archive_audit,
        init_certificates,
    )
    from stratagem.runtime.config._extensions import settings_roles
    from stratagem.runtime.config._security import (
        check_operator_identity,
        issue_identity_key,
        operator_key,
    )
    from stratagem.runtime.config._stores import open_audit_log
    from stratagem.runtime.operator._render import span_json, span_tree
    from stratagem.runtime.operator._show import traces_table
    from stratagem.runtime.telemetry._backend import BackendError, PhoenixTraces, find_backend
    from stratagem.runtime.telemetry._telemetry import SpanRecord, read_spans

__all__: list[str] = []

logger = logging.getLogger(__name__)
lazy_scope(globals())


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
        str | None,
        typer.Argument(
            help="The trace id demo printed (or a prefix of >= 8 hex chars); none: list the "
            "recent traces from the agents' histories."
        ),
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", help="How many recent traces to list.", min=1, max=1000)
    ] = 20,
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
    """Print a trace as a waterfall: the span tree with services, timing, events and status;
    with no id, list the recent traces (each goal's and plan's, failed ones included).

    The layout fits the terminal's width (set COLUMNS to choose it).

    Examples:

      stratagem trace

      stratagem trace 4bf92f3577b34da6a3ce929d0e0e4736

      stratagem trace "$(stratagem submit examples/lighthouse.yaml --json | jq -r .trace_id)"
    """
    with _errors():
        if trace_id is None:
            settings = _settings(None, state_dir)
            traces = _operate(settings, lambda op: op.traces(limit=limit))
            if as_json:
                _print_json([entry.model_dump(mode="json") for entry in traces])
            else:
                console.print(traces_table(traces, console.width))
                console.print(
                    f"{len(traces)} traces; 'stratagem trace ID' prints one", highlight=False
                )
            return
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
            console.print(span_tree(spans, width=console.width))


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
    the first edited, deleted, reordered or missing record.

    Examples:

      stratagem audit verify

      stratagem audit verify --archive /mnt/cold/audit-archive --json
    """
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
        except StorageCorruptError as exc:  # a damaged file: SQLite cannot read its pages
            _fail(
                f"audit log {settings.audit_path} cannot be read: {exc.__cause__ or exc} (the "
                "file is damaged; keep it as evidence and restore a copy to verify)",
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
            # Wrapped at the terminal's width (between words: the head's hex stays whole).
            console.print(
                f"audit chain verified: {verdict.count} records{signed}, head {head}",
                highlight=False,
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


# -- tokens --------------------------------------------------------------------------------------


@app.command("token")
def token(
    identity: Annotated[
        str, typer.Option("--identity", help="Who the token speaks for (default: operator).")
    ] = "operator",
    ttl: Annotated[
        float,
        typer.Option("--ttl", min=1.0, help="Seconds it is valid (at most STRATAGEM_TOKEN_TTL_S)."),
    ] = 600.0,
    state_dir: StateDirOpt = None,
) -> None:
    """Print a bearer token (a JWT signed with the operator's key) for a client of your own: send
    it as 'authorization: Bearer <token>'. It speaks as the key's identity (the operator, or who
    STRATAGEM_OPERATOR_KEY_FILE's key is for), never as an agent."""
    with _errors():
        settings = _settings(None, state_dir)
        if settings.auth != "token":
            raise InputError(
                f"tokens are for STRATAGEM_AUTH=token; this deployment uses {settings.auth}"
            )
        if ttl > settings.token_ttl_s:
            raise InputError(
                f"--ttl {ttl:g} is longer than STRATAGEM_TOKEN_TTL_S ({settings.token_ttl_s:g})"
            )
        try:
            check_operator_identity(settings, identity, settings_roles(settings))
            signer = TokenSigner(operator_key(settings), max_ttl_s=settings.token_ttl_s)
            issued = signer.issue(identity, ttl)
        except ProtocolUsageError as exc:
            raise InputError(str(exc)) from None
        console.file.write(issued + "\n")


@secret_app.command("issue")
def secret_issue(
    identity: Annotated[str, typer.Argument(help="Who the key signs as (a person, not an agent).")],
    out: Annotated[
        Path, typer.Option("--out", help="Where to write the key (mode 0600; not replaced).")
    ],
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Write IDENTITY's own token key, derived from the cluster secret, for that person's
    machine: with STRATAGEM_OPERATOR_KEY_FILE pointing at it, the commands sign as IDENTITY
    ('stratagem approve PLAN GATE --as IDENTITY') and as no one else. 'secret rotate' voids it."""
    with _errors():
        settings = _settings(None, state_dir)
        path = out.expanduser()
        if path.exists() or path.is_symlink():
            raise InputError(f"--out {path} exists; remove it first or choose another file")
        try:
            key = issue_identity_key(settings, identity, settings_roles(settings))
            key.save(path)
        except ProtocolUsageError as exc:
            raise InputError(str(exc)) from None
        if as_json:
            _print_json({"identity": key.identity, "key_id": key.key_id, "file": str(path)})
            return
        console.print(
            f"key for {key.identity!r} (secret {key.key_id}) written to {path}; on that "
            f"person's machine: STRATAGEM_OPERATOR_KEY_FILE={path.name} stratagem approve PLAN "
            f"GATE --as {key.identity}",
            soft_wrap=True,
            highlight=False,
            markup=False,
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
        names = identities or [
            *settings_roles(settings),
            OPERATOR,
        ]
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
