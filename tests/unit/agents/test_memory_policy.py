"""Memory under the policy: ``[[memory]]`` rules (deny by default) and the audit of each write."""

from __future__ import annotations

import hashlib

import pytest

from stratagem.agents import InMemoryMemoryStore, MemoryDeniedError, MemoryInputError
from stratagem.agents._memory import PolicedMemory
from stratagem.protocol import InMemoryAuditLog, Policy, ProtocolUsageError

RULES = """
[[allow]]
caller = "operator"
target = "*"
capabilities = ["*"]

[[memory]]
caller = "*"
namespaces = ["agent/{caller}"]
access = ["read", "write"]

[[memory]]
caller = "tactical"
namespaces = ["goal/*", "user/ana"]
access = ["read"]
"""


def test_memory_rules_grant_by_prefix_and_deny_by_default() -> None:
    policy = Policy.from_toml(RULES)
    assert policy.allows_memory("tactical", ("agent", "tactical"), "write")
    assert policy.allows_memory("tactical", ("agent", "tactical", "notes"), "read")
    assert not policy.allows_memory("tactical", ("agent", "perception"), "read")
    assert not policy.allows_memory("tactical", ("agent",), "read")  # would show every agent's
    assert policy.allows_memory("tactical", ("goal", "g1"), "read")
    assert not policy.allows_memory("tactical", ("goal", "g1"), "write")
    assert policy.allows_memory("tactical", ("user", "ana", "x"), "read")
    assert not policy.allows_memory("tactical", ("user", "anabel"), "read")
    assert not policy.allows_memory("strategic", ("goal", "g1"), "read")
    calls_only = Policy.from_toml('[[allow]]\ncaller = "a"\ntarget = "*"\ncapabilities = ["*"]')
    assert not calls_only.allows_memory("a", ("agent", "a"), "read")
    assert not Policy().allows_memory("operator", ("user", "ana"), "read")


def test_default_policy_gives_the_operator_everything_and_agents_nothing() -> None:
    policy = Policy.default()
    assert policy.allows_memory("operator", ("user", "ana"), "write")
    assert not policy.allows_memory("perception", ("agent", "perception"), "write")
    assert not policy.allows_memory("perception", ("agent", "perception"), "read")
    assert not policy.allows_memory("perception", ("user", "ana"), "read")


@pytest.mark.parametrize(
    ("rule", "where"),
    [
        ('caller = "a"\nnamespaces = ["user/a b"]\naccess = ["read"]', "memory[0].namespaces"),
        ('caller = "a"\nnamespaces = []\naccess = ["read"]', "memory[0].namespaces"),
        ('caller = "a"\nnamespaces = ["x"]\naccess = ["delete"]', "memory[0].access[0]"),
        ('caller = "a"\nnamespaces = ["x"]', "memory[0].access"),
        ('caller = "a"\nnamespaces = ["x"]\naccess = ["read"]\nkeys = ["k"]', "memory[0].keys"),
    ],
)
def test_a_bad_memory_rule_is_one_line_naming_it(rule: str, where: str) -> None:
    with pytest.raises(ProtocolUsageError) as caught:
        Policy.from_toml(f"[[memory]]\n{rule}\n")
    assert f": {where}: " in str(caught.value)
    assert "\n" not in str(caught.value)


async def test_a_refused_call_writes_nothing_and_is_audited() -> None:
    store = InMemoryMemoryStore()
    audit = InMemoryAuditLog()
    memory = PolicedMemory(store, Policy.from_toml(RULES), "tactical", audit)
    with pytest.raises(MemoryDeniedError) as caught:
        await memory.put(("user", "ana"), "k", {"x": 1})
    assert str(caught.value).startswith("namespace: 'tactical' may not write memory namespace")
    assert "\n" not in str(caught.value)
    assert await store.list(("user",)) == []
    with pytest.raises(MemoryDeniedError):
        await memory.search(("agent",), "x")
    denied = [r for r in audit.records() if r.action == "memory.denied"]
    assert [(r.actor, r.target, r.code) for r in denied] == [
        ("tactical", "user/ana", "PERMISSION_DENIED"),
        ("tactical", "agent", "PERMISSION_DENIED"),
    ]


async def test_each_write_is_audited_with_a_digest_never_the_value() -> None:
    store = InMemoryMemoryStore()
    audit = InMemoryAuditLog()
    memory = PolicedMemory(store, Policy.from_toml(RULES), "tactical", audit)
    await memory.put(("agent", "tactical"), "plan", {"secret_sauce": "pears"}, ttl_s=60)
    assert (await memory.get(("agent", "tactical"), "plan")) is not None
    assert [i.key for i in await memory.search(("agent", "tactical"), "pears")] == ["plan"]
    assert await memory.delete(("agent", "tactical"), "plan") is True
    records = list(audit.records())
    assert [(r.action, r.actor, r.target, r.capability, r.code) for r in records] == [
        ("memory.put", "tactical", "agent/tactical", "plan", "OK"),
        ("memory.delete", "tactical", "agent/tactical", "plan", "OK"),
    ]
    value_json = '{"secret_sauce":"pears"}'
    assert records[0].digest == hashlib.sha256(value_json.encode()).hexdigest()
    assert all("pears" not in r.detail for r in records)
    assert "ttl_s=60" in records[0].detail


async def test_bad_input_is_refused_before_the_policy_and_the_audit() -> None:
    audit = InMemoryAuditLog()
    memory = PolicedMemory(InMemoryMemoryStore(), Policy.from_toml(RULES), "tactical", audit)
    with pytest.raises(MemoryInputError, match=r"^key: must be a string"):
        await memory.put(("agent", "tactical"), 5, 1)  # type: ignore[arg-type]
    with pytest.raises(MemoryInputError, match=r"^ttl_s: must be positive"):
        await memory.put(("agent", "tactical"), "k", 1, ttl_s=-1)
    with pytest.raises(MemoryInputError, match=r"^value: is \d+ bytes"):
        await memory.put(("agent", "tactical"), "k", "x" * 70_000)
    assert list(audit.records()) == []
    assert await memory.list(("agent", "tactical")) == []
