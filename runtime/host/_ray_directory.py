"""Ray's directory of a deployment's agents: the ``Directory`` (``operator._operator``) an
``Operator`` falls back to when the agents' published endpoints do not suffice. It lives here, with
Ray, because the operator's package may not import Ray; the operator loads it by name
(``operator._operator.RAY_DIRECTORY``) only when it is needed.
"""

from __future__ import annotations

import contextlib

from stratagem.runtime.config._settings import Settings

__all__ = ["RayDirectory"]


class RayDirectory:
    """The endpoints Ray's directory knows: this process joins Ray on first use (blocking the event
    loop while it connects: Ray's driver belongs on the calling thread, and the published endpoints
    make this path the exception on one machine).

    Args:
        settings: The deployment's settings (its address, namespace and state directory).
        embedded: Start an embedded Ray with agents of its own (refused where a deployment runs:
            see ``Deployment.embedded``); they stop at ``aclose``. Otherwise no deployment is
            ``LaunchError``, which names ``--embedded`` when ``embedded_hint``.
        timeout_s: How long agents are given to answer Ray's ``info`` (a stopped agent is then
            listed without an endpoint).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        embedded: bool = False,
        embedded_hint: bool = False,
        timeout_s: float = 10.0,
    ) -> None:
        self._settings = settings
        self._embedded = embedded
        self._embedded_hint = embedded_hint
        self._timeout_s = timeout_s
        self._found: dict[str, str] | None = None
        self._stack = contextlib.ExitStack()

    async def endpoints(self) -> dict[str, str]:
        if self._found is None:
            # Ray is imported here only: a caller the published endpoints serve never loads it.
            from stratagem.runtime.host._launcher import Deployment

            deployment = Deployment(self._settings)
            if self._embedded:
                self._stack.enter_context(deployment.embedded())
            else:
                deployment.connect(allow_embedded=False, embedded_hint=self._embedded_hint)
                self._stack.callback(deployment.disconnect)
            self._found = {
                info.role: info.endpoint
                for info in deployment.status(timeout_s=self._timeout_s)
                if info.health != "not deployed"
            }
        return self._found

    async def aclose(self) -> None:
        self._found = None
        self._stack.close()
