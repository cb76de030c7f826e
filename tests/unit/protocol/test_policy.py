"""The policy: deny by default, the shipped rules, wildcards and one-line load errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from stratagem.protocol import (
    CAPABILITIES,
    OPERATOR,
    READ_RPCS,
    Policy,
    PolicyRule,
    ProtocolUsageError,
)

DEFAULT = Policy.default()


@pytest.mark.parametrize(
    ("caller", "target", "capability"),
    [
        ("orchestrator", "perception", "ExtractEntities"),
        ("orchestrator", "perception", "FindSpatialContext"),
        ("orchestrator", "perception", "UpdateWorldState"),
        ("orchestrator", "strategic", "AnalyzeNarrative"),
        ("orchestrator", "strategic", "PlanNarrativeArc"),
        ("orchestrator", "tactical", "PlanExecutionSequence"),
        ("perception", "tactical", "Describe"),
        ("tactical", "orchestrator", "Describe"),
        (OPERATOR, "orchestrator", "SubmitGoal"),
        (OPERATOR, "perception", "UpdateWorldState"),
        (OPERATOR, "strategic", "Watch"),
        (OPERATOR, "tactical", "Plans"),
    ],
)
def test_the_default_policy_allows(caller: str, target: str, capability: str) -> None:
    assert DEFAULT.allows(caller, target, capability)


@pytest.mark.parametrize(
    ("caller", "target", "capability"),
    [
        ("perception", "strategic", "AnalyzeNarrative"),
        ("strategic", "tactical", "PlanExecutionSequence"),
        ("tactical", "perception", "UpdateWorldState"),
        ("orchestrator", "strategic", "ExtractEntities"),
        ("orchestrator", "orchestrator", "SubmitGoal"),
        ("perception", "orchestrator", "SubmitGoal"),
        ("orchestrator", "perception", "Watch"),
        ("strategic", "strategic", "Plans"),
        ("mallory", "perception", "ExtractEntities"),
        ("*", "perception", "ExtractEntities"),
        ("", "perception", "Describe"),
        (OPERATOR, "", "Describe"),
        (OPERATOR, "perception", ""),
    ],
)
def test_the_default_policy_denies(caller: str, target: str, capability: str) -> None:
    assert not DEFAULT.allows(caller, target, capability)


def test_every_builtin_capability_is_reachable_by_the_operator() -> None:
    for spec in CAPABILITIES.values():
        assert DEFAULT.allows(OPERATOR, spec.role, spec.name)
    for rpc in READ_RPCS:
        assert DEFAULT.allows(OPERATOR, "perception", rpc)


def test_an_empty_policy_denies_everything() -> None:
    assert not Policy().allows(OPERATOR, "perception", "ExtractEntities")
    assert not Policy.from_toml("version = 1").allows(OPERATOR, "perception", "Describe")


def test_wildcards_match_targets_and_capabilities_and_an_explicit_caller() -> None:
    policy = Policy.from_toml(
        """
        [[allow]]
        caller = "auditor"
        target = "*"
        capabilities = ["Plans", "Watch"]

        [[allow]]
        caller = "orchestrator"
        target = "perception"
        capabilities = ["*"]

        [[allow]]
        caller = "*"
        target = "strategic"
        capabilities = ["Describe"]
        """
    )
    assert policy.rules[0] == PolicyRule("auditor", "*", frozenset({"Plans", "Watch"}))
    assert policy.allows("auditor", "tactical", "Watch")
    assert not policy.allows("auditor", "tactical", "Describe")
    assert policy.allows("orchestrator", "perception", "Anything")
    assert not policy.allows("orchestrator", "tactical", "Anything")
    assert policy.allows("stranger", "strategic", "Describe")
    assert not policy.allows("stranger", "tactical", "Describe")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[[allow]\n", "TOML"),
        ('[[allow]]\ntarget = "a"\ncapabilities = ["X"]', "allow[0].caller: Field required"),
        ('[[allow]]\ncaller = "a"\ncapabilities = ["X"]', "allow[0].target: Field required"),
        (
            '[[allow]]\ncaller = "a"\ntarget = "b"\ncapabilities = []',
            "allow[0].capabilities: List should have at least 1 item",
        ),
        (
            '[[allow]]\ncaller = "a"\ntarget = "b"\ncapabilities = ["X"]\ncapability = "Y"',
            "allow[0].capability: Extra inputs are not permitted",
        ),
        ('[[allow]]\ncaller = "a b"\ntarget = "b"\ncapabilities = ["X"]', "allow[0].caller"),
        ('[[allow]]\ncaller = "a"\ntarget = "b"\ncapabilities = "X"', "allow[0].capabilities"),
        ("version = 2", "version: Input should be 1"),
        ('deny = ["everything"]', "deny: Extra inputs are not permitted"),
    ],
)
def test_an_invalid_policy_is_one_line_naming_the_problem(text: str, problem: str) -> None:
    with pytest.raises(ProtocolUsageError) as caught:
        Policy.from_toml(text, source="policy.toml")
    message = str(caught.value)
    assert message.startswith("invalid policy policy.toml: ")
    assert problem in message
    assert "\n" not in message


def test_load_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text('[[allow]]\ncaller = "a"\ntarget = "b"\ncapabilities = ["X"]\n')
    assert Policy.load(path).allows("a", "b", "X")
    path.write_text("[[allow]]\n")
    with pytest.raises(ProtocolUsageError, match=f"invalid policy {path}: allow"):
        Policy.load(path)


def test_load_names_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ProtocolUsageError, match=r"cannot read policy .*missing\.toml"):
        Policy.load(tmp_path / "missing.toml")
