"""A capability's JSON in A2A: ProtoJSON's lowerCamelCase field names out, both spellings in.

A2A 1.0 is ProtoJSON, whose field names are lowerCamelCase (``entityIds``), while a capability's
models name their fields in snake_case (``entity_ids``). A data part the agent answers with holds
the capability's response under ProtoJSON names (``to_proto_json``); a data part it is sent may
name a request's fields either way (``from_proto_json``). Only the models' own field names are
renamed: the keys of a free-form object (``dict[str, Any]``) are data, kept as they are, as
ProtoJSON keeps the keys of a ``Struct`` or a map.
"""

from __future__ import annotations

import types
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel

__all__ = ["NameClashError", "from_proto_json", "json_name", "to_proto_json"]


class NameClashError(ValueError):
    """An object names one field twice, in both spellings (``entity_ids`` and ``entityIds``).

    Attributes:
        field: The field's path (``entities.0.entity_id``).
        description: What is wrong with it.
    """

    def __init__(self, field: str, spellings: tuple[str, str]) -> None:
        self.field = field
        self.description = f"given twice, as {spellings[0]!r} and {spellings[1]!r}"
        super().__init__(f"{field}: {self.description}")


def json_name(field: str) -> str:
    """ProtoJSON's name of a field (as ``protoc`` derives ``json_name``): each underscore
    dropped and the letter after it upper-cased (``entity_ids`` -> ``entityIds``)."""
    out: list[str] = []
    upper = False
    for char in field:
        if char == "_":
            upper = True
        elif upper:
            out.append(char.upper())
            upper = False
        else:
            out.append(char)
    return "".join(out)


def to_proto_json(model: BaseModel) -> dict[str, Any]:
    """``model``'s JSON (``model_dump(mode="json")``) with its fields, and those of the models
    it holds, under their ProtoJSON names."""
    rendered = _render(model, model.model_dump(mode="json"))
    assert isinstance(rendered, dict)
    return rendered


def _render(value: object, dumped: Any) -> Any:
    """``dumped`` (the JSON of ``value``), renamed where ``value`` is a model."""
    if isinstance(value, BaseModel) and isinstance(dumped, dict):
        kind = type(value)
        own = kind.model_fields.keys() | kind.model_computed_fields.keys()
        return {
            (json_name(key) if key in own else key): _render(getattr(value, key, None), item)
            for key, item in dumped.items()
        }
    if isinstance(value, Mapping) and isinstance(dumped, dict):
        # A free-form object: its keys are data; the models among its values are still renamed.
        return {
            key: _render(original, item)
            for original, (key, item) in zip(value.values(), dumped.items(), strict=False)
        }
    if isinstance(value, (list, tuple, set, frozenset)) and isinstance(dumped, list):
        return [_render(original, item) for original, item in zip(value, dumped, strict=False)]
    return dumped


def from_proto_json(data: Mapping[str, Any], model: type[BaseModel]) -> dict[str, Any]:
    """``data`` (a request for ``model``) with the fields of ``model`` and of the models it
    holds named in snake_case, whichever spelling each was given in.

    Raises:
        NameClashError: An object names one field in both spellings.
    """
    accepted = _accept(data, model, "")
    assert isinstance(accepted, dict)
    return accepted


def _accept(value: Any, annotation: Any, path: str) -> Any:
    choices = _alternatives(annotation)
    if isinstance(value, Mapping):
        models = [c for c in choices if isinstance(c, type) and issubclass(c, BaseModel)]
        if models:
            return _accept_object(value, models, path)
        for choice in choices:
            if get_origin(choice) in (dict, Mapping) and len(get_args(choice)) == 2:
                inner = get_args(choice)[1]
                return {k: _accept(v, inner, _join(path, str(k))) for k, v in value.items()}
        return dict(value)
    if isinstance(value, list):
        for choice in choices:
            origin = get_origin(choice)
            if origin in (list, tuple, set, frozenset, Sequence):
                args = get_args(choice)
                if origin is tuple and Ellipsis not in args and len(args) == len(value):
                    elements = list(args)
                else:
                    elements = [args[0] if args else Any] * len(value)
                return [
                    _accept(item, element, _join(path, str(i)))
                    for i, (item, element) in enumerate(zip(value, elements, strict=False))
                ]
        return list(value)
    return value


def _accept_object(
    value: Mapping[str, Any], models: list[type[BaseModel]], path: str
) -> dict[str, Any]:
    """An object meant for one of ``models`` (a union's members), its field names made theirs."""
    fields: dict[str, tuple[str, Any]] = {}
    for model in models:
        for name, info in model.model_fields.items():
            fields.setdefault(name, (name, info.annotation))
            fields.setdefault(json_name(name), (name, info.annotation))
    out: dict[str, Any] = {}
    given: dict[str, str] = {}
    for key, item in value.items():
        name, annotation = fields.get(key, (key, Any))
        if name in out:
            raise NameClashError(_join(path, name), (given[name], key))
        given[name] = key
        out[name] = _accept(item, annotation, _join(path, name))
    return out


def _alternatives(annotation: Any) -> list[Any]:
    """The types an annotation allows: a union's members, ``Annotated``'s type, or itself."""
    if get_origin(annotation) is Annotated:
        return _alternatives(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        return [choice for arg in get_args(annotation) for choice in _alternatives(arg)]
    return [annotation]


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
