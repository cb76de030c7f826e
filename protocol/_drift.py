"""Drift between the pydantic wire models and the protobuf messages.

``schema_drift`` compares a model with a message descriptor (field names, repeated-ness, scalar
kinds, nested message types, int ranges); the unit tests assert it finds nothing for every model,
and ``register_capability`` runs it on an extension's own messages. It runs at registration and in
tests, never on a call: it lives apart from the codec.
"""

from __future__ import annotations

import types
from collections.abc import Collection, Iterable, Sequence
from enum import Enum
from typing import Annotated, Any, Final, Literal, Union, get_args, get_origin

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from pydantic import BaseModel
from pydantic.fields import FieldInfo

__all__ = ["schema_drift"]

_INT_RANGES: Final[dict[int, tuple[int, int]]] = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
_SCALAR_KINDS: Final[dict[int, type]] = {
    FieldDescriptor.TYPE_STRING: str,
    FieldDescriptor.TYPE_BYTES: bytes,
    FieldDescriptor.TYPE_BOOL: bool,
    FieldDescriptor.TYPE_DOUBLE: float,
    FieldDescriptor.TYPE_FLOAT: float,
    **dict.fromkeys(_INT_RANGES, int),
}


def _unwrap(annotation: Any) -> tuple[Any, list[Any]]:
    """Strip ``Annotated`` and ``X | None``; returns the bare type and the stripped metadata."""
    metadata: list[Any] = []
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation, *extra = get_args(annotation)
            metadata.extend(extra)
        elif origin in (Union, types.UnionType):
            members = [arg for arg in get_args(annotation) if arg is not type(None)]
            if len(members) != 1:
                return annotation, metadata
            annotation = members[0]
        else:
            return annotation, metadata


def _kind(annotation: Any) -> Any:
    """The Python kind a scalar annotation carries on the wire (``Literal['a']`` -> ``str``)."""
    if get_origin(annotation) is Literal:
        kinds = {type(value) for value in get_args(annotation)}
        return kinds.pop() if len(kinds) == 1 else annotation
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        for base in (str, int):
            if issubclass(annotation, base):
                return base
    return annotation


def _int_bounds(metadata: Iterable[Any]) -> tuple[int | None, int | None]:
    """The inclusive integer range that ``Ge``/``Gt``/``Le``/``Lt`` constraints allow."""
    lows: list[int] = []
    highs: list[int] = []
    for item in metadata:
        if isinstance(item, FieldInfo):
            low, high = _int_bounds(item.metadata)
            lows.extend([low] if low is not None else [])
            highs.extend([high] if high is not None else [])
            continue
        if (ge := getattr(item, "ge", None)) is not None:
            lows.append(int(ge))
        if (gt := getattr(item, "gt", None)) is not None:
            lows.append(int(gt) + 1)
        if (le := getattr(item, "le", None)) is not None:
            highs.append(int(le))
        if (lt := getattr(item, "lt", None)) is not None:
            highs.append(int(lt) - 1)
    return (max(lows) if lows else None, min(highs) if highs else None)


def _field_drift(
    where: str, info: FieldInfo, field: FieldDescriptor, problems: list[str], seen: set[Any]
) -> None:
    annotation, metadata = _unwrap(info.annotation)
    metadata = [*info.metadata, *metadata]
    repeated = get_origin(annotation) in (list, tuple, Sequence)
    if repeated:
        element, element_metadata = _unwrap(get_args(annotation)[0])
        metadata = element_metadata
    else:
        element = annotation
    if repeated != field.is_repeated:
        side = "the proto" if field.is_repeated else "the model"
        problems.append(f"{where}: repeated only in {side}")
        return
    if field.message_type is not None:
        if not (isinstance(element, type) and issubclass(element, BaseModel)):
            problems.append(
                f"{where}: a {field.message_type.name} message in the proto, "
                f"{element!r} on the model"
            )
        elif element.__name__ != field.message_type.name:
            problems.append(
                f"{where}: nested type {element.__name__} on the model, "
                f"{field.message_type.name} in the proto"
            )
        else:
            _drift(element, field.message_type, (), problems, seen)
        return
    expected = _SCALAR_KINDS.get(field.type)
    actual = _kind(element)
    if expected is None:
        problems.append(f"{where}: proto field type {field.type} is not supported by the codec")
    elif actual is not expected:
        problems.append(f"{where}: {expected.__name__} in the proto, {actual!r} on the model")
    elif expected is int:
        lowest, highest = _INT_RANGES[field.type]
        low, high = _int_bounds(metadata)
        if low is None or high is None or low < lowest or high > highest:
            problems.append(f"{where}: int not bounded to the proto's range [{lowest}, {highest}]")


def _drift(
    model: type[BaseModel],
    descriptor: Descriptor,
    ignore: Collection[str],
    problems: list[str],
    seen: set[Any],
) -> None:
    if (model, descriptor.full_name) in seen:
        return
    seen.add((model, descriptor.full_name))
    where = f"{model.__name__} / {descriptor.full_name}"
    proto = {field.name: field for field in descriptor.fields if field.containing_oneof is None}
    fields = {name: info for name, info in model.model_fields.items() if name not in ignore}
    problems.extend(
        f"{where}: {name!r} only on the model" for name in sorted(fields.keys() - proto.keys())
    )
    problems.extend(
        f"{where}: {name!r} only in the proto" for name in sorted(proto.keys() - fields.keys())
    )
    for name in sorted(fields.keys() & proto.keys()):
        _field_drift(f"{where}.{name}", fields[name], proto[name], problems, seen)


def schema_drift(
    model: type[BaseModel], descriptor: Descriptor, *, ignore: Collection[str] = ()
) -> list[str]:
    """Every difference between a pydantic model and a protobuf message, recursively.

    Compares field names, repeated-ness, scalar kinds (``Literal`` and ``Enum`` count as their
    values' type), nested message types (by name) and, for integer
    fields, that the model's bounds keep every value within the proto's range. ``oneof`` members are
    skipped: the envelope carries them.

    Args:
        model: The pydantic model.
        descriptor: The message descriptor, e.g. ``agent_pb2.Beat.DESCRIPTOR``.
        ignore: Model fields that have no proto field on purpose (``capability``, ``body``).

    Returns:
        One line per difference; empty when the two match.
    """
    problems: list[str] = []
    _drift(model, descriptor, ignore, problems, set())
    return problems
