"""How ``up`` words an agent whose constructor failed (``runtime.host._launcher._start_failure``):
Ray hands the launcher the constructor's traceback as text, whose last line is the exception."""

from __future__ import annotations

TRACEBACK = (
    "The actor died because of an error raised in its creation task, "
    "ray::stratagem-tactical:AgentActor.__init__() (pid=1, ip=127.0.0.1)\n"
    '  File "runtime/host/_mcp.py", line 46, in attach_mcp_servers\n'
    "    raise McpSetupError(...)\n"
)


def test_a_refusal_the_agent_words_itself_is_shown_alone() -> None:
    from stratagem.runtime.host._launcher import _start_failure
    from stratagem.runtime.host._mcp import McpSetupError

    line = "agent tactical: MCP server 'files' (stdio) did not load its tools: Connection closed"
    failed = RuntimeError(f"{TRACEBACK}{McpSetupError.__module__}.McpSetupError: {line}")
    assert _start_failure("tactical", failed) == line


def test_any_other_failure_names_the_agent_and_the_exception() -> None:
    from stratagem.runtime.host._launcher import _start_failure

    failed = RuntimeError(f"{TRACEBACK}KeyError: 'model'")
    assert _start_failure("tactical", failed) == "agent tactical failed to start: KeyError: 'model'"
    # A class of the same name elsewhere is not taken for the agent's own refusal.
    failed = RuntimeError(f"{TRACEBACK}other.McpSetupError: agent x")
    assert _start_failure("tactical", failed) == (
        "agent tactical failed to start: other.McpSetupError: agent x"
    )
