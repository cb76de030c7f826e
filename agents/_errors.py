"""The agents package's own exceptions.

::

    AgentError                 base of the exceptions agents/ defines
    ├── AgentDefinitionError   an agent an extension defines is refused (.role, .reason); also a
    │                          ValueError, as caller misuse
    └── ExtensionError         an extension could not be imported or set up (.name)

Agents answer requests with the protocol's ``RemoteError`` subclasses (``NotFoundError``,
``FailedPreconditionError``, ...) and fail plan steps with planning's ``StepError`` subclasses
(``LogicError``, ...); those trees are not repeated here. Misusing a registry (a duplicate tool
name) raises ``ValueError``; asking for an unknown role raises ``ValueError`` too.
"""

from __future__ import annotations

__all__ = ["AgentDefinitionError", "AgentError", "ExtensionError"]


class AgentError(Exception):
    """Base of the exceptions defined by ``agents``."""


class AgentDefinitionError(AgentError, ValueError):
    """An agent an extension defines (``define_agent``) is refused; nothing of it was registered.

    Attributes:
        role: The role the definition names.
        reason: The problem, one line.
    """

    def __init__(self, role: str, reason: str) -> None:
        super().__init__(f"agent {role!r}: {reason}")
        self.role = role
        self.reason = reason


class ExtensionError(AgentError):
    """An extension could not be imported or set up.

    Attributes:
        name: The extension as it was named (``module``, ``module:function``, a file or an entry
            point).
    """

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"extension {name!r}: {reason}")
        self.name = name
        self.reason = reason
