"""An agent's own storage checks (``runtime.host._health``): real files in a temporary folder."""

from __future__ import annotations

import shutil
import sqlite3
import threading
from pathlib import Path

from stratagem.runtime.config._settings import Settings
from stratagem.runtime.host._health import StoreWatch


def _watched(tmp_path: Path) -> tuple[StoreWatch, Path]:
    settings = Settings(state_dir=tmp_path / "state")
    settings.state_dir.mkdir()
    plans = settings.plans_path("strategic")
    sqlite3.connect(plans).close()
    return StoreWatch(settings, "strategic"), plans


def test_a_healthy_store_has_no_problem(tmp_path: Path) -> None:
    watch, _ = _watched(tmp_path)
    assert watch.problems(3) == []


def test_a_deleted_plan_store_is_named(tmp_path: Path) -> None:
    watch, plans = _watched(tmp_path)
    plans.unlink()
    assert watch.problems(3) == [
        f"plan store missing: {plans} was deleted after 3 plans were written"
    ]


def test_a_recreated_empty_plan_store_is_noticed(tmp_path: Path) -> None:
    watch, plans = _watched(tmp_path)
    keep = plans.with_suffix(".keep")
    plans.rename(keep)  # the old file's inode stays in use, so the new one gets another
    sqlite3.connect(plans).close()
    (problem,) = watch.problems(2)
    assert problem.startswith(f"plan store replaced: {plans} is not the file this agent opened")


def test_a_state_dir_that_cannot_be_written_is_named(tmp_path: Path) -> None:
    watch, _ = _watched(tmp_path)
    shutil.rmtree(tmp_path / "state")
    problems = watch.problems(0)
    assert problems[-1].startswith(f"state dir not writable: {tmp_path / 'state'} (")
    assert len(problems) == 2


def test_a_restart_on_a_recreated_empty_store_is_noticed_until_accepted(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path / "state")
    settings.state_dir.mkdir()
    plans = settings.plans_path("strategic")
    sqlite3.connect(plans).close()
    assert StoreWatch(settings, "strategic").problems(4) == []
    # The agent restarts on the same store: nothing to report.
    assert StoreWatch(settings, "strategic").problems(4) == []
    # The store is deleted and an empty one made in its place (as a restarted agent would).
    plans.unlink()
    sqlite3.connect(plans).close()
    (problem,) = StoreWatch(settings, "strategic").problems(0)
    marker = settings.state_dir / "strategic.plans.marker"
    assert problem == (
        f"plan store missing: {plans} was deleted after 4 plans were written "
        f"(this one is new and empty; delete {marker} to accept it)"
    )
    marker.unlink()
    assert StoreWatch(settings, "strategic").problems(0) == []


def test_a_restart_after_the_world_snapshot_was_deleted_is_noticed_until_accepted(
    tmp_path: Path,
) -> None:
    settings = Settings(state_dir=tmp_path / "state")
    settings.state_dir.mkdir()
    sqlite3.connect(settings.plans_path("perception")).close()
    world = settings.world_path("perception")
    marker = settings.state_dir / "perception.plans.marker"
    watch = StoreWatch(settings, "perception", world)
    assert watch.problems(0) == []
    # No world was saved yet: a restart without one is normal.
    assert StoreWatch(settings, "perception", world).problems(0) == []
    world.write_text('{"facts": []}')  # the agent saved its world
    assert watch.problems(0) == []  # and the marker now says so
    assert StoreWatch(settings, "perception", world).problems(0) == []
    world.unlink()
    (problem,) = StoreWatch(settings, "perception", world).problems(0)
    assert problem == (
        f"world snapshot missing: {world} was deleted after the agent saved its world (the "
        f"facts it held are lost; restore the file, or delete {marker} to accept an empty world)"
    )
    marker.unlink()
    assert StoreWatch(settings, "perception", world).problems(0) == []


def test_answers_of_a_lost_world_are_set_aside_and_named(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path / "state")
    settings.state_dir.mkdir()
    sqlite3.connect(settings.plans_path("perception")).close()
    world = settings.world_path("perception")
    world.write_text("{}")
    assert StoreWatch(settings, "perception", world).problems(0) == []
    world.unlink()
    answers = settings.answers_path("perception")
    answers.write_bytes(b"answers")
    answers.with_name(answers.name + "-wal").write_bytes(b"wal")
    watch = StoreWatch(settings, "perception", world)
    assert watch.world_lost
    watch.set_aside(answers)
    assert not answers.exists()
    moved = sorted(
        p.name for p in settings.state_dir.glob("perception.answers.sqlite3.lost-world-*")
    )
    assert len(moved) == 2  # the database and its WAL, under one name
    (problem,) = watch.problems(0)
    assert problem.endswith(f"; its stored answers were set aside to {moved[0]}")


def test_concurrent_probes_do_not_trip_over_each_other(tmp_path: Path) -> None:
    # Health is asked from threads (``info`` runs ``problems`` in one per request; several
    # agents may share a process and a state dir): each probe must use its own file, or one
    # probe deletes the file of another, which then reports the state dir as not writable.
    watch, _ = _watched(tmp_path)
    other = StoreWatch(Settings(state_dir=tmp_path / "state"), "tactical")
    found: list[str] = []

    def probe(watched: StoreWatch) -> None:
        for _ in range(200):
            found.extend(watched.problems(0))

    threads = [threading.Thread(target=probe, args=(watched,)) for watched in (watch, other) * 8]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert found == []
    assert [path.name for path in (tmp_path / "state").iterdir() if "probe" in path.name] == []
