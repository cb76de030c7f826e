"""What the store checks before it writes: names, scopes, digests and media types.

A media type is checked against the bytes for the types whose bytes can be recognised (images by
their magic numbers, PDF, ZIP, gzip, JSON by parsing, text by decoding UTF-8); a type the store
cannot recognise is only checked for its syntax. The bytes of a recognised binary format declared
as text are refused too: a PNG saved as ``text/plain`` would be rendered as text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Final

from stratagem.planning._artifacts._errors import ArtifactInputError
from stratagem.planning._artifacts._types import ARTIFACT_SCOPES, ArtifactScope

__all__ = [
    "ARTIFACT_NAME_PATTERN",
    "SNIFFED_BYTES",
    "check_digest",
    "check_media_type",
    "check_name",
    "check_scope",
    "needs_whole",
    "sniff",
]

ARTIFACT_NAME_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$"
_NAME = re.compile(ARTIFACT_NAME_PATTERN)
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_MEDIA_TYPE = re.compile(
    r"^[a-z0-9][a-z0-9!#$&^_.+-]{0,63}/[a-z0-9][a-z0-9!#$&^_.+-]{0,127}"
    r"(?:\s*;\s*[a-z0-9_.-]+=[A-Za-z0-9_.\"-]+)*$"
)
_SCOPE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,199}$")

# Magic numbers of the binary formats the store recognises.
_MAGIC: Final[dict[str, tuple[bytes, ...]]] = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
    "image/webp": (b"RIFF",),
    "application/pdf": (b"%PDF-",),
    "application/zip": (b"PK\x03\x04", b"PK\x05\x06"),
    "application/gzip": (b"\x1f\x8b",),
}


def check_name(name: str, field: str = "name") -> str:
    """``name`` when it is a valid artifact name, else ``ArtifactInputError`` naming ``field``."""
    if not isinstance(name, str) or not name:
        raise ArtifactInputError(field, "must be a non-empty string")
    if "/" in name or "\\" in name:
        raise ArtifactInputError(field, f"{name[:80]!r} must not contain a slash")
    if ".." in name:
        raise ArtifactInputError(field, f"{name[:80]!r} must not contain '..'")
    if not _NAME.match(name):
        raise ArtifactInputError(
            field,
            f"{name[:80]!r} must be 1-200 letters, digits, '.', '_' or '-', starting with a "
            "letter or digit",
        )
    return name


def check_scope(scope: str, scope_id: str) -> ArtifactScope:
    """The scope when ``scope`` and ``scope_id`` fit together, else ``ArtifactInputError``."""
    checked = next((s for s in ARTIFACT_SCOPES if s == scope), None)
    if checked is None:
        raise ArtifactInputError("scope", f"{scope!r} is not one of {', '.join(ARTIFACT_SCOPES)}")
    if scope == "deployment":
        if scope_id:
            raise ArtifactInputError("scope_id", "must be empty for the deployment scope")
    elif not isinstance(scope_id, str) or not _SCOPE_ID.match(scope_id) or ".." in scope_id:
        raise ArtifactInputError(
            "scope_id", f"{str(scope_id)[:80]!r} is not a {scope} id (letters, digits, ._:@-)"
        )
    return checked


def check_digest(digest: str, field: str = "digest") -> str:
    """``digest`` (lower-case hex SHA-256, an optional ``sha256:`` prefix dropped)."""
    value = digest.removeprefix("sha256:") if isinstance(digest, str) else ""
    if not _DIGEST.match(value):
        raise ArtifactInputError(field, f"{str(digest)[:80]!r} is not a SHA-256 hex digest")
    return value


def _is_text(data: bytes) -> bool:
    if b"\x00" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _is_json(data: bytes) -> bool:
    try:
        json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False
    return True


def sniff(data: bytes) -> str | None:
    """The binary format ``data`` starts with, when the store recognises one."""
    for media_type, magics in _MAGIC.items():
        if any(data.startswith(m) for m in magics):
            if media_type == "image/webp" and data[8:12] != b"WEBP":
                continue
            return media_type
    return None


def _matches(base: str, data: bytes) -> bool | None:
    """Whether ``data`` is of type ``base`` (``None``: the store cannot tell)."""
    if base in _MAGIC:
        return sniff(data) == base
    checks: dict[str, Callable[[bytes], bool]] = {"application/json": _is_json}
    if base in checks:
        return checks[base](data)
    if base.endswith("+json"):
        return _is_json(data)
    if base.startswith("text/") or base.endswith("+xml") or base == "application/xml":
        return _is_text(data) and sniff(data) is None
    return None


SNIFFED_BYTES: Final = 64
"""How much of the start of the bytes the magic numbers need."""


def needs_whole(media_type: str) -> bool:
    """Whether checking ``media_type`` against the bytes needs them all (text and JSON are
    checked by decoding or parsing; binary formats by their first ``SNIFFED_BYTES``)."""
    base = media_type.split(";", 1)[0].strip().lower()
    return base not in _MAGIC and _matches(base, b"") is not None


def check_media_type(media_type: str, data: bytes) -> str:
    """``media_type`` (lower-cased) when it is well formed and the bytes do not contradict it.

    Raises:
        ArtifactInputError: (field ``media_type``) a malformed type, or bytes that are not what
            it says.
    """
    if not isinstance(media_type, str):
        raise ArtifactInputError("media_type", "must be a string such as 'text/plain'")
    value = media_type.strip().lower()
    if not _MEDIA_TYPE.match(value):
        raise ArtifactInputError(
            "media_type", f"{media_type[:80]!r} is not a media type such as 'text/plain'"
        )
    base = value.split(";", 1)[0].strip()
    if _matches(base, data) is False:
        found = sniff(data)
        what = f"the bytes are {found}" if found else "the bytes do not match it"
        raise ArtifactInputError("media_type", f"{base!r} does not fit the data: {what}")
    return value
