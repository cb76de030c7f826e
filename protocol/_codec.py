"""Generic conversion between the pydantic wire models and the protobuf messages.

The conversion walks the protobuf message descriptors, never a list of fields written by hand:
scalars and repeated scalars are copied, nested and repeated messages recurse, and the envelope's
``oneof body`` is chosen from the capability registry. A capability added by an extension travels
as the JSON of its own pydantic model inside ``ExtensionBody``.

Encoding builds each message in one constructor call from the model's ``model_dump`` (both run in
compiled code); when that fails (a value the message cannot hold, a model that drifted), the
field-by-field walk runs instead and names the field at fault. Decoding reads each message through
a plan compiled once per message type (which fields are scalars, lists or nested messages) into
plain data, validated by one pydantic ``model_validate``.

Decoding always ends in pydantic validation, so every constraint declared on a capability model is
enforced on the wire; a validation failure becomes an ``InvalidArgumentError`` whose violations name
the offending fields by path (``beat.goals[0].predicate``), relative to the capability's body.

``protocol._drift.schema_drift`` tells when a model and its message differ.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final, Literal, TypeVar

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from pydantic import BaseModel, ValidationError

from stratagem.protocol._capabilities import (
    CAPABILITIES,
    EXTENSION_FIELD,
    CapabilitySpec,
    WireModel,
)
from stratagem.protocol._errors import (
    FailedPreconditionError,
    FieldViolation,
    InvalidArgumentError,
    ProtocolUsageError,
)
from stratagem.protocol._gen.stratagem.v1 import agent_pb2 as pb
from stratagem.protocol._models import Envelope, RequestEnvelope, ResponseEnvelope

__all__ = [
    "MAX_JSON_DEPTH",
    "decode",
    "decode_request",
    "decode_response",
    "encode",
    "encode_answer",
    "encode_call",
    "encode_request",
    "encode_response",
    "field_path",
    "from_message",
    "json_object",
    "json_value",
    "to_message",
    "violations_from",
]


MAX_JSON_DEPTH: Final = 64
"""The deepest nesting of arrays and objects accepted in a JSON payload (a plan, a gate output)."""


def json_object(text: str, what: str) -> dict[str, Any]:
    """The JSON object ``text`` holds, or :class:`InvalidArgumentError` naming ``what``.

    Deep nesting (past :data:`MAX_JSON_DEPTH`) and integers longer than Python converts are refused
    with a reason, like any other malformed payload, never an internal error.
    """
    raw = json_value(text, what)
    if not isinstance(raw, dict):
        raise InvalidArgumentError(f"{what} must be a JSON object")
    return raw


def json_value(text: str, what: str) -> Any:
    """The JSON value ``text`` holds (any: an object, a list, a string, a number, ...), or
    :class:`InvalidArgumentError` naming ``what``, refused as ``json_object`` refuses."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgumentError(f"{what} is not valid JSON: {exc.msg}") from None
    except RecursionError:
        raise InvalidArgumentError(
            f"{what} is nested deeper than {MAX_JSON_DEPTH} levels"
        ) from None
    except ValueError as exc:  # an integer past Python's digit limit
        reason = (str(exc).splitlines() or ["a value cannot be read"])[0]
        raise InvalidArgumentError(f"{what} holds a value that cannot be read: {reason}") from None
    stack: list[tuple[Any, int]] = [(raw, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise InvalidArgumentError(f"{what} is nested deeper than {MAX_JSON_DEPTH} levels")
            stack.extend(
                (child, depth + 1) for child in (item.values() if isinstance(item, dict) else item)
            )
    return raw


M = TypeVar("M", bound=Message)
T = TypeVar("T", bound=BaseModel)


# The built-in capabilities by their ``oneof body`` field. ``register_capability`` only adds
# capabilities carried in ``extension``, so this table is fixed once the module is imported.
_BUILTIN_BY_FIELD: Final[dict[str, CapabilitySpec]] = {
    spec.field: spec for spec in CAPABILITIES.values() if spec.field != EXTENSION_FIELD
}


# --- validation errors --------------------------------------------------------------------------


def field_path(loc: Sequence[int | str]) -> str:
    """A pydantic error location as a path: ``("beat", "goals", 0, "x")`` -> ``beat.goals[0].x``."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path = f"{path}.{part}" if path else part
    return path


def violations_from(exc: ValidationError, *, root: str = "") -> tuple[FieldViolation, ...]:
    """The field violations of a pydantic ``ValidationError``, one per error.

    Args:
        exc: The validation error.
        root: The field named by an error about the value as a whole (an empty location).

    Returns:
        One ``FieldViolation`` per error, its field a dotted path with ``[i]`` for list items.
    """
    return tuple(
        FieldViolation(field=field_path(error["loc"]) or root, description=error["msg"])
        for error in exc.errors(include_url=False, include_input=False)
    )


def _invalid(summary: str, exc: ValidationError, *, root: str = "") -> InvalidArgumentError:
    return InvalidArgumentError(summary, violations=violations_from(exc, root=root))


# --- the generic walk ---------------------------------------------------------------------------


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _fill(message: Message, model: BaseModel, path: str) -> None:
    """Copy ``model`` into ``message`` by descriptor; ``oneof`` members are left to the caller."""
    for field in message.DESCRIPTOR.fields:
        if field.containing_oneof is not None:
            continue
        where = _join(path, field.name)
        try:
            value = getattr(model, field.name)
        except AttributeError:
            raise ProtocolUsageError(
                f"cannot encode {where}: {type(model).__name__} has no field {field.name!r}"
            ) from None
        if value is None:
            continue
        if field.message_type is not None:
            if field.is_repeated:
                items = getattr(message, field.name)
                for index, item in enumerate(value):
                    _fill(items.add(), item, f"{where}[{index}]")
            else:
                nested = getattr(message, field.name)
                nested.SetInParent()  # present even when every nested field has its default
                _fill(nested, value, where)
            continue
        try:
            if field.is_repeated:
                getattr(message, field.name).extend(value)
            else:
                setattr(message, field.name, value)
        except (TypeError, ValueError) as exc:
            raise ProtocolUsageError(f"cannot encode {where}: {exc}") from exc


# How ``_plain`` reads a field: its kind, compiled once per message type from the descriptor.
_SCALAR: Final = 0
_SCALARS: Final = 1
_MESSAGE: Final = 2
_MESSAGES: Final = 3
_Plan = tuple[tuple[str, int], ...]
_PLANS: dict[str, _Plan] = {}


# Typed Any: a message's DESCRIPTOR is the python or the upb descriptor class, depending on stubs.
def _plan(descriptor: Any) -> _Plan:
    """Every field outside a ``oneof``, by name, with its kind (see ``_SCALAR``...)."""
    plan = _PLANS.get(descriptor.full_name)
    if plan is None:
        plan = tuple(
            (
                field.name,
                (_MESSAGES if field.is_repeated else _MESSAGE)
                if field.message_type is not None
                else (_SCALARS if field.is_repeated else _SCALAR),
            )
            for field in descriptor.fields
            if field.containing_oneof is None
        )
        _PLANS[descriptor.full_name] = plan
    return plan


def _plain(message: Message) -> dict[str, Any]:
    """The message as plain data keyed by field name; unset singular messages are left out."""
    data: dict[str, Any] = {}
    for name, kind in _plan(message.DESCRIPTOR):
        value = getattr(message, name)
        if kind == _SCALAR:
            data[name] = value
        elif kind == _SCALARS:
            data[name] = list(value)
        elif kind == _MESSAGES:
            data[name] = [_plain(item) for item in value]
        elif message.HasField(name):
            data[name] = _plain(value)
    return data


def _dumped(model: BaseModel, descriptor: Any) -> dict[str, Any] | None:
    """The constructor arguments of ``descriptor``'s message for ``model``; ``None`` when the
    model lacks one of its fields (the generic walk then says which)."""
    data = model.model_dump(warnings=False)
    kwargs: dict[str, Any] = {}
    for name, _ in _plan(descriptor):
        if name not in data:
            return None
        value = data[name]
        if value is not None:
            kwargs[name] = value
    return kwargs


def _build(message_type: type[M], kwargs: dict[str, Any] | None) -> M | None:
    """``message_type(**kwargs)``, or ``None`` when a value does not fit (see ``_fill``)."""
    if kwargs is None:
        return None
    try:
        return message_type(**kwargs)
    except (TypeError, ValueError):
        return None


def to_message(model: BaseModel, message_type: type[M]) -> M:
    """Convert a pydantic model to the protobuf message of the same shape.

    Args:
        model: The model; its fields must match the message's (see ``_drift.schema_drift``).
        message_type: The generated message class.

    Returns:
        A new message holding the model's values.

    Raises:
        ProtocolUsageError: When a value cannot be represented (a drifted model, a lone surrogate).
    """
    message = _build(message_type, _dumped(model, message_type.DESCRIPTOR))
    if message is None:
        message = message_type()
        _fill(message, model, "")
    return message


def from_message(message: Message, model_type: type[T]) -> T:
    """Convert a protobuf message to a pydantic model, validating every constraint of the model.

    Args:
        message: The message.
        model_type: The pydantic model of the same shape.

    Returns:
        The validated model.

    Raises:
        InvalidArgumentError: When a value breaks a constraint; one violation per field.
    """
    try:
        return model_type.model_validate(_plain(message))
    except ValidationError as exc:
        raise _invalid(f"invalid {model_type.__name__}", exc) from None


def _parse(message_type: type[M], data: bytes) -> M:
    message = message_type()
    try:
        message.ParseFromString(data)
    except (DecodeError, ValueError) as exc:
        raise InvalidArgumentError(
            f"cannot parse the bytes as a {message_type.DESCRIPTOR.full_name} message"
        ) from exc
    return message


# --- envelopes ----------------------------------------------------------------------------------


def _put_body(
    envelope: pb.AgentRequest | pb.AgentResponse, capability: str, body: WireModel
) -> None:
    spec = CAPABILITIES.get(capability)
    if spec is None:
        raise ProtocolUsageError(f"unknown capability {capability!r}")
    if spec.field == EXTENSION_FIELD:
        extension = pb.ExtensionBody(capability=spec.name, version=spec.version)
        if spec.wire == "struct":
            json_format.ParseDict(body.model_dump(mode="json"), extension.payload_struct)
        elif spec.messages is not None:
            message_type = spec.messages[0 if isinstance(envelope, pb.AgentRequest) else 1]
            extension.payload_message.Pack(to_message(body, message_type))
        else:
            extension.payload_json = body.model_dump_json().encode()
        envelope.extension.CopyFrom(extension)
        return
    nested = getattr(envelope, spec.field)
    nested.SetInParent()
    _fill(nested, body, "")


def _take_body(
    envelope: pb.AgentRequest | pb.AgentResponse, side: Literal["request", "response"]
) -> tuple[str, WireModel]:
    which = envelope.WhichOneof("body")
    if which is None:
        raise InvalidArgumentError(
            f"the {side} carries no body",
            violations=(FieldViolation("body", "no capability body is set"),),
        )
    if which == EXTENSION_FIELD:
        extension = envelope.extension
        spec = CAPABILITIES.get(extension.capability)
        if spec is None or spec.field != EXTENSION_FIELD:
            raise InvalidArgumentError(
                f"unknown extension capability {extension.capability!r}",
                violations=(
                    FieldViolation("extension.capability", "not a registered extension capability"),
                ),
            )
        if extension.version != spec.version:
            raise FailedPreconditionError(
                f"{spec.name} version {extension.version!r} was sent; "
                f"this side speaks version {spec.version!r}"
            )
        return spec.name, _extension_value(spec, extension, side)
    spec = _BUILTIN_BY_FIELD[which]
    model = spec.request if side == "request" else spec.response
    try:
        return spec.name, model.model_validate(_plain(getattr(envelope, which)))
    except ValidationError as exc:
        raise _invalid(f"invalid {spec.name} {side}", exc) from None


def _extension_value(
    spec: CapabilitySpec, extension: pb.ExtensionBody, side: Literal["request", "response"]
) -> WireModel:
    """An extension capability's value, in the form it came (``ExtensionBody.payload``), validated
    by its model: JSON always, a Struct or a packed message when the capability declares it."""
    model = spec.request if side == "request" else spec.response
    form = extension.WhichOneof("payload") or "payload_json"
    if form == "payload_json":
        try:
            return model.model_validate_json(extension.payload_json)
        except ValidationError as exc:
            raise _invalid(f"invalid {spec.name} {side}", exc, root="payload_json") from None
    declared = {"struct": "payload_struct", "message": "payload_message"}.get(spec.wire)
    if form != declared:
        raise InvalidArgumentError(
            f"{spec.name} {side}: sent as {form}; it travels as {spec.wire} (or payload_json)",
            violations=(FieldViolation(f"extension.{form}", f"{spec.name} is {spec.wire}"),),
        )
    if form == "payload_struct":
        try:
            return model.model_validate(json_format.MessageToDict(extension.payload_struct))
        except ValidationError as exc:
            raise _invalid(f"invalid {spec.name} {side}", exc, root="payload_struct") from None
    assert spec.messages is not None  # register_capability keeps wire and messages together
    message_type = spec.messages[0 if side == "request" else 1]
    packed = extension.payload_message
    expected = message_type.DESCRIPTOR.full_name
    if packed.TypeName() != expected:
        raise InvalidArgumentError(
            f"{spec.name} {side}: the payload is a {packed.TypeName()[:128]!r}, not {expected!r}",
            violations=(
                FieldViolation("extension.payload_message.type_url", f"must name {expected}"),
            ),
        )
    message = message_type()
    if not packed.Unpack(message):
        raise InvalidArgumentError(
            f"{spec.name} {side}: the payload does not parse as {expected}",
            violations=(FieldViolation("extension.payload_message", "unparseable"),),
        )
    try:
        return model.model_validate(_plain(message))
    except ValidationError as exc:
        raise _invalid(f"invalid {spec.name} {side}", exc, root="payload_message") from None


E = TypeVar("E", bound=Envelope)


def _encode_envelope(
    envelope: Envelope, message_type: type[pb.AgentRequest | pb.AgentResponse]
) -> bytes:
    names = [name for name, _ in _plan(message_type.DESCRIPTOR)]
    if all(hasattr(envelope, name) for name in names):
        fields = {name: getattr(envelope, name) for name in names}
        data = _encode_fields(message_type, fields, envelope.capability, envelope.body)
        if data is not None:
            return data
    message = message_type()
    _fill(message, envelope, "")
    _put_body(message, envelope.capability, envelope.body)
    return message.SerializeToString()


def _encode_fields(
    message_type: type[pb.AgentRequest | pb.AgentResponse],
    fields: dict[str, Any],
    capability: str,
    body: WireModel,
) -> bytes | None:
    """An envelope's bytes in one constructor call; ``None`` when the generic walk must run."""
    spec = CAPABILITIES.get(capability)
    if spec is None or spec.field == EXTENSION_FIELD:
        return None
    dumped = _dumped(body, message_type.DESCRIPTOR.fields_by_name[spec.field].message_type)
    message = _build(message_type, None if dumped is None else {**fields, spec.field: dumped})
    return None if message is None else message.SerializeToString()


def _decode_envelope(
    data: bytes, message_type: type[pb.AgentRequest | pb.AgentResponse], model: type[E]
) -> E:
    message = _parse(message_type, data)
    capability, body = _take_body(message, model._side)
    try:
        return model.model_validate({**_plain(message), "capability": capability, "body": body})
    except ValidationError as exc:
        raise _invalid(f"invalid {model._side} envelope", exc) from None


def encode_call(
    spec: CapabilitySpec,
    *,
    request_id: str,
    caller: str,
    target: str,
    plan_id: str,
    step_id: str,
    body: WireModel,
    delegation: Sequence[str] = (),
) -> bytes:
    """``encode_request`` of an envelope with these fields, for values already known to be valid.

    ``AgentClient`` checks the ids (and the body's model) itself, so the envelope model is never
    built; the bytes are the same.

    Raises:
        ProtocolUsageError: When the body cannot be represented on the wire.
    """
    fields = {
        "request_id": request_id,
        "caller": caller,
        "target": target,
        "plan_id": plan_id,
        "step_id": step_id,
        "delegation": list(delegation),
    }
    data = _encode_fields(pb.AgentRequest, fields, spec.name, body)
    if data is not None:
        return data
    return encode_request(
        RequestEnvelope.model_construct(
            capability=spec.name,
            body=body,
            request_id=request_id,
            caller=caller,
            target=target,
            plan_id=plan_id,
            step_id=step_id,
            delegation=list(delegation),
        )
    )


def encode_answer(spec: CapabilitySpec, request_id: str, responder: str, body: WireModel) -> bytes:
    """``encode_response`` of a ``ResponseEnvelope``, without validating the envelope again.

    For a server answering a validated request with the model its backend built.

    Raises:
        ProtocolUsageError: When ``body`` is not ``spec``'s response model, or cannot be
            represented on the wire.
    """
    if not isinstance(body, spec.response):
        raise ProtocolUsageError(
            f"a {spec.name} response is a {spec.response.__name__}, not a {type(body).__name__}"
        )
    fields = {"request_id": request_id, "responder": responder, "plan_id": ""}
    data = _encode_fields(pb.AgentResponse, fields, spec.name, body)
    if data is not None:
        return data
    return encode_response(
        ResponseEnvelope.model_construct(
            capability=spec.name, body=body, request_id=request_id, responder=responder
        )
    )


def encode_request(envelope: RequestEnvelope) -> bytes:
    """Serialize a request envelope to ``stratagem.v1.AgentRequest`` bytes.

    Raises:
        ProtocolUsageError: When the body cannot be represented on the wire.
    """
    return _encode_envelope(envelope, pb.AgentRequest)


def decode_request(data: bytes) -> RequestEnvelope:
    """Parse and validate ``stratagem.v1.AgentRequest`` bytes.

    Raises:
        InvalidArgumentError: Unparseable bytes, no body, an unknown extension, or a field that
            breaks its constraint (violations name the fields, relative to the body).
        FailedPreconditionError: An extension capability sent with another schema version.
    """
    return _decode_envelope(data, pb.AgentRequest, RequestEnvelope)


def encode_response(envelope: ResponseEnvelope) -> bytes:
    """Serialize a response envelope to ``stratagem.v1.AgentResponse`` bytes.

    Raises:
        ProtocolUsageError: When the body cannot be represented on the wire.
    """
    return _encode_envelope(envelope, pb.AgentResponse)


def decode_response(data: bytes) -> ResponseEnvelope:
    """Parse and validate ``stratagem.v1.AgentResponse`` bytes.

    Raises:
        InvalidArgumentError: As for ``decode_request``.
        FailedPreconditionError: An extension capability answered with another schema version.
    """
    return _decode_envelope(data, pb.AgentResponse, ResponseEnvelope)


# --- any RPC's messages ---------------------------------------------------------------------------


def encode(model: BaseModel, message_type: type[Message]) -> bytes:
    """``model`` as ``message_type`` bytes: an envelope with its capability's body, any other model
    field for field (``to_message``).

    Raises:
        ProtocolUsageError: When a value cannot be represented on the wire.
    """
    if isinstance(model, Envelope):
        return _encode_envelope(model, message_type)  # type: ignore[arg-type]
    return to_message(model, message_type).SerializeToString()


def decode(data: bytes, message_type: type[Message], model_type: type[T]) -> T:
    """Parse ``message_type`` bytes and validate them as ``model_type`` (an envelope's body by its
    capability's model).

    Raises:
        InvalidArgumentError: Unparseable bytes, or a value that breaks a constraint (violations
            name the fields).
        FailedPreconditionError: An extension capability of another schema version.
    """
    if issubclass(model_type, Envelope):
        return _decode_envelope(data, message_type, model_type)  # type: ignore[arg-type]
    return from_message(_parse(message_type, data), model_type)
