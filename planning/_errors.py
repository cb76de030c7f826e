"""The planning package's exceptions, and how failures are classified.

::

    PlanningError                  base of everything planning/ raises
    ├── PlanValidationError        a plan breaks a rule (.problems: list[str]); caller input
    ├── RefError                   a {"$ref": ...} cannot be parsed or resolved (.ref, .reason)
    │   └── ExpressionError        an expression ({"$expr": ...}, when) cannot be parsed, checked
    │                              or evaluated (.expression, .reason)
    ├── PlanFailedError            a plan run ended failed (.plan_id, .failures)
    ├── PlanControlError           a control call (resume, decide, pause, cancel, replan,
    │                              replay) does not apply (.plan_id); caller input
    │   ├── GateDecisionError      a gate decision is refused: unknown or closed gate, wrong
    │   │   │                      revision (.gate_id, .revision)
    │   │   ├── GateDeciderError   who decides is not among the gate's deciders (.approver,
    │   │   │                      .deciders)
    │   │   └── GateValueError     the value (or a tool's edited arguments) does not fit what
    │   │                          the gate asks (.field, .reason)
    │   └── ForkError              a fork point or a substituted output does not fit the plan
    │                              (.field, .reason)
    ├── StoreError                 a state store failed to read or write; the run stops
    │   ├── StoreSchemaError       the store's schema is newer than this code, or a migration failed
    │   ├── StoreUnavailableError  the store's database cannot be opened, reached or locked
    │   └── StoreCorruptError      the store's database is damaged
    └── StepError                  raised by a tool to fail its step with a class (.failure_class)
        ├── TransientError         retried: the world may change by itself
        ├── LogicError             not retried: the same input gives the same answer
        └── PolicyError            not retried: a rule forbids it

The store errors are also ``protocol``'s storage errors: ``StoreError`` is a ``StorageError``,
``StoreSchemaError`` a ``StorageSchemaError`` (and so a ``ProtocolUsageError``),
``StoreUnavailableError`` a ``StorageUnavailableError`` and ``StoreCorruptError`` a
``StorageCorruptError``, so one ``except StorageError`` catches what any store raises.

``StepError`` and its subclasses are the signals tools raise; the engine never lets them escape a
run, it records a ``StepFailure`` instead. A protocol ``RemoteError`` out of a dispatcher is
classified by its status code with ``failure_class_for_code``; any other exception is a logic
failure. ``FAILURE_CODES`` is the one table of classes and codes; ``code_for_failure_class`` reads
it the other way, for the agents that report a failed run to their callers. A budget that runs
out and an open circuit breaker are not exceptions either: the engine records them as ``policy``
failures ("budget exhausted: ...", "circuit open for tool ...").
``PlanValidationError`` is also what ``Engine.replan`` raises for a new plan that is not a DAG.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar, Final

from pydantic import ValidationError

from stratagem.planning._plan import FailureClass
from stratagem.protocol import (
    Code,
    StorageCorruptError,
    StorageError,
    StorageSchemaError,
    StorageUnavailableError,
)
from stratagem.protocol._storage import StorageErrors

__all__ = [
    "FAILURE_CODES",
    "ForkError",
    "GateDeciderError",
    "GateDecisionError",
    "GateValueError",
    "LogicError",
    "PlanControlError",
    "PlanFailedError",
    "PlanValidationError",
    "PlanningError",
    "PolicyError",
    "RefError",
    "StepError",
    "StepFailure",
    "StoreCorruptError",
    "StoreError",
    "StoreSchemaError",
    "StoreUnavailableError",
    "TransientError",
    "code_for_failure_class",
    "failure_class_for_code",
]


class PlanningError(Exception):
    """Base of every exception raised by ``planning``."""


class PlanValidationError(PlanningError):
    """A plan breaks one or more rules.

    ``str()`` lists every problem, one per line.

    Attributes:
        problems: One sentence per problem, e.g. ``"step 'b' depends on unknown step 'x'"``.
    """

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class RefError(PlanningError):
    """A ``{"$ref": "STEP_ID.path"}`` reference cannot be parsed or resolved.

    Attributes:
        ref: The reference text, e.g. ``"extract.entities[*].id"``.
        step_id: The referenced step's id ("" when the text does not even name one).
        reason: Why it failed.
    """

    def __init__(self, ref: str, reason: str, *, step_id: str = "") -> None:
        self.ref = ref
        self.reason = reason
        self.step_id = step_id
        super().__init__(f"reference {ref!r}: {reason}")


class ExpressionError(RefError):
    """An expression (``{"$expr": ...}``, a step's ``when``) does not parse, fails its checks or
    cannot be evaluated.

    Attributes:
        expression: The expression as written.
        reason: Why it failed (one line).
    """

    def __init__(self, expression: str, reason: str, *, step_id: str = "") -> None:
        super().__init__(expression, reason, step_id=step_id)
        self.expression = expression
        self.args = (f"expression {expression!r}: {reason}",)

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True, slots=True)
class StepFailure:
    """A step's final failure.

    Attributes:
        step_id: The failed step.
        failure_class: The class of its last attempt's failure.
        message: A one-line description (never a traceback).
        attempts: How many attempts were made.
    """

    step_id: str
    failure_class: FailureClass
    message: str
    attempts: int


class PlanFailedError(PlanningError):
    """A plan run ended failed.

    Attributes:
        plan_id: The plan.
        failures: The steps that failed (not those skipped or cancelled because of them).
    """

    def __init__(self, plan_id: str, failures: Sequence[StepFailure]) -> None:
        self.plan_id = plan_id
        self.failures = list(failures)
        detail = "; ".join(
            f"step {f.step_id!r} ({f.failure_class.value}, {f.attempts} attempt(s)): {f.message}"
            for f in self.failures
        )
        super().__init__(f"plan {plan_id!r} failed: {detail or 'no step failed'}")


class PlanControlError(PlanningError):
    """A control call (``resume``, ``decide``, ``pause``, ``cancel``) does not apply to the plan.

    For example: the plan is unknown, already running, already stored, or the engine has no store.

    Attributes:
        plan_id: The plan.
    """

    def __init__(self, plan_id: str, message: str) -> None:
        self.plan_id = plan_id
        super().__init__(message)


class GateDecisionError(PlanControlError):
    """A gate decision is refused: unknown or already decided gate, or a wrong revision.

    Attributes:
        plan_id: The plan.
        gate_id: The gate (a gate step's id, or the id of the step a reconcile gate names).
        revision: The revision the decision was given for.
    """

    def __init__(self, plan_id: str, gate_id: str, revision: int, message: str) -> None:
        self.gate_id = gate_id
        self.revision = revision
        super().__init__(plan_id, message)


class GateDeciderError(GateDecisionError):
    """Who decides may not decide this gate: not among its deciders (or its policy's).

    Attributes:
        approver: Who tried to decide.
        deciders: Who may (identities, ``role:NAME``).
    """

    def __init__(
        self,
        plan_id: str,
        gate_id: str,
        revision: int,
        approver: str,
        deciders: Sequence[str],
    ) -> None:
        self.approver = approver
        self.deciders = tuple(deciders)
        named = ", ".join(deciders) or "no one"
        super().__init__(
            plan_id,
            gate_id,
            revision,
            f"{approver!r} may not decide gate {gate_id!r} of plan {plan_id!r} "
            f"(it is for: {named})",
        )


class GateValueError(GateDecisionError):
    """A decision's value (or a tool's edited arguments) does not fit what the gate asks.

    Attributes:
        field: The field that does not fit, e.g. ``value.amount`` or ``arguments.text``.
        reason: Why, in one line.
    """

    def __init__(self, plan_id: str, gate_id: str, revision: int, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(plan_id, gate_id, revision, f"gate {gate_id!r}: {field}: {reason}")


class ForkError(PlanControlError):
    """A fork of a plan does not fit it: no such fork point (step or revision), or a substituted
    output for a step that is not before the fork point.

    Attributes:
        field: What does not fit: ``at_step``, ``revision`` or ``set.<step>``.
        reason: Why, in one line.
    """

    def __init__(self, plan_id: str, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(plan_id, f"cannot fork plan {plan_id!r}: {field}: {reason}")


class StoreError(PlanningError, StorageError):
    """A state store could not read or write; a run that needs it stops.

    Also a ``protocol.StorageError``.

    Attributes:
        location: Where the store keeps its data (a path, or ``":memory:"``).
    """


class StoreSchemaError(StoreError, StorageSchemaError):
    """The store's schema is newer than this code knows, or a migration failed.

    Also a ``protocol.StorageSchemaError``.

    Attributes:
        location: The store's location.
        found: The schema version found in the store.
        known: The newest schema version this code knows.
    """


class StoreUnavailableError(StoreError, StorageUnavailableError):
    """The store's database cannot be opened or reached, or another writer held its lock past
    the wait. Also a ``protocol.StorageUnavailableError``."""


class StoreCorruptError(StoreError, StorageCorruptError):
    """The store's database is damaged. Also a ``protocol.StorageCorruptError``."""


STORE_ERRORS: Final = StorageErrors(
    error=StoreError,
    schema=StoreSchemaError,
    unavailable=StoreUnavailableError,
    corrupt=StoreCorruptError,
)
"""The classes the state stores raise, one per kind (``protocol``'s storage seam makes them)."""


class StepError(PlanningError):
    """Raised by a tool to fail its step with a given failure class.

    Raise a subclass (``TransientError``, ``LogicError``, ``PolicyError``) or pass the class.

    Attributes:
        message: A one-line description.
        failure_class: Decides whether the step is retried.
    """

    default_class: ClassVar[FailureClass] = FailureClass.LOGIC

    def __init__(self, message: str, failure_class: FailureClass | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.failure_class = failure_class if failure_class is not None else self.default_class


class TransientError(StepError):
    """A failure that may go away by itself; the step is retried."""

    default_class = FailureClass.TRANSIENT


class LogicError(StepError):
    """A failure that retrying the same input cannot fix; the step is not retried."""

    default_class = FailureClass.LOGIC


class PolicyError(StepError):
    """A rule forbids the step; it is not retried."""

    default_class = FailureClass.POLICY


FAILURE_CODES: Final[Mapping[FailureClass, tuple[Code, ...]]] = MappingProxyType(
    {
        FailureClass.LOGIC: (Code.FAILED_PRECONDITION,),
        FailureClass.POLICY: (Code.PERMISSION_DENIED, Code.UNAUTHENTICATED),
        FailureClass.TIMEOUT: (Code.DEADLINE_EXCEEDED,),
        FailureClass.TRANSIENT: (
            Code.UNAVAILABLE,
            Code.RESOURCE_EXHAUSTED,
            Code.ABORTED,
            Code.INTERNAL,
            Code.UNKNOWN,
        ),
        FailureClass.CANCELLED: (Code.CANCELLED,),
    }
)
"""The one table between failure classes and status codes, read in both directions.

A remote call that ended with a listed code failed with that code's class (a code not listed is a
``logic`` failure); a step failure of a class is reported to callers with the class's first code.
"""

_CLASS_OF_CODE: Final[Mapping[Code, FailureClass]] = {
    code: failure_class for failure_class, codes in FAILURE_CODES.items() for code in codes
}


def failure_class_for_code(code: Code) -> FailureClass:
    """The failure class of a remote call that ended with status ``code`` (``FAILURE_CODES``).

    Args:
        code: The status code.

    Returns:
        ``timeout`` for DEADLINE_EXCEEDED; ``transient`` for UNAVAILABLE, RESOURCE_EXHAUSTED,
        ABORTED, INTERNAL and UNKNOWN; ``policy`` for PERMISSION_DENIED and UNAUTHENTICATED;
        ``cancelled`` for CANCELLED; ``logic`` for every other code.
    """
    return _CLASS_OF_CODE.get(code, FailureClass.LOGIC)


def code_for_failure_class(failure_class: FailureClass) -> Code:
    """The status code a failure of ``failure_class`` is reported with (``FAILURE_CODES``).

    Returns:
        FAILED_PRECONDITION for ``logic``, PERMISSION_DENIED for ``policy``, DEADLINE_EXCEEDED for
        ``timeout``, UNAVAILABLE for ``transient``, CANCELLED for ``cancelled``.
    """
    return FAILURE_CODES[failure_class][0]


def field_problems(exc: ValidationError) -> list[str]:
    """One ``"field.path[0]: message"`` line per error of a pydantic ``ValidationError``."""
    problems = []
    for error in exc.errors(include_url=False):
        path = ""
        for part in error["loc"]:
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        problems.append(f"{path or '(request)'}: {error['msg']}")
    return problems
