"""Agent loops for multi-turn rollouts: token-in/token-out trajectories, tool-call parsing, the
`single_turn_agent` and `tool_agent` loops, a concurrent runner and the batch collator.

    outputs = await run_agent_loops(samples, generate, AgentLoopConfig(...), tokenizer)
    batch = collate_agent_outputs(outputs, prompt_length, response_length, tokenizer.pad_token_id)
"""

from rlpost.agent.base import AGENT_LOOPS, AgentLoopBase, AgentLoopContext, AgentLoopOutput, GenerateFn, register
from rlpost.agent.collate import collate_agent_outputs
from rlpost.agent.config import AgentLoopConfig
from rlpost.agent.metrics import TrajectoryStats, aggregate_metrics
from rlpost.agent.registry import check_agent_names, load_agent_loops
from rlpost.agent.runner import AgentResources, check_samples, run_agent_loops
from rlpost.agent.single_turn import SingleTurnAgentLoop
from rlpost.agent.tool_agent import ToolAgentLoop

__all__ = [
    "AGENT_LOOPS",
    "AgentLoopBase",
    "AgentLoopConfig",
    "AgentLoopContext",
    "AgentLoopOutput",
    "AgentResources",
    "GenerateFn",
    "SingleTurnAgentLoop",
    "ToolAgentLoop",
    "TrajectoryStats",
    "aggregate_metrics",
    "check_agent_names",
    "check_samples",
    "collate_agent_outputs",
    "load_agent_loops",
    "register",
    "run_agent_loops",
]
