"""The world model: merging, versioning, all-or-nothing actions, containment and neighbours."""

from __future__ import annotations

import pytest

from stratagem.agents import WorldModel
from stratagem.protocol import Action, Entity, FailedPreconditionError, Relation


def r(subject: str, predicate: str, obj: str) -> Relation:
    return Relation.model_validate({"subject": subject, "predicate": predicate, "object": obj})


def world() -> WorldModel:
    w = WorldModel()
    w.merge(
        [
            Entity(id="mira", name="Mira", kind="character"),
            Entity(id="hall", name="hall", kind="place"),
            Entity(id="vault", name="vault", kind="place"),
            Entity(id="chest", name="chest", kind="object"),
            Entity(id="key", name="key", kind="object"),
        ],
        [
            r("mira", "at", "hall"),
            r("hall", "connected", "vault"),
            r("vault", "locked", "vault"),
            r("key", "in", "chest"),
            r("chest", "in", "hall"),
            r("key", "opens", "vault"),
        ],
    )
    return w


MOVE = Action(
    name="move",
    args=["mira", "hall", "vault"],
    preconditions=[r("mira", "at", "hall"), r("hall", "connected", "vault")],
    adds=[r("mira", "at", "vault")],
    deletes=[r("mira", "at", "hall")],
)
TAKE = Action(
    name="take",
    args=["mira", "key", "chest"],
    preconditions=[r("mira", "at", "hall"), r("key", "in", "chest")],
    adds=[r("mira", "has", "key")],
    deletes=[r("key", "in", "chest")],
)
UNLOCK = Action(
    name="unlock",
    args=["mira", "hall", "vault", "key"],
    preconditions=[
        r("mira", "has", "key"),
        r("key", "opens", "vault"),
        r("vault", "locked", "vault"),
    ],
    deletes=[r("vault", "locked", "vault")],
)


def test_merge_bumps_the_version_once_and_only_on_change() -> None:
    w = world()
    assert w.version == 1
    assert w.merge([], [r("mira", "at", "hall")]) == 1
    assert w.merge([Entity(id="mira", name="Someone", kind="object")], []) == 1
    assert w.entities["mira"].kind == "character"  # the first mention wins
    assert w.merge([], [r("mira", "wants", "key")]) == 2


def test_a_newer_location_replaces_the_older_one() -> None:
    w = world()
    w.merge([], [r("mira", "at", "vault")])
    assert not w.holds(r("mira", "at", "hall"))
    assert w.holds(r("mira", "at", "vault"))
    w.merge([], [r("mira", "has", "key")])
    assert not w.holds(r("key", "in", "chest"))
    w.merge([], [r("key", "in", "hall")])
    assert not w.holds(r("mira", "has", "key"))


def test_apply_runs_actions_in_order_and_reports_the_net_change() -> None:
    w = world()
    added, removed = w.apply([TAKE, UNLOCK, MOVE])
    assert added == [r("mira", "has", "key"), r("mira", "at", "vault")]
    assert removed == [
        r("key", "in", "chest"),
        r("vault", "locked", "vault"),
        r("mira", "at", "hall"),
    ]
    assert w.version == 2
    assert w.holds(r("mira", "at", "vault"))


def test_a_failing_precondition_names_action_and_fact_and_changes_nothing() -> None:
    w = world()
    before = (w.facts(), w.version)
    bad = MOVE.model_copy(update={"preconditions": [r("mira", "at", "garden")]})
    with pytest.raises(FailedPreconditionError) as info:
        w.apply([TAKE, bad])
    assert info.value.message == (
        "action 2 move(mira, hall, vault): precondition at(mira, garden) does not hold"
    )
    assert (w.facts(), w.version) == before  # the take before it was not kept either


def test_entering_a_locked_place_is_refused() -> None:
    w = world()
    with pytest.raises(
        FailedPreconditionError, match=r"action 1 move\(mira, hall, vault\): vault is locked"
    ):
        w.apply([MOVE])
    assert w.holds(r("mira", "at", "hall"))


def test_dry_run_checks_without_changing() -> None:
    w = world()
    added, _ = w.apply([TAKE, UNLOCK, MOVE], dry_run=True)
    assert r("mira", "at", "vault") in added
    assert w.holds(r("mira", "at", "hall"))
    assert w.version == 1
    with pytest.raises(FailedPreconditionError):
        w.apply([MOVE], dry_run=True)


def test_locate_follows_containment_transitively() -> None:
    w = world()
    assert w.locate("key") == "hall"  # key in chest in hall
    assert w.locate("chest") == "hall"
    assert w.locate("mira") == "hall"
    assert w.locate("hall") == ""
    assert w.locate("nobody") == ""
    w.apply([TAKE])
    assert w.locate("key") == "hall"  # held by Mira, who is in the hall


def test_contains_and_neighbours() -> None:
    w = world()
    assert w.contains("hall") == ["mira", "chest"]
    assert w.contains("chest") == ["key"]
    assert w.neighbours("hall") == ["vault"]
    assert w.neighbours("vault") == ["hall"]  # connected works both ways
    assert w.neighbours("chest") == []


def test_facts_about_leave_out_parts_of_the_world_no_fact_links_to() -> None:
    world = WorldModel()
    world.merge(
        [],
        [
            Relation(subject="mira", predicate="at", object="courtyard"),
            Relation(subject="courtyard", predicate="connected", object="garden"),
            Relation(subject="key", predicate="in", object="garden"),
            Relation(subject="pip", predicate="at", object="cottage"),  # another story
            Relation(subject="cottage", predicate="connected", object="lane"),
        ],
    )
    mira = world.facts_about(["mira"])
    assert [(f.subject, f.object) for f in mira] == [
        ("mira", "courtyard"),
        ("courtyard", "garden"),
        ("key", "garden"),
    ]
    assert len(world.facts_about(["mira", "lane"])) == 5
    assert world.facts_about(["nobody"]) == []
    assert world.facts() == world.facts_about(["mira", "pip"])
