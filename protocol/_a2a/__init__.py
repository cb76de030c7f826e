"""Every agent an A2A agent: its card and JSON-RPC over HTTP, served through its gRPC pipeline.

``_card.py`` makes the A2A card from ``Describe``; ``_tasks.py`` maps messages to capability
requests, plans to tasks and errors to A2A's; ``_names.py`` renders a capability's JSON with
ProtoJSON's names; ``_reply.py`` lets a capability answer with A2A parts of its choosing;
``_handler.py`` answers the JSON-RPC methods with the agent's own RPCs through ``AgentServer``'s
pipeline; ``_server.py`` serves them (the A2A SDK's Starlette routes under uvicorn);
``_client.py`` calls another A2A agent from a plan's step.
"""

from stratagem.protocol._a2a._card import a2a_card
from stratagem.protocol._a2a._reply import A2APart, A2AReply
from stratagem.protocol._a2a._server import A2AConfig, A2AServer

__all__ = ["A2AConfig", "A2APart", "A2AReply", "A2AServer", "a2a_card"]
