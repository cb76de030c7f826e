"""DAG algorithms over steps: layers, cycles and the structural checks the engine relies on.

The functions take any objects with an ``id`` and a ``depends_on`` list (steps, in practice). Edges
point from a step to the steps it depends on; every algorithm here is iterative, so a long chain
cannot exhaust the recursion limit, and linear in steps plus edges.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator, Sequence
from typing import Protocol

from stratagem.planning._errors import PlanValidationError

__all__ = ["find_cycle", "structural_problems", "topological_layers"]


class _Node(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def depends_on(self) -> Sequence[str]: ...


def find_cycle(steps: Sequence[_Node]) -> list[str] | None:
    """The first dependency cycle found, or ``None`` when the steps form a DAG.

    Dependencies on unknown steps are ignored. The search starts from the steps in plan order, so
    the answer is deterministic.

    Args:
        steps: The steps.

    Returns:
        The cycle as ids where each depends on the next, closed by its first id, e.g.
        ``["a", "b", "c", "a"]`` (``a`` depends on ``b``, ``b`` on ``c``, ``c`` on ``a``); a step
        that depends on itself gives ``["a", "a"]``.
    """
    deps: dict[str, Sequence[str]] = {}
    for step in steps:
        deps.setdefault(step.id, step.depends_on)
    on_path, done = 1, 2
    state: dict[str, int] = {}
    for root in deps:
        if root in state:
            continue
        state[root] = on_path
        path = [root]
        stack: list[Iterator[str]] = [iter(deps[root])]
        while stack:
            for dep in stack[-1]:
                if dep not in deps:
                    continue
                seen = state.get(dep)
                if seen == on_path:
                    return [*path[path.index(dep) :], dep]
                if seen is None:
                    state[dep] = on_path
                    path.append(dep)
                    stack.append(iter(deps[dep]))
                    break
            else:
                state[path.pop()] = done
                stack.pop()
    return None


def structural_problems(steps: Sequence[_Node]) -> list[str]:
    """What keeps ``steps`` from being a DAG: duplicate ids, unknown dependencies, a cycle.

    Args:
        steps: The steps.

    Returns:
        One sentence per problem, in plan order (empty when the steps form a DAG).
    """
    problems: list[str] = []
    counts = Counter(step.id for step in steps)
    reported: set[str] = set()
    for step in steps:
        if counts[step.id] > 1 and step.id not in reported:
            reported.add(step.id)
            problems.append(f"duplicate step id {step.id!r} ({counts[step.id]} steps)")
    for step in steps:
        for dep in dict.fromkeys(step.depends_on):
            if dep not in counts:
                problems.append(f"step {step.id!r} depends on unknown step {dep!r}")
    cycle = find_cycle(steps)
    if cycle is not None:
        problems.append("cycle: " + " -> ".join(cycle))
    return problems


def topological_layers(steps: Sequence[_Node]) -> list[list[str]]:
    """Group step ids into layers: each step's dependencies all sit in earlier layers.

    A step's layer is one more than the deepest of its dependencies (0 without any); within a
    layer, ids keep plan order.

    Args:
        steps: The steps.

    Returns:
        The layers, first to last.

    Raises:
        PlanValidationError: When the steps have duplicate ids, unknown dependencies or a cycle.
    """
    problems = structural_problems(steps)
    if problems:
        raise PlanValidationError(problems)
    waiting = {step.id: len(set(step.depends_on)) for step in steps}
    dependents: dict[str, list[str]] = {step.id: [] for step in steps}
    for step in steps:
        for dep in set(step.depends_on):
            dependents[dep].append(step.id)
    depth = dict.fromkeys(waiting, 0)
    queue = deque(step_id for step_id, count in waiting.items() if count == 0)
    while queue:
        step_id = queue.popleft()
        for dependent in dependents[step_id]:
            depth[dependent] = max(depth[dependent], depth[step_id] + 1)
            waiting[dependent] -= 1
            if waiting[dependent] == 0:
                queue.append(dependent)
    layers: list[list[str]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for step in steps:
        layers[depth[step.id]].append(step.id)
    return layers
