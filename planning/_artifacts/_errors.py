"""The artifact store's exceptions.

::

    PlanningError
    └── ArtifactError              base of everything the artifact store raises
        ├── ArtifactInputError     the caller's bad input (.field): a name with ``..`` or ``/``,
        │   │                      a media type that is malformed or that the bytes contradict,
        │   │                      an unknown scope, a digest that is not SHA-256 hex
        │   └── ArtifactTooLargeError   the bytes exceed the store's limit (.size, .limit)
        ├── ArtifactNotFoundError  no artifact (or version, or digest) by that name (.what)
        ├── ArtifactCorruptError   a blob's bytes no longer hash to its digest, or it is missing
        │                          (.digest); never served
        └── ArtifactStorageError   the blob store or the index failed to write or read (a full
                                   disk, an unreachable server); nothing half written

Every message is one line that names the field or the artifact.
"""

from __future__ import annotations

from stratagem.planning._errors import PlanningError

__all__ = [
    "ArtifactCorruptError",
    "ArtifactError",
    "ArtifactInputError",
    "ArtifactNotFoundError",
    "ArtifactStorageError",
    "ArtifactTooLargeError",
]


class ArtifactError(PlanningError):
    """Base of every exception raised by the artifact store."""


class ArtifactInputError(ArtifactError):
    """The caller's input is refused before anything is written.

    Attributes:
        field: The input field at fault (``name``, ``media_type``, ``scope``, ``data``, ...).
        reason: Why, in a few words.
    """

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


class ArtifactTooLargeError(ArtifactInputError):
    """The bytes are bigger than the store's limit.

    Attributes:
        size: The size given, in bytes.
        limit: The store's limit, in bytes.
    """

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__("data", f"{size} bytes is over the limit of {limit} bytes")


class ArtifactNotFoundError(ArtifactError):
    """No artifact answers the lookup.

    Attributes:
        what: The artifact (``scope/scope_id/name@version``) or digest looked up.
    """

    def __init__(self, what: str) -> None:
        self.what = what
        super().__init__(f"no artifact {what}")


class ArtifactCorruptError(ArtifactError):
    """A blob is missing or its bytes no longer hash to its digest: it is never served.

    Attributes:
        digest: The digest the blob was stored under.
        location: Where the blob was read from.
    """

    def __init__(self, digest: str, location: str, reason: str) -> None:
        self.digest = digest
        self.location = location
        super().__init__(f"blob sha256:{digest} at {location} {reason}")


class ArtifactStorageError(ArtifactError):
    """The backend failed (a full disk, a lost connection); nothing was half written.

    Attributes:
        location: The store's location.
    """

    def __init__(self, message: str, location: str) -> None:
        self.location = location
        super().__init__(message)
