"""Agent loops written against verl's API, under verl's import path.

    from rlpost.experimental.agent_loop import AgentLoopBase
    from rlpost.experimental.agent_loop.agent_loop import AgentLoopOutput, AgentLoopMetrics, register

See `agent_loop.py` for what such a loop gets (`self.server_manager`, `self.config`, `apply_chat_template`, ...)
and how it runs inside rlpost's multi-turn rollout.
"""

from rlpost.agent.single_turn import SingleTurnAgentLoop
from rlpost.agent.tool_agent import ToolAgentLoop
from rlpost.experimental.agent_loop.agent_loop import (AgentLoopBase, AgentLoopMetrics, AgentLoopOutput,
                                                       AsyncLLMServerManager, LLMServerClient, TokenOutput, register)

__all__ = ["AgentLoopBase", "AgentLoopMetrics", "AgentLoopOutput", "AsyncLLMServerManager", "LLMServerClient",
           "SingleTurnAgentLoop", "TokenOutput", "ToolAgentLoop", "register"]
