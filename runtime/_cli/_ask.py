"""``ask``: a goal in plain words, planned by the orchestrator over every deployed agent's
capabilities (``docs/goals.md``); ``submit`` sends a goal file without a passage here too."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from stratagem.runtime._cli._app import (
    AddressOpt,
    JsonOpt,
    StateDirOpt,
    TimeoutOpt,
    _errors,
    _operate,
    _print_json,
    _settings,
    app,
    console,
    lazy_scope,
)
from stratagem.runtime.config._errors import InputError

WAITING_AT_A_GATE: Final = 3
"""The exit status of ``ask --approve`` while the goal waits at its gate (as ``plans run``)."""

if TYPE_CHECKING:
    from stratagem.protocol import AskGoalRequest
    from stratagem.runtime.config._settings import Settings
    from stratagem.runtime.operator._ask import WIDE, ask_request, steps_blocks, steps_table

__all__: list[str] = []

lazy_scope(globals())


def _inputs(pairs: list[str]) -> dict[str, Any]:
    """``NAME=VALUE`` pairs as slot values (a value that reads as JSON is that value)."""
    found: dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise InputError(f"--input {pair!r}: expected NAME=VALUE, e.g. --input city=Seattle")
        try:
            found[name] = json.loads(value)
        except ValueError:
            found[name] = value
    return found


def run_ask(
    request: AskGoalRequest, settings: Settings, *, as_json: bool, timeout: float | None
) -> None:
    """Send ``request`` to the orchestrator and print the answer (exit 1 unless every step
    succeeded, or it was plan-only)."""
    held = request.approve and not request.plan_only
    if held:  # the goal waits for the approval, not the command: it runs on, detached
        request = request.model_copy(update={"detach": True})
    with _errors():
        answer = _operate(settings, lambda op: op.ask(request, timeout=timeout), timeout=timeout)
    if held and answer.status not in ("succeeded", "failed"):
        if as_json:
            _print_json(answer.model_dump(mode="json"))
        else:
            console.print(
                f"goal {answer.plan_id} {answer.status}: its steps with side effects wait at "
                f"gate 'approve'\n"
                f'  stratagem approve {answer.plan_id} approve --rationale "..."\n'
                f"  stratagem plans watch {answer.plan_id}\n"
                f"  stratagem plans show {answer.plan_id}",
                highlight=False,
                soft_wrap=True,
            )
        raise typer.Exit(WAITING_AT_A_GATE)
    if as_json:
        _print_json(answer.model_dump(mode="json"))
    else:
        console.rule(f"[bold]goal {answer.plan_id}: {answer.status}")
        console.print(steps_table(answer) if console.width >= WIDE else steps_blocks(answer))
        console.print(answer.summary, highlight=False, markup=False)
        if answer.revisions > 1:
            console.print(
                f"replanned: revision {answer.revisions} (stratagem plans revisions "
                f"{answer.plan_id})",
                highlight=False,
            )
    if answer.done is not None:  # the definition of done decides, when the goal gave one
        if not answer.done:
            raise typer.Exit(1)
    elif answer.status not in ("succeeded", "planned"):
        raise typer.Exit(1)


@app.command()
def ask(
    goal: Annotated[str, typer.Argument(help="What to do, in plain words.")],
    inputs: Annotated[
        list[str] | None,
        typer.Option("--input", help="A slot's value, NAME=VALUE (repeatable)."),
    ] = None,
    plan_only: Annotated[
        bool,
        typer.Option("--plan-only", help="Print the plan it would run (the DAG); run nothing."),
    ] = False,
    approve: Annotated[
        bool,
        typer.Option(
            "--approve",
            help="Hold the steps that have side effects at a gate until approved: the goal "
            "runs on, the command prints how to approve it ('stratagem approve PLAN approve "
            "--rationale ...') and exits 3.",
        ),
    ] = False,
    plan_id: Annotated[
        str | None, typer.Option("--plan-id", help="The orchestrator's plan id.")
    ] = None,
    deadline: Annotated[
        float | None,
        typer.Option(
            "--deadline",
            help="The goal's own time limit in seconds: no step starts after it (its plan's "
            "wall-time budget), whoever waits for it.",
        ),
    ] = None,
    done: Annotated[
        list[str] | None,
        typer.Option(
            "--done",
            help="The definition of done: a step (id, Capability or agent.Capability) that must "
            "succeed (repeatable); the exit status follows it.",
        ),
    ] = None,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Pursue a goal in plain words across the deployment's agents: the orchestrator matches
    each clause to a capability by its intents, binds the slots, runs the plan, replans around a
    step that cannot succeed, and prints what was done and what was not.

    Exit 0 when every step succeeded (or with --plan-only; with --done: when the steps it names
    did), 1 when some did not, 2 when the goal was refused (nothing ran), 3 when it waits at its
    gate (--approve).

    Examples:

      stratagem ask "check the weather in Seattle and set a timer for 10 minutes"

      stratagem ask --plan-only "find my next meeting and set a timer for it"

      stratagem ask --json "what is the weather like in Paris" | jq -r .summary
    """
    with _errors():
        settings = _settings(address, state_dir)
        request = ask_request(
            goal,
            inputs=_inputs(inputs or []) or None,
            plan_only=plan_only or None,
            approve=approve or None,
            plan_id=plan_id,
            deadline_s=deadline,
            done_when=done or None,
        )
    run_ask(request, settings, as_json=as_json, timeout=timeout)
