"""Launching Stratagem on Ray: embedded, on the local head ``stratagem up`` started, or a cluster.

Where the agents run is decided in this order:

1. ``--address`` / ``STRATAGEM_ADDRESS`` / ``RAY_ADDRESS``: a running Ray cluster;
2. the local Ray head that ``stratagem up`` started and recorded in the state directory (joined
   with its token; when that head is dead the command fails instead of starting another Ray on the
   deployment's state directory: ``stratagem down`` cleans up, ``stratagem up`` starts again);
3. otherwise, and only when asked (``embedded``: ``stratagem demo``, ``--embedded``), an embedded
   Ray started in this process with agents of its own, which live as long as the command.

A command never changes a deployment it did not start: against a running one it uses the agents
deployed (``serving_endpoints`` names an agent that is missing, and why, instead of deploying
it), and an embedded run removes only the agents it created.

See ``runtime.host._rayauth`` for why Ray is part of the trust boundary.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import socket
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import ray

from stratagem.protocol import ROLES, ClusterSecret, UnavailableError, load_or_create_key
from stratagem.runtime.config._errors import InputError
from stratagem.runtime.config._extensions import deployment_roles
from stratagem.runtime.config._restarts import gave_up_reason
from stratagem.runtime.config._security import cluster_secret, save_operator_key
from stratagem.runtime.config._settings import Settings, settings_digest
from stratagem.runtime.config._statedir import private_dir
from stratagem.runtime.host._actor import AgentActor
from stratagem.runtime.host._directory import (
    AgentInfo,
    actor_name,
    actor_record,
    dead_actor_record,
    death_cause,
)
from stratagem.runtime.host._local import LaunchError, LocalCluster
from stratagem.runtime.host._mcp import McpSetupError
from stratagem.runtime.host._models import resolve_model
from stratagem.runtime.host._rayauth import (
    RayAuth,
    is_loopback,
    join_local_head,
    probe_auth,
)
from stratagem.runtime.host._rayjoin import join_ray

__all__ = ["AgentStartError", "Deployment", "LaunchError", "LocalCluster", "placement_options"]

logger = logging.getLogger(__name__)

# Environment handed to agent actors so that every process exports telemetry the same way.
_FORWARDED_PREFIXES = ("OTEL_", "STRATAGEM_")
# Secrets reach the agents as constructor arguments, never in a runtime_env (which the dashboard
# and job records show).
_NOT_FORWARDED = frozenset({"STRATAGEM_MODEL_API_KEY"})


class AgentStartError(LaunchError):
    """An agent refused to start (its constructor failed: an MCP server whose tools do not
    load, say); ``deploy`` removed the agents it had created.

    Attributes:
        role: The agent's role.
    """

    def __init__(self, role: str, message: str) -> None:
        super().__init__(message)
        self.role = role


def _research_scopes(deployment: Deployment) -> dict[str, Any]:
    """Agents on this machine read research sources under the folder they were launched from,
    unless ``research_scopes`` names folders."""
    settings = deployment.settings
    if deployment.mode in ("embedded", "local") and not settings.research_scopes:
        return {"research_scopes": settings.research_roots}
    return {}


class Deployment:
    """The agents as named Ray actors: connect, deploy, inspect, remove.

    The agents are the four built-in ones, then those the settings' extensions define (see
    ``roles``); an extension that does not load fails the first use of ``roles`` (``deploy``,
    ``status``...), before anything is deployed.

    Use as a context manager for an embedded, short-lived deployment of this process's own::

        with Deployment(settings).embedded() as deployment:
            endpoint = deployment.endpoint("orchestrator")
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.mode: Literal["cluster", "local", "embedded"] | None = None
        # Whether ``connect`` joined Ray (``ray.init``): only then does ``disconnect`` leave it. A
        # process already in Ray (its own embedded Ray, a notebook's) keeps it.
        self._joined = False
        # Ray destroys a non-detached actor once no handle refers to it: keep the ones we create.
        self._handles: dict[str, Any] = {}
        self.stale: list[str] = []
        """Roles ``deploy`` found running with other settings than its own (left as they were)."""
        self.warnings: list[str] = []
        """Risks ``deploy`` was told to accept (an unauthenticated external Ray)."""
        self.replaced: list[str] = []
        """Roles ``deploy`` redeployed because they ran with another set of extensions."""
        self.removed: list[str] = []
        """Agents ``deploy`` removed: no extension of the new set defines their role."""

    # -- connection -----------------------------------------------------------------------------

    def connect(
        self,
        *,
        allow_embedded: bool = True,
        only_embedded: bool = False,
        embedded_hint: bool = False,
    ) -> None:
        """Connect this process to Ray (see the module docstring for the order of choices).

        Args:
            allow_embedded: Start an embedded Ray when no deployment is found (else
                ``LaunchError``).
            only_embedded: Start an embedded Ray, and refuse (``LaunchError``) when this state
                directory's local head runs or an address is named: agents of this process's own
                must not share the stores of a running deployment.
            embedded_hint: Name ``--embedded`` in the error when no deployment is found.
        """
        if ray.is_initialized():
            return
        address = self.settings.address
        mode: Literal["cluster", "local", "embedded"] = "cluster"
        if only_embedded:
            _refuse_embedded_beside(self.settings)
            mode = "embedded"
        elif address is None:
            local = LocalCluster.find(self.settings.local_cluster_file)
            if local is not None:
                address, mode = local.address, "local"
                local.check_listener()  # never hand this user's Ray token to a planted address
                try:
                    join_local_head(self.settings.ray_token_path)
                except OSError as exc:
                    raise LaunchError(
                        f"cannot read the local Ray head's token {self.settings.ray_token_path}"
                        f" ({exc.strerror or exc}): run 'stratagem down', then 'stratagem up'"
                    ) from exc
            elif not allow_embedded:
                raise LaunchError(
                    "no Stratagem deployment found: run 'stratagem up' or pass --address"
                    + (" (--embedded runs agents of this command's own)" if embedded_hint else "")
                )
            else:
                mode = "embedded"
        kwargs: dict[str, Any] = {
            "namespace": self.settings.namespace,
            "log_to_driver": False,
            "logging_level": logging.WARNING,
            "configure_logging": True,
        }
        if mode == "embedded":
            # "local" always starts a new Ray: with no address, ray.init() would join whatever
            # cluster /tmp/ray/ray_current_cluster names, even a dead one, and hang for minutes.
            address = "local"
            kwargs.update(include_dashboard=False)
        join_ray(address, kwargs)
        self.mode = mode
        self._joined = True

    def disconnect(self) -> None:
        """Disconnect from Ray if ``connect`` joined it (an embedded Ray stops with it); a Ray
        this process was in before ``connect`` stays, with everything running in it."""
        self._handles.clear()
        if self._joined and ray.is_initialized():
            ray.shutdown()
        self._joined = False

    @contextlib.contextmanager
    def embedded(self) -> Iterator[Deployment]:
        """Start a Ray of this process's own, deploy the agents in it, and stop both on exit.

        Refused (``LaunchError``) while this state directory's local head runs or an address is
        named: a running deployment is used, never added to, and its agents are never removed by
        a command that did not start them. An extension that does not load stops it before Ray.
        """
        _ = self.roles
        self.connect(only_embedded=True)
        created: list[str] = []
        try:
            created = list(self.roles)
            self.deploy(detached=False, create_secret=True)
            yield self
        finally:
            if created:
                self._stop_agents(kill=False, roles=created)
            self.disconnect()

    # -- agents ---------------------------------------------------------------------------------

    @functools.cached_property
    def roles(self) -> tuple[str, ...]:
        """Every agent's role: the built-in four, then those the extensions define.

        Raises:
            InputError: An extension does not load, or defines an agent badly.
        """
        return deployment_roles(
            self.settings.extensions,
            self.settings.extension_paths,
            timeout_s=self.settings.extension_import_timeout_s,
        )

    def _found_roles(self) -> list[str]:
        """The role of every agent actor in the namespace, ours first: an agent whose extension
        this process does not load is found by its name (to be shown and removed)."""
        prefix = actor_name("")
        found = {
            entry["name"].removeprefix(prefix)
            for entry in ray.util.list_named_actors(all_namespaces=True)
            if entry["namespace"] == self.settings.namespace and entry["name"].startswith(prefix)
        }
        ours = self._roles_if_known()
        return [role for role in ours if role in found] + sorted(found - set(ours))

    def _roles_if_known(self) -> tuple[str, ...]:
        """``roles``, or the built-in ones when an extension does not load."""
        try:
            return self.roles
        except InputError:
            return ROLES

    def _grpc_host(self) -> str | None:
        if self.settings.grpc_host is not None:
            return self.settings.grpc_host
        # An embedded or local-head deployment lives on this machine: keep its traffic on loopback.
        return "127.0.0.1" if self.mode in ("embedded", "local") else None

    def deployed(self) -> bool:
        """Whether every agent exists in the namespace."""
        return all(self._handle(role) is not None for role in self.roles)

    def _handle(self, role: str) -> Any:
        try:
            return ray.get_actor(actor_name(role), namespace=self.settings.namespace)
        except ValueError:
            return None

    def deploy(
        self,
        *,
        detached: bool,
        replace: bool = False,
        create_secret: bool = True,
        resume: bool = True,
    ) -> list[AgentInfo]:
        """Create the agent actors that are missing (all of them with ``replace``) and wait until
        every agent serves.

        Re-running it against a running deployment changes nothing, except with another set of
        extensions (detached agents only, as ``up`` deploys them): agents that run with another
        set are redeployed (``replaced``) and agents whose role no extension of the new set
        defines are removed (``removed``), so the deployment is the set asked for.

        Args:
            detached: Agents outlive this process (``up``).
            replace: Redeploy running agents (and remove those of roles no longer defined).
            create_secret: Make a cluster secret when there is none (token mode); otherwise its
                absence is a ``MissingSecretError``.
            resume: Whether the agents created now resume their stores' unfinished plans when
                they first start (``False``: they cancel the running ones; a later restart of an
                agent resumes as always).

        Raises:
            LaunchError: Agents did not start, or running agents hold another cluster secret
                than this process (every operator command would be refused).
        """
        roles = self.roles  # an extension that does not load stops here
        if self.mode == "cluster":
            self._check_cluster_auth()
        self.replaced, self.removed = [], []
        if replace or detached:
            self.removed = self._stop_agents(
                kill=True, roles=[role for role in self._found_roles() if role not in roles]
            )
        if replace:
            self._stop_agents(kill=True, roles=roles)
        elif detached:
            self.replaced = self._stop_agents(kill=True, roles=self._other_extensions(roles))
        running = {role for role in roles if self._handle(role) is not None}
        settings = self._agent_settings(detached)
        api_key = (
            self.settings.model_api_key.get_secret_value() if self.settings.model_api_key else ""
        )
        # Secrets travel as constructor arguments, never in the settings the agents are given.
        a2a_tokens = {
            name: peer.token.get_secret_value()
            for name, peer in self.settings.a2a_agents.items()
            if peer.token is not None
        }
        env = {
            key: value
            for key, value in os.environ.items()
            if key.startswith(_FORWARDED_PREFIXES) and key not in _NOT_FORWARDED
        }
        secret, made = self._secret_to_hand(create_secret)
        private_dir(self.settings.state_dir)
        audit_key = load_or_create_key(self.settings.audit_key_path)
        remote_cls = ray.remote(AgentActor)
        settings_json = settings.model_dump_json()
        for role in roles:
            options = _actor_options(settings, role, env, detached)
            self._handles[role] = remote_cls.options(**options).remote(
                role, settings_json, secret, audit_key, api_key, a2a_tokens, resume
            )
        try:
            infos = self._ready(timeout_s=self.settings.deploy_timeout_s)
        except AgentStartError:
            # A refused agent leaves nothing running: the agents this call created go again.
            self._stop_agents(kill=True, roles=[role for role in roles if role not in running])
            raise
        digest = settings_digest(settings_json)
        self.stale = [i.role for i in infos if i.role in running and i.settings_digest != digest]
        if secret is not None:
            try:
                _check_secret(
                    infos, secret.key_id, self.settings.secret_path, made=made is not None
                )
            except LaunchError:
                # The agents this call created hold a secret no one will have: they go again.
                self._stop_agents(kill=True, roles=[role for role in roles if role not in running])
                raise
        if made is not None:
            _save_new_secret(self.settings, made)
        return infos

    def _agent_settings(self, detached: bool) -> Settings:
        """The settings the agents are given: this process's, with the gRPC host of the mode,
        the folder extensions load from, and the model resolved."""
        update: dict[str, Any] = {"grpc_host": self._grpc_host(), **_research_scopes(self)}
        paths = self.settings.extension_paths
        if (
            self.mode in ("embedded", "local")
            and self.settings.extensions
            and not detached
            and Path.cwd() not in paths
        ):
            # Agents on this machine resolve extension modules from where the user launched us
            # (`up`, which deploys detached agents, chose their folders: runtime.config._deployed).
            update["extension_paths"] = [*paths, Path.cwd()]
        return resolve_model(self.settings.model_copy(update=update))

    def _secret_to_hand(
        self, create_secret: bool
    ) -> tuple[ClusterSecret | None, ClusterSecret | None]:
        """The cluster secret the agents are given, and the same when it is made now (else
        ``None``)."""
        # A secret made now is written only once the agents hold it and agree (``deploy``): an
        # `up` that fails leaves the state directory's secret and operator key as they were.
        if (
            create_secret
            and self.settings.auth == "token"
            and not self.settings.secret_path.exists()
        ):
            made = ClusterSecret.generate()
            return made, made
        secret = cluster_secret(self.settings, create=create_secret)
        if secret is not None:
            save_operator_key(self.settings, secret)
        return secret, None

    def _other_extensions(self, roles: Sequence[str], timeout_s: float = 10.0) -> list[str]:
        """The roles among ``roles`` whose running agent loaded another set of extensions than
        this deployment's (an agent that does not say, or does not answer, is left alone)."""
        handles = {role: self._handle(role) for role in roles}
        refs = {role: h.info.remote() for role, h in handles.items() if h is not None}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        wanted = list(self.settings.extensions)
        other: list[str] = []
        for role, ref in refs.items():
            if ref not in ready:
                continue
            with contextlib.suppress(ray.exceptions.RayError):
                loaded = ray.get(ref).get("extensions")
                if loaded is not None and list(loaded) != wanted:
                    other.append(role)
        return other

    def _check_cluster_auth(self) -> None:
        """Refuse an external Ray that is not on loopback and lets anyone join (unless allowed)."""
        address = self.settings.address or ""
        host = address.removeprefix("ray://").rpartition(":")[0] or address
        if address == "auto" or not host:
            host = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        if is_loopback(host):
            return
        auth = _cluster_auth()
        if auth is RayAuth.TOKEN:
            return
        risk = (
            f"the Ray cluster at {address} "
            + ("asks for no token" if auth is RayAuth.NONE else "may ask for no token")
            + ": anyone who reaches it can run code in the agents and read their secrets"
        )
        if not self.settings.allow_unauthenticated_ray:
            raise LaunchError(
                f"refusing to deploy: {risk}; start Ray with RAY_AUTH_MODE=token, or pass"
                " --allow-unauthenticated-ray (STRATAGEM_ALLOW_UNAUTHENTICATED_RAY=1)"
            )
        logger.warning("deploying although %s", risk)
        self.warnings.append(f"deploying although {risk}")

    def _handles_or_fail(self) -> dict[str, Any]:
        """A handle on every agent (``roles``, then any other agent actor found)."""
        roles = [*self.roles, *(r for r in self._found_roles() if r not in self.roles)]
        handles: dict[str, Any] = {role: self._handle(role) for role in roles}
        missing = [role for role, handle in handles.items() if handle is None]
        if missing:
            raise LaunchError(
                "agents not deployed: "
                + ", ".join(f"{role} ({self._missing_reason(role)})" for role in missing)
            )
        return handles

    def _missing_reason(self, role: str) -> str:
        """Why ``role``'s agent is not deployed: it gave up restarting, Ray's cause of its death
        (a dead agent's name is free again, Ray's table still says why it died), or never
        deployed."""
        why = gave_up_reason(self.settings.restarts_path(role)) or death_cause(
            dead_actor_record(actor_name(role))
        )
        if why:
            return why
        if role not in ROLES:
            return (
                "not deployed: its extension is named here but was not when the deployment was "
                "made ('stratagem up' deploys it)"
            )
        return "not deployed"

    def serving_endpoints(self, timeout_s: float = 10.0) -> dict[str, str]:
        """Every agent's endpoint, when each of ``roles`` is deployed and answers (a goal needs
        them all); nothing is deployed or changed here.

        Raises:
            LaunchError: An agent is not deployed (each named, with why).
            UnavailableError: An agent is deployed but does not answer within ``timeout_s``, or
                its endpoint refuses connections from here (each named).
        """
        infos = self.status(timeout_s=timeout_s)
        missing = [i for i in infos if i.health == "not deployed" and i.role in self.roles]
        if missing:
            raise LaunchError(
                "agents not deployed: "
                + "; ".join(f"{info.role} ({info.problem})" for info in missing)
                + "; nothing was changed (this command deploys no agent into a deployment it did"
                " not start)"
            )
        silent = [i for i in infos if i.role in self.roles and i.health != "serving"]
        if silent:
            raise UnavailableError(
                "not answering: "
                + "; ".join(
                    f"{info.role} ({info.health}, Ray: {info.state.lower()}"
                    + (f", {info.problem}" if info.problem else "")
                    + ")"
                    for info in silent
                )
            )
        return {info.role: info.endpoint for info in infos if info.health == "serving"}

    def _ready(self, timeout_s: float) -> list[AgentInfo]:
        """Wait until every agent answers (it answers once its gRPC server serves).

        Raises:
            AgentStartError: An agent's constructor failed (it is dead for good).
            LaunchError: An agent did not answer in time, or died otherwise.
        """
        handles = self._handles_or_fail()
        # Not retried: a call retried on an agent whose constructor failed would have Ray print
        # that constructor's traceback here ("Task ... failed. There are infinite retries...").
        # A restarting agent queues the call all the same.
        refs = {
            role: handle.info.options(max_task_retries=0).remote()
            for role, handle in handles.items()
        }
        answers: dict[str, dict[str, Any]] = {}
        retried: set[str] = set()
        deadline = time.monotonic() + timeout_s
        while refs:
            ready, _ = ray.wait(
                list(refs.values()), num_returns=1, timeout=max(deadline - time.monotonic(), 0)
            )
            if not ready:
                late = [i.role for i in self.status(timeout_s=1.0) if i.health != "serving"]
                raise LaunchError(
                    f"agents did not start within {timeout_s:.0f}s: {', '.join(late) or 'none'}"
                    " (placement a node cannot satisfy? see 'stratagem status')"
                )
            for role, ref in list(refs.items()):
                if ref not in ready:
                    continue
                del refs[role]
                try:
                    answers[role] = ray.get(ref)
                except ray.exceptions.RayActorError as exc:
                    if exc.actor_init_failed:
                        raise AgentStartError(role, _start_failure(role, exc)) from None
                    if role in retried:
                        raise LaunchError(f"an agent failed to start: {_first_line(exc)}") from exc
                    # Unavailable for a moment (restarting): wait as any later call would.
                    retried.add(role)
                    refs[role] = handles[role].info.remote()
        return [AgentInfo.from_dict(answers[role]) for role in handles]

    def status(self, timeout_s: float = 10.0) -> list[AgentInfo]:
        """Each agent's node, endpoint, health, restarts and running plans (``roles``, then any
        other agent actor found).

        An agent that does not answer within ``timeout_s`` (restarting, or waiting for a node its
        placement allows) is listed with Ray's state of its actor instead of failing the call; one
        that is not deployed (it gave up restarting, or was never deployed) with health ``not
        deployed`` and why.
        """
        roles = [*self.roles, *(r for r in self._found_roles() if r not in self.roles)]
        handles = {role: self._handle(role) for role in roles}
        refs = {role: handle.info.remote() for role, handle in handles.items() if handle}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        done = set(ready)
        infos: list[AgentInfo] = []
        for role in roles:
            ref = refs.get(role)
            if ref is None:
                infos.append(_missing_agent(role, self._missing_reason(role)))
                continue
            raw: dict[str, Any] | None = None
            if ref in done:
                with contextlib.suppress(ray.exceptions.RayError):
                    raw = ray.get(ref)
            if raw is None:
                reason = gave_up_reason(self.settings.restarts_path(role))
                infos.append(_silent_agent(role, handles[role], reason))
                continue
            info = AgentInfo.from_dict(raw)
            if not _accepts_connections(info.endpoint):
                info = dataclasses.replace(info, health="unreachable")
            infos.append(info)
        return infos

    def endpoint(self, role: str) -> str:
        """The gRPC endpoint of ``role``'s agent."""
        if role not in self.roles:
            raise LaunchError(f"unknown agent {role!r}; agents are: {', '.join(self.roles)}")
        for info in self.status():
            if info.role == role and info.endpoint:
                return info.endpoint
            if info.role == role:
                raise LaunchError(f"agent {role} is not answering (Ray: {info.state})")
        raise LaunchError(f"agent {role} is not deployed")

    def flush_telemetry(self, timeout_s: float = 10.0) -> None:
        """Ask every agent to export its finished spans and sign its audit head now."""
        handles = (self._handle(role) for role in self._found_roles())
        refs = [handle.flush.remote() for handle in handles if handle is not None]
        with contextlib.suppress(ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
            ray.get(refs, timeout=timeout_s)

    def teardown(self) -> list[str]:
        """Remove every agent (nothing else), those of extensions this process does not load
        too; returns the roles removed."""
        return self._stop_agents(kill=True, roles=self._found_roles())

    def _stop_agents(self, *, kill: bool, roles: Sequence[str] | None = None) -> list[str]:
        removed: list[str] = []
        handles = {role: self._handle(role) for role in (self.roles if roles is None else roles)}
        # Not retried: an agent whose constructor fails meanwhile would have Ray print its
        # traceback for the retry (it is killed below all the same).
        polite = [
            h.shutdown.options(max_task_retries=0).remote()
            for h in handles.values()
            if h is not None
        ]
        with contextlib.suppress(Exception):
            ray.get(polite, timeout=15)
        for role, handle in handles.items():
            if handle is None:
                continue
            if kill:
                ray.kill(handle, no_restart=True)
            self._handles.pop(role, None)
            removed.append(role)
        return removed


def _check_secret(infos: list[AgentInfo], key_id: str, path: Path, *, made: bool = False) -> None:
    """Refuse agents that verify tokens with another secret than ``key_id`` (agents from before
    key ids, which publish none, are not judged); ``made``: the secret is a new one, not written
    (there was none at ``path``)."""
    others = sorted({info.secret_id for info in infos if info.secret_id} - {key_id})
    if not others:
        return
    roles = [info.role for info in infos if info.secret_id and info.secret_id != key_id]
    if made:
        raise LaunchError(
            f"agents {', '.join(roles)} are running and hold a cluster secret (key id "
            f"{', '.join(others)}), but there is none at {path}: copy the deployment's "
            "cluster.secret there, or give the agents a new one with 'stratagem up --replace' "
            "(nothing was written)"
        )
    raise LaunchError(
        f"agents {', '.join(roles)} hold another cluster secret (key id {', '.join(others)}) "
        f"than {path} (key id {key_id}), so every command from here would be "
        "UNAUTHENTICATED: copy the deployment's cluster.secret here, or give the agents "
        "this one with 'stratagem secret rotate' or 'stratagem up --replace'"
    )


def _save_new_secret(settings: Settings, secret: ClusterSecret) -> None:
    """Write a secret the agents took up (and the operator's key from it), unless another
    process wrote one meanwhile: that one stays, and this call's agents were checked against
    nothing else (they are those of the same call)."""
    path = settings.secret_path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        logger.warning("a cluster secret appeared at %s meanwhile; it is kept", path)
        return
    except OSError as exc:
        raise LaunchError(f"cannot write the cluster secret {path}: {exc}") from exc
    os.close(fd)
    secret.save(path)
    save_operator_key(settings, secret)


def placement_options(settings: Settings, role: str) -> dict[str, Any]:
    """Ray actor options that put ``role``'s agent where ``settings.placement`` says."""
    placement = settings.placement.get(role)
    options: dict[str, Any] = {}
    if placement is None:
        return options
    if placement.resources:
        options["resources"] = dict(placement.resources)
    if placement.labels:
        options["label_selector"] = dict(placement.labels)
    return options


def _probe_from_the_cluster() -> str:
    gcs_address = ray.get_runtime_context().gcs_address
    return probe_auth(gcs_address).value


def _cluster_auth(timeout_s: float = 30.0) -> RayAuth:
    """Whether the connected cluster's GCS asks for a token, probed from inside the cluster (a
    driver connected through the Ray client may not reach the GCS itself)."""
    probe = ray.remote(num_cpus=0, max_retries=0)(_probe_from_the_cluster)
    try:
        return RayAuth(ray.get(probe.remote(), timeout=timeout_s))
    except (ray.exceptions.RayError, ValueError):
        logger.info("cannot tell whether the Ray cluster asks for a token", exc_info=True)
        return RayAuth.UNKNOWN


def _accepts_connections(endpoint: str, timeout_s: float = 2.0) -> bool:
    """Whether a TCP connection to ``HOST:PORT`` opens from this process."""
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout_s):
            return True
    except (OSError, ValueError):
        return False


def _missing_agent(role: str, why: str) -> AgentInfo:
    """An agent of the deployment that is not deployed (it gave up, died, or never was)."""
    return AgentInfo(
        role=role,
        endpoint="",
        node_id="",
        node_ip="",
        pid=0,
        restarted=False,
        plans_running=0,
        restarts=None,
        state="DEAD" if why.startswith(("gave up", "died", "removed")) else "MISSING",
        health="not deployed",
        problem=why,
    )


def _refuse_embedded_beside(settings: Settings) -> None:
    """Refuse an embedded run where a deployment runs: its agents would share that deployment's
    state directory (stores, restart counts) and its Ray."""
    if settings.address is not None:
        raise LaunchError(
            f"an embedded run starts a Ray of its own: not with an address ({settings.address})"
        )
    recorded = LocalCluster.recorded(settings.local_cluster_file)
    if recorded is not None and recorded.alive:
        raise LaunchError(
            f"a deployment runs on the state directory {settings.state_dir} (local Ray head pid "
            f"{recorded.pid}): use it without --embedded, or give the embedded run another "
            "--state-dir"
        )


def _silent_agent(role: str, handle: Any, gave_up: str = "") -> AgentInfo:
    """What Ray's actor table says about an agent that did not answer (``gave_up``: why a dead
    agent stopped restarting, when it said so)."""
    record = actor_record(handle._actor_id.hex())
    address: dict[str, Any] = record.get("Address") or {}
    return AgentInfo(
        role=role,
        endpoint="",
        node_id=str(address.get("NodeID", "")),
        node_ip=str(address.get("IPAddress", "")),
        pid=int(record.get("Pid", 0) or 0),
        restarted=int(record.get("NumRestarts", 0) or 0) > 0,
        plans_running=0,
        restarts=int(record["NumRestarts"]) if "NumRestarts" in record else None,
        state=str(record.get("State", "UNKNOWN")),
        # Dead, its name not freed yet: gone as surely as one Ray no longer lists.
        health="not deployed" if record.get("State") == "DEAD" else "not answering",
        problem=(gave_up if record.get("State") == "DEAD" else "") or death_cause(record),
    )


def _start_failure(role: str, exc: BaseException) -> str:
    """Why ``role``'s constructor failed, in one line: the message alone for a refusal the agent
    words itself (``McpSetupError``), the exception's last line otherwise."""
    kind, _, message = _first_line(exc).partition(": ")
    if kind == f"{McpSetupError.__module__}.{McpSetupError.__qualname__}" and message:
        return message
    return f"agent {role} failed to start: {_first_line(exc)}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[-1] if text else type(exc).__name__


def _actor_options(
    settings: Settings, role: str, env: dict[str, str], detached: bool
) -> dict[str, Any]:
    """The Ray options of ``role``'s agent actor."""
    options: dict[str, Any] = {
        "name": actor_name(role),
        "namespace": settings.namespace,
        # Restarts are budgeted per time window by the agent itself (runtime.config._restarts):
        # Ray's own count is for the actor's whole life.
        "max_restarts": 0 if settings.max_restarts == 0 else -1,
        # Every actor method (info, flush, shutdown) is idempotent: a call that meets a
        # restarting agent waits for it instead of failing with ActorUnavailableError.
        "max_task_retries": -1,
        "max_concurrency": 1000,
        "num_cpus": settings.actor_cpus,
        "get_if_exists": True,
        "runtime_env": {"env_vars": env} if env else None,
    }
    options.update(placement_options(settings, role))
    if detached:
        options["lifetime"] = "detached"
    return options
