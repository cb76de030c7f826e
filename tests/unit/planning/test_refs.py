"""References: parsing, resolution, and errors that name the step and path."""

from __future__ import annotations

from typing import Any

import pytest

from stratagem.planning import Ref, RefError, ref, refs_in, resolve_refs

OUTPUTS: dict[str, Any] = {
    "extract": {
        "entities": [
            {"id": "mira", "kind": "character"},
            {"id": "key", "kind": "object"},
        ],
        "count": 2,
    },
    "arc": {
        "beats": [
            {"id": "b0", "goals": [{"object": "door"}]},
            {"id": "b1", "goals": [{"object": "key"}, {"object": "gate"}]},
            {"id": "b2", "goals": []},
        ]
    },
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("extract", OUTPUTS["extract"]),
        ("extract.count", 2),
        ("extract.entities[*].id", ["mira", "key"]),
        ("arc.beats[1].id", "b1"),
        ("arc.beats[-1].id", "b2"),
        ("arc.beats[0:2]", OUTPUTS["arc"]["beats"][0:2]),
        ("arc.beats[1:]", OUTPUTS["arc"]["beats"][1:]),
        ("arc.beats[:1]", OUTPUTS["arc"]["beats"][:1]),
        ("arc.beats[*].goals[*].object", [["door"], ["key", "gate"], []]),
    ],
)
def test_resolve_paths(text: str, expected: Any) -> None:
    assert resolve_refs({"$ref": text}, OUTPUTS) == expected


def test_resolve_recurses_and_keeps_plain_values() -> None:
    value = {
        "ids": {"$ref": "extract.entities[*].id"},
        "nested": [{"first": {"$ref": "arc.beats[0].id"}}, 3, "text"],
        "plain": {"a": [1, 2]},
    }
    resolved = resolve_refs(value, OUTPUTS)
    assert resolved == {
        "ids": ["mira", "key"],
        "nested": [{"first": "b0"}, 3, "text"],
        "plain": {"a": [1, 2]},
    }
    assert resolved["plain"] is value["plain"]  # no copies of containers without references
    assert value["ids"] == {"$ref": "extract.entities[*].id"}  # the input is not mutated


def test_value_without_refs_is_returned_as_is() -> None:
    value = {"a": [1, {"b": 2}]}
    assert resolve_refs(value, OUTPUTS) is value


def test_refs_in_collects_step_ids() -> None:
    value = {"a": {"$ref": "extract.entities"}, "b": [{"$ref": "arc.beats[0]"}, {"$ref": "arc"}]}
    assert refs_in(value) == {"extract", "arc"}
    assert refs_in({"x": 1, "y": ["z"]}) == set()


def test_ref_parse() -> None:
    parsed = Ref.parse("extract.entities[*].id")
    assert (parsed.step_id, parsed.path) == ("extract", ".entities[*].id")
    assert ref("arc.beats[0:2]") == {"$ref": "arc.beats[0:2]"}


@pytest.mark.parametrize(
    "text", ["", "Extract.x", "extract..x", "extract.x[", "extract[a]", "a.b c"]
)
def test_bad_syntax_is_a_ref_error(text: str) -> None:
    with pytest.raises(RefError, match="expected STEP_ID"):
        Ref.parse(text)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("missing.x", "reference 'missing.x': that step has no output"),
        (
            "extract.entities[5].id",
            "reference 'extract.entities[5].id': index 5 is out of range for "
            "extract.entities (length 2)",
        ),
        (
            "extract.name",
            "reference 'extract.name': extract has no field 'name' (fields: count, entities)",
        ),
        (
            "extract.count[0]",
            "reference 'extract.count[0]': extract.count is a number, not a list",
        ),
        (
            "arc.beats[*].goals[0].object",
            "reference 'arc.beats[*].goals[0].object': index 0 is out of range for "
            "arc.beats[*].goals (length 0)",
        ),
        (
            "extract.entities.id",
            "reference 'extract.entities.id': extract.entities is a list, not an object",
        ),
    ],
)
def test_bad_paths_name_the_step_and_path(text: str, reason: str) -> None:
    with pytest.raises(RefError) as info:
        resolve_refs({"x": {"$ref": text}}, OUTPUTS)
    assert str(info.value) == reason
    assert info.value.ref == text
    assert info.value.step_id == text.split(".")[0]


def test_ref_object_with_other_keys_is_rejected() -> None:
    with pytest.raises(RefError, match="must have no other keys"):
        resolve_refs({"$ref": "extract", "also": 1}, OUTPUTS)
    with pytest.raises(RefError, match="must be a string"):
        refs_in({"$ref": 3})
