"""Agent proxies: batched policy inference for the agents of a step.

A collector hands an agent proxy one step's observations (``{agent_id: DictObservation}``) and
gets back a :class:`~emote_core.typing.DictResponse` for every agent whose observation is
``INITIAL`` or ``RUNNING``. :class:`MemoryProxy` (re-exported from
:mod:`emote_core.memory.proxy`) is what the same collector feeds the step to.
"""

from __future__ import annotations

from emote_core.proxies.base import AgentProxy, MemoryProxy, acting_agents
from emote_core.proxies.epsilon_greedy import EpsilonGreedyAgentProxy, ScheduledValue
from emote_core.proxies.generic import ACTIONS_KEY, FeatureAgentProxy, GenericAgentProxy
from emote_core.proxies.multi_key import MultiKeyAgentProxy
from emote_core.proxies.random_agent import RandomAgentProxy
from emote_core.proxies.vision import VisionAgentProxy

__all__ = [
    "ACTIONS_KEY",
    "AgentProxy",
    "EpsilonGreedyAgentProxy",
    "FeatureAgentProxy",
    "GenericAgentProxy",
    "MemoryProxy",
    "MultiKeyAgentProxy",
    "RandomAgentProxy",
    "ScheduledValue",
    "VisionAgentProxy",
    "acting_agents",
]
