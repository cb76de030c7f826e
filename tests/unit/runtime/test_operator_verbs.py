"""The operator's verbs are declared once (``_operator.Verbs``) and ``Operator`` is composed of one
part per noun (``_compose``): a verb added to the table is on ``Operator`` and ``SyncOperator``
with its part's signature, each part is built with only the services its constructor names, and
the control verbs' table matches the protocol's actions and what the CLI registers."""

from __future__ import annotations

import asyncio
import inspect
import typing
from pathlib import Path

import pytest

from stratagem.protocol import CONTROL_ACTIONS
from stratagem.runtime.operator._compose import Parts, needs, verb, verbs
from stratagem.runtime.operator._control_verbs import CONTROL_VERBS
from stratagem.runtime.operator._link import Link
from stratagem.runtime.operator._operator import Operator, Verbs
from stratagem.runtime.operator._operator_sync import SyncOperator

OPERATOR_DIR = Path(__file__).resolve().parents[3] / "runtime" / "operator"
ENDPOINTS = {"perception": "127.0.0.1:9"}  # nothing listens there: no call is made


class Echo:
    """A toy noun: a part whose one verb answers without an agent."""

    def __init__(self, link: Link) -> None:
        self._link = link

    async def echo(self, text: str, *, times: int = 1) -> str:
        """Say ``text`` back ``times`` times, as the caller."""
        await asyncio.sleep(0)
        return f"{self._link.caller}: {' '.join([text] * times)}"


def _parameters(function: object) -> list[tuple[str, object, object, object]]:
    found = inspect.signature(function).parameters.values()  # type: ignore[arg-type]
    return [(p.name, p.kind, p.default, p.annotation) for p in found if p.name != "self"]


def test_a_verb_added_to_the_table_is_on_operator_and_sync_operator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Verbs, "echo", verb(Echo.echo), raising=False)

    async def run() -> str:
        async with Operator(endpoints=ENDPOINTS, caller="operator") as op:
            method = op.echo  # type: ignore[attr-defined]
            assert inspect.iscoroutinefunction(method)
            assert _parameters(method) == _parameters(Echo.echo)
            assert method.__doc__ == Echo.echo.__doc__
            answer: str = await method("hi", times=2)
            return answer

    assert asyncio.run(run()) == "operator: hi hi"
    with SyncOperator(endpoints=ENDPOINTS) as sync:
        method = sync.echo  # type: ignore[attr-defined]
        assert _parameters(method) == _parameters(Echo.echo)
        assert method("ho") == "operator: ho"  # run to its end: a value, not a coroutine
    assert "echo" in verbs(Operator)
    assert "echo" in verbs(SyncOperator)


def test_every_verb_is_on_both_classes_with_its_parts_signature() -> None:
    table = verbs(Verbs)
    assert len(table) > 20
    assert verbs(Operator) == verbs(SyncOperator) == table
    with SyncOperator(endpoints=ENDPOINTS) as sync:
        operator = sync._operator
        drifted = [
            name
            for name, declared in table.items()
            if not (
                _parameters(getattr(operator, name))
                == _parameters(getattr(sync, name))
                == _parameters(declared.method)
            )
        ]
    assert not drifted, f"a verb's parameters differ between its part and a class: {drifted}"
    # Nothing else of either class is a coroutine or a verb written by hand (watch: a stream,
    # aclose/close: the lifecycles).
    written = sorted(
        name
        for klass in (Operator, SyncOperator)
        for name, member in vars(klass).items()
        if not name.startswith("_")
        and (inspect.iscoroutinefunction(member) or inspect.isfunction(member))
    )
    assert written == ["aclose", "close", "watch"]


def test_each_part_is_built_on_first_use_with_only_what_it_names() -> None:
    async def run() -> list[str]:
        async with Operator(endpoints=ENDPOINTS) as op:
            await op.endpoints(["perception"])
            return [type(part).__name__ for part in op._parts.built()]

    # The worlds, plans and control parts are not built for a verb of the agents' part.
    assert asyncio.run(run()) == ["Link", "Agents"]
    parts = {v.part for v in verbs(Verbs).values()}
    for part in parts:
        assert part.__bases__ == (object,), f"{part.__name__} inherits: compose it instead"
        for name, kind in needs(part).items():
            assert kind is Link or kind in parts, f"{part.__name__}({name}: {kind.__name__})"


def test_a_part_that_takes_anything_but_a_service_is_refused() -> None:
    class Loose:
        def __init__(self, link: Link, retries: int) -> None:
            self.link, self.retries = link, retries

    with pytest.raises(TypeError, match=r"Loose takes services by their class only"):
        Parts().get(Loose)
    assert typing.get_type_hints(Loose.__init__)["retries"] is int


def test_the_control_verbs_are_the_protocols_actions_and_the_clis_commands() -> None:
    from stratagem.runtime._cli import app
    from stratagem.runtime._cli._app import plans_app

    assert tuple(CONTROL_VERBS) == CONTROL_ACTIONS
    assert set(CONTROL_ACTIONS) <= set(verbs(Verbs))
    for group in (app, plans_app):
        helps = {
            info.name: " ".join(inspect.cleandoc(info.help or info.callback.__doc__ or "").split())
            for info in group.registered_commands
            if info.name in CONTROL_VERBS and info.callback is not None
        }
        assert helps == {name: row.summary for name, row in CONTROL_VERBS.items()}


def test_every_operator_module_stays_well_under_800_lines() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in OPERATOR_DIR.glob("_*.py")}
    assert max(sizes.values()) <= 600, sizes


def test_a_verb_called_through_the_class_is_the_instances() -> None:
    async def run() -> dict[str, str]:
        async with Operator(endpoints=ENDPOINTS) as op:
            return await Operator.endpoints(op, ["perception"])

    assert asyncio.run(run()) == ENDPOINTS


class _Unresolved:
    def __init__(self, link: NotImportedAtRunTime) -> None:  # type: ignore[name-defined]  # noqa: F821
        self.link = link


def test_a_part_naming_a_service_it_does_not_import_is_one_clear_error() -> None:
    with pytest.raises(TypeError, match=r"_Unresolved names a service its module does not import"):
        needs(_Unresolved)
