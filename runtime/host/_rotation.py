"""``stratagem secret rotate``: a new cluster secret, taken up by redeploying the agents.

An agent holds the secret it was created with (Ray also hands that same argument to every restart
of its actor), so a new secret reaches the agents only through new actors: ``rotate`` writes the
new secret to the state directory in one step and redeploys every agent with it, as ``up
--replace`` does. From then on a token signed with the old secret is ``UNAUTHENTICATED`` (there is
no grace period: the old secret is gone). The new agents resume nothing: the callers of the plans
the old ones were running went with them, so those plans are cancelled (recorded ``cancelled``,
their completed steps compensated); paused plans and plans waiting at a gate stay as they are (a
gate's decision takes its plan up again).
"""

from __future__ import annotations

from stratagem.protocol import ClusterSecret
from stratagem.runtime.host._directory import AgentInfo
from stratagem.runtime.host._launcher import Deployment
from stratagem.runtime.host._local import LaunchError

__all__ = ["rotate_secret"]


def rotate_secret(deployment: Deployment) -> tuple[str, list[AgentInfo]]:
    """Replace the cluster secret of a running deployment and redeploy its agents with it.

    Args:
        deployment: Connected to the running deployment.

    Returns:
        The new secret's key id and the redeployed agents (each reporting that key id).

    Raises:
        LaunchError: Not in token mode, no agents deployed, or the agents did not take it up.
    """
    settings = deployment.settings
    if settings.auth != "token":
        raise LaunchError(
            f"secret rotate needs STRATAGEM_AUTH=token (this deployment uses {settings.auth})"
        )
    if not deployment.deployed():
        raise LaunchError("no agents deployed to rotate the secret of: run 'stratagem up'")
    secret = ClusterSecret.generate()
    secret.save(settings.secret_path)
    infos = deployment.deploy(detached=True, replace=True, create_secret=False, resume=False)
    late = [info.role for info in infos if info.secret_id != secret.key_id]
    if late:
        raise LaunchError(f"agents {', '.join(late)} did not take up the new secret")
    return secret.key_id, infos
