"""Bounded reading of what an operator hands the CLI: files, ``--json`` payloads, deadlines.

Every limit here is a named constant, and every breach is one :class:`InputError` whose message
is one line, so the CLI answers bad input with one line and exit code 2 however hostile it is:
``/dev/zero`` or a FIFO (at most :data:`MAX_INPUT_BYTES` + 1 bytes are read), a binary or Latin-1
file, nesting deeper than :data:`MAX_INPUT_DEPTH`, more than :data:`MAX_INPUT_NODES` values
(YAML aliases expanding a small file into a huge tree count every expansion), an integer longer
than Python converts (4,300 digits), a deadline that is not a finite number of seconds in range.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import stat
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from stratagem.runtime.config._errors import InputError, PlanNotFoundError

if TYPE_CHECKING:
    from pydantic import ValidationError

__all__ = [
    "DEFAULT_HISTORY_PAGE",
    "MAX_INPUT_BYTES",
    "MAX_INPUT_DEPTH",
    "MAX_INPUT_NODES",
    "MAX_PLAN_STEPS",
    "MAX_TIMEOUT_S",
    "MIN_GOAL_TIMEOUT_S",
    "InputError",
    "PlanNotFoundError",
    "check_encoded_size",
    "check_goal_timeout",
    "check_plan_steps",
    "check_timeout",
    "parse_json_object",
    "parse_json_value",
    "parse_moment",
    "read_mapping",
    "unknown_name",
    "validation_line",
]

DEFAULT_HISTORY_PAGE: Final = 50
"""The plans one page of the history holds when the caller names no size."""
MAX_INPUT_BYTES: Final = 4 * 1024 * 1024
"""The largest goal or plan file (or ``--json`` payload) the CLI reads, in bytes."""
MAX_INPUT_DEPTH: Final = 64
"""The deepest nesting of lists and mappings accepted in a file or payload."""
MAX_INPUT_NODES: Final = 1_000_000
"""The most values (scalars, lists, mappings; alias expansions included) in a file or payload."""
MAX_PLAN_STEPS: Final = 5_000
"""The most steps in a plan the CLI sends (``plans run``, ``replan``); a plan past it is refused
before it is validated or sent, as is one whose JSON exceeds ``STRATAGEM_MAX_MESSAGE_BYTES``."""
MAX_TIMEOUT_S: Final = 7 * 24 * 3600.0
"""The longest ``--timeout`` accepted (a week)."""
MIN_TIMEOUT_S: Final = 0.001
"""The shortest ``--timeout`` accepted."""
MIN_GOAL_TIMEOUT_S: Final = 1.0
"""The shortest ``--timeout`` of a goal (``submit``, ``demo``). The command's deadline includes
finding the agents (connecting to Ray), which alone takes longer, so a shorter one could only
fail, after the seconds spent finding them; it is refused before anything starts."""


def check_goal_timeout(value: float | None) -> float | None:
    """``value`` when a goal could meet it (or ``None``), else :class:`InputError`."""
    if value is not None and value < MIN_GOAL_TIMEOUT_S:
        raise InputError(
            f"--timeout {value:g} s is too short for a goal: its deadline includes finding the "
            f"agents, which alone takes longer; give at least {MIN_GOAL_TIMEOUT_S:g}"
        )
    return value


def check_timeout(value: float | None) -> float | None:
    """``value`` when it is a finite deadline in range (or ``None``), else :class:`InputError`."""
    if value is None:
        return None
    if not math.isfinite(value) or not MIN_TIMEOUT_S <= value <= MAX_TIMEOUT_S:
        raise InputError(
            f"--timeout must be a number of seconds from {MIN_TIMEOUT_S:g} to "
            f"{MAX_TIMEOUT_S:g}, not {value!r}"
        )
    return value


def _read_bytes(path: Path) -> bytes:
    """At most ``MAX_INPUT_BYTES`` of ``path``; a FIFO with no writer reads as empty, not a hang."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise InputError(f"cannot read {path}: it is a directory")
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_INPUT_BYTES:
            chunk = os.read(fd, min(1 << 20, MAX_INPUT_BYTES + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from exc
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    if size > MAX_INPUT_BYTES:
        raise InputError(f"{path} is larger than the {MAX_INPUT_BYTES} bytes the CLI reads")
    return b"".join(chunks)


def _check_shape(value: Any, what: str) -> None:
    """Refuse nesting deeper than ``MAX_INPUT_DEPTH`` or more than ``MAX_INPUT_NODES`` values."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    nodes = 0
    while stack:
        item, depth = stack.pop()
        nodes += 1
        if nodes > MAX_INPUT_NODES:
            raise InputError(f"{what} holds more than {MAX_INPUT_NODES} values")
        if isinstance(item, dict | list):
            if depth > MAX_INPUT_DEPTH:
                raise InputError(f"{what} is nested deeper than {MAX_INPUT_DEPTH} levels")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def read_mapping(path: Path, holds: str) -> dict[str, Any]:
    """A bounded YAML (or JSON) file's top-level mapping; ``holds`` says what it should contain.

    Raises:
        InputError: The file cannot be read, is too large, is not UTF-8, is not YAML, is too deep
            or too big, or does not hold a mapping.
    """
    import yaml  # only here: the CLI starts without it

    data = _read_bytes(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputError(f"{path} is not valid YAML: {_first_line(exc)}") from exc
    except RecursionError as exc:
        raise InputError(f"{path} is nested deeper than {MAX_INPUT_DEPTH} levels") from exc
    except (ValueError, OverflowError) as exc:  # e.g. an integer past Python's digit limit
        raise InputError(f"{path} holds a value that cannot be read: {_first_line(exc)}") from exc
    _check_shape(raw, str(path))
    if not isinstance(raw, dict):
        raise InputError(f"{path} must hold a mapping with {holds}")
    return raw


def parse_json_object(text: str, option: str) -> dict[str, Any]:
    """The JSON object given as ``option`` (``--json``, ``--output``), bounded like a file.

    Raises:
        InputError: Too long, not JSON, too deep or too big, or not an object.
    """
    raw = parse_json_value(text, option)
    if not isinstance(raw, dict):
        raise InputError(f"{option} must be a JSON object")
    return raw


def parse_json_value(text: str, option: str) -> Any:
    """The JSON value given as ``option`` (``--value``: any JSON), bounded like a file.

    Raises:
        InputError: Too long, not JSON, too deep or too big.
    """
    if len(text) > MAX_INPUT_BYTES:
        raise InputError(f"{option} is longer than {MAX_INPUT_BYTES} characters")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{option} is not valid JSON: {exc.msg} at char {exc.pos}") from exc
    except RecursionError as exc:
        raise InputError(f"{option} is nested deeper than {MAX_INPUT_DEPTH} levels") from exc
    except ValueError as exc:  # an integer past Python's digit limit
        raise InputError(f"{option} holds a value that cannot be read: {_first_line(exc)}") from exc
    _check_shape(raw, option)
    return raw


def check_plan_steps(path: Path | str, raw: dict[str, Any]) -> None:
    """Refuse a plan with more than ``MAX_PLAN_STEPS`` steps before anything slow happens."""
    steps = raw.get("steps")
    if isinstance(steps, list) and len(steps) > MAX_PLAN_STEPS:
        raise InputError(
            f"plan in {path} has {len(steps)} steps; the CLI sends at most {MAX_PLAN_STEPS}"
        )


def check_encoded_size(path: Path | str, plan_json: str, max_message_bytes: int) -> None:
    """Refuse a plan whose JSON the agent would refuse as too large (it allows a little framing)."""
    size = len(plan_json.encode("utf-8"))
    if size + _FRAMING_BYTES > max_message_bytes:
        raise InputError(
            f"plan in {path} is {size} bytes as JSON; the agents accept requests up to "
            f"{max_message_bytes} bytes (STRATAGEM_MAX_MESSAGE_BYTES)"
        )


_FRAMING_BYTES: Final = 1024  # the request's envelope around the plan JSON


def unknown_name(what: str, name: str, valid: Iterable[str]) -> str:
    """One line for a name that is not one of ``valid``, listing them."""
    return f"unknown {what} {name!r}; valid: {', '.join(sorted(valid))}"


def validation_line(what: str, exc: ValidationError) -> str:
    """One line naming every problem pydantic found in ``what``."""
    problems = []
    for err in exc.errors():
        loc = ".".join(str(part) for part in err["loc"]) or what
        problems.append(f"{loc}: {err['msg']}")
    return f"invalid {what}: " + "; ".join(problems)


_AGE = re.compile(r"^(\d{1,9})([smhdw])$")
_AGE_SECONDS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_moment(text: str, option: str) -> datetime:
    """A time given on the command line: an ISO 8601 date or time (``2026-05-01``,
    ``2026-05-01T12:00``, with or without an offset; local time without one) or an age before
    now (``30m``, ``2h``, ``7d``).

    Raises:
        InputError: Naming ``option``, the value and the forms it takes.
    """
    value = text.strip()
    age = _AGE.match(value)
    if age is not None:
        seconds = int(age.group(1)) * _AGE_SECONDS[age.group(2)]
        return datetime.now(UTC) - timedelta(seconds=min(seconds, 100 * 365 * 86400))
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise InputError(
            f"{option} {text!r} is not a time: give an ISO date or time (2026-05-01, "
            "2026-05-01T12:00, 2026-05-01T12:00+02:00) or an age (30m, 2h, 7d)"
        ) from None
    return moment if moment.tzinfo is not None else moment.astimezone()
