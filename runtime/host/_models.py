"""Which model the agents plan with, and how an agent is given its model planner.

``resolve_model`` settles where the model is before agents are deployed: ``STRATAGEM_MODEL_URL``
when set, else the embedded server ``make model-server`` started (its state file
``STATE_DIR/model-server/server.json`` names its URL and model, and that it takes a JSON Schema
as llama.cpp's Python server does). A deployment with a ``model`` planner and neither is refused
in one line. Each role's model is its tier's (``role_model``: ``STRATAGEM_ROLE_TIERS`` puts a
role on the ``weak`` or ``strong`` model ``STRATAGEM_MODEL_TIERS`` names, else the default one);
a tier with a server of its own needs neither. ``attach_model_planner`` then builds, inside an
agent's process, the model client (OpenAI-compatible, traced per the GenAI conventions, taking
its turns at the server in the one queue every agent of the node shares: ``FileModelLimiter``)
and the role's model planner.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stratagem.runtime.config._settings import Settings
from stratagem.runtime.config._tiers import RoleModel
from stratagem.runtime.host._local import LaunchError

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from stratagem.agents import Agent, ModelClient

__all__ = [
    "attach_model_planner",
    "embedded_model_server",
    "model_client",
    "resolve_model",
    "role_model",
]

logger = logging.getLogger(__name__)

SERVER_STATE = Path("model-server") / "server.json"


def embedded_model_server(state_dir: Path) -> dict[str, Any] | None:
    """What the embedded model server's state file says (``url``, ``model``, ``kind``), or
    ``None`` when it has none (the server was never started, or was stopped)."""
    try:
        state = json.loads((state_dir / SERVER_STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict) or not isinstance(state.get("url"), str):
        return None
    return state


def resolve_model(settings: Settings) -> Settings:
    """``settings`` with the model's URL and name settled, when any role plans with a model.

    Raises:
        LaunchError: A ``model`` planner with no model URL and no embedded server (unless each
            role planning with a model is on a tier with a server of its own), or a tier's
            ``api_key_file`` that cannot be read.
    """
    from stratagem.protocol import roles  # with the agents the extensions define

    modelled = [role for role in roles() if settings.planner_for(role) == "model"]
    for role in modelled:
        _tier_key(role_model(settings, role))  # an unreadable key file: refused before deploying
    if all(role_model(settings, role).own_server for role in modelled):
        return settings  # no role plans with a model, or each at its tier's own server
    if settings.model_url is not None:
        if not settings.model:
            raise LaunchError(
                "a model planner needs the model's name at that server: set STRATAGEM_MODEL"
            )
        return settings
    embedded = embedded_model_server(settings.state_dir)
    if embedded is None:
        raise LaunchError(
            "a model planner needs a model server: set STRATAGEM_MODEL_URL (and STRATAGEM_MODEL), "
            f"or start the embedded one with 'make model-server' (none recorded in "
            f"{settings.state_dir / SERVER_STATE})"
        )
    update: dict[str, Any] = {
        "model_url": embedded["url"],
        "model": settings.model or str(embedded.get("model", "")),
    }
    if embedded.get("kind") == "llama.cpp":
        update["model_schema_style"] = "json_object"
        if settings.model_max_concurrent is None:
            update["model_max_concurrent"] = 1
    return settings.model_copy(update=update)


def attach_model_planner(
    agent: Agent,
    settings: Settings,
    *,
    api_key: str = "",
    tracer_provider: TracerProvider | None = None,
) -> bool:
    """Give ``agent`` its role's model planner when its role plans with a model; whether it did.

    The API key arrives apart from ``settings`` (which never carry it) and stays inside the
    client: never in a repr, a log line, a span or the audit log.
    """
    client = model_client(agent.role, settings, api_key=api_key, tracer_provider=tracer_provider)
    if client is None:
        return False
    from stratagem.agents import ModelPlanningConfig, model_planner
    from stratagem.planning import Budget

    budget = (
        Budget(model_tokens=settings.model_token_budget)
        if settings.model_token_budget is not None
        else None
    )
    config = ModelPlanningConfig(
        max_repairs=settings.model_max_repairs, max_tokens=settings.model_max_tokens
    )
    planner = model_planner(agent, client, config, budget=budget)
    if planner is None:
        logger.warning("agent %s has no model planner; it plans with its own rules", agent.role)
        return False
    agent.use_planner(planner)
    agent.planning_timeout_s = settings.planning_timeout_s(agent.role)
    agent.model = str(role_model(settings, agent.role))
    return True


def role_model(settings: Settings, role: str) -> RoleModel:
    """The model ``role``'s agent uses: its tier's (``role_tiers``, else ``default``), at the
    tier's own server when it names one, else at ``model_url``."""
    tier = settings.role_tiers.get(role, "default")
    named = settings.model_tiers.get(tier) if tier != "default" else None
    if named is None:
        return RoleModel(tier=tier, model=settings.model, url=settings.model_url)
    if named.url is None:
        return RoleModel(tier=tier, model=named.model, url=settings.model_url)
    return RoleModel(
        tier=tier,
        model=named.model,
        url=named.url,
        own_server=True,
        api_key_file=named.api_key_file,
    )


def _tier_key(chosen: RoleModel) -> str:
    """The key of a tier's own server, from its ``api_key_file`` ("" when it names none).

    Raises:
        LaunchError: The file cannot be read, named (the key itself is never shown).
    """
    if chosen.api_key_file is None:
        return ""
    try:
        return chosen.api_key_file.expanduser().read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise LaunchError(
            f"model_tiers.{chosen.tier}.api_key_file: cannot read {chosen.api_key_file}: "
            f"{type(exc).__name__}"
        ) from None


def model_client(
    role: str,
    settings: Settings,
    *,
    api_key: str = "",
    tracer_provider: TracerProvider | None = None,
) -> ModelClient | None:
    """The traced model client of ``role``'s agent when its role plans with a model (its planner
    and its research use it), else ``None``. Its model is its tier's (:func:`role_model`); the
    API key goes only to the default tier's server; a tier's own server gets its
    ``api_key_file``'s key, or none."""
    if settings.planner_for(role) != "model":
        return None
    chosen = role_model(settings, role)
    if chosen.url is None:
        return None
    from stratagem.agents import ModelConfig, OpenAIModelClient, TracedModelClient
    from stratagem.runtime.host._model_slots import FileModelLimiter, slots_folder

    limit = settings.model_max_concurrent or 4
    return TracedModelClient(
        OpenAIModelClient(
            ModelConfig(
                url=chosen.url,
                model=chosen.model,
                api_key=_tier_key(chosen) if chosen.own_server else api_key,
                timeout_s=settings.model_timeout_s,
                schema_style=settings.model_schema_style,
                max_concurrent=limit,
            ),
            # One queue per server for every agent of this node (each is its own process).
            limiter=FileModelLimiter(slots_folder(settings.state_dir, chosen.url), limit),
        ),
        tracer_provider=tracer_provider,
        capture_content=settings.genai_capture_content,
    )
