"""Batches of simulated rollouts to and from the agent-proxy format.

:class:`~emote_core.models.model_env.ModelEnv` steps its rollouts as ``(B, ...)`` tensors; agent
proxies and memory proxies speak per-agent :class:`~emote_core.typing.DictObservation` and
:class:`~emote_core.typing.DictResponse`. These functions translate a whole batch at once (one
``np.stack`` in, one array of rows out), which is what keeps a rollout of a few hundred agents
cheap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from emote_core.errors import ConfigurationError
from emote_core.memory.proxy import REWARD_KEY
from emote_core.proxies.generic import ACTIONS_KEY
from emote_core.typing import AgentId, DictObservation, DictResponse, EpisodeState

_INITIAL = EpisodeState.INITIAL
# Indexed by 2 * terminated + truncated (never both: a terminated rollout is not truncated).
_STEP_STATES = (EpisodeState.RUNNING, EpisodeState.INTERRUPTED, EpisodeState.TERMINAL)


def initial_observations(
    agents: Sequence[AgentId], rows: np.ndarray, key: str
) -> dict[AgentId, DictObservation]:
    """One ``INITIAL`` observation ``{key: row}`` per agent, rows in the agents' order."""
    return {
        agent: DictObservation(episode_state=_INITIAL, array_data={key: row})
        for agent, row in zip(agents, rows, strict=True)
    }


def step_observations(
    agents: Sequence[AgentId],
    rows: np.ndarray,
    rewards: Sequence[float],
    terminated: np.ndarray,
    truncated: np.ndarray,
    key: str,
) -> tuple[dict[AgentId, DictObservation], list[AgentId]]:
    """Each agent's observation after a step, and the agents whose rollout ended there.

    Args:
        agents: The stepped agents, in row order.
        rows: Their next observations, one row each.
        rewards: The step's reward of each.
        terminated: Bool flags: the rollout ended TERMINAL.
        truncated: Bool flags: the rollout reached its length limit (INTERRUPTED).
        key: The observation key.

    Returns:
        ``RUNNING``, ``TERMINAL`` or ``INTERRUPTED`` observations carrying ``{"reward": r}``, and
        the agents that ended, in row order.
    """
    codes = (2 * terminated.astype(np.int64) + truncated).tolist()
    observations = {
        agent: DictObservation(
            episode_state=_STEP_STATES[code], array_data={key: row}, rewards={REWARD_KEY: reward}
        )
        for agent, code, row, reward in zip(agents, codes, rows, rewards, strict=True)
    }
    ended = [agent for agent, code in zip(agents, codes, strict=True) if code]
    return observations, ended


def stack_actions(
    agents: Sequence[AgentId], responses: Mapping[AgentId, DictResponse]
) -> np.ndarray:
    """The ``"actions"`` of every agent's response, stacked in the agents' order.

    Raises:
        ConfigurationError: If an agent has no response or its response no ``"actions"``, or a
            response names an agent not in ``agents``.
    """
    try:
        actions = np.stack([responses[agent].list_data[ACTIONS_KEY] for agent in agents])
    except KeyError:
        raise _response_error(agents, responses) from None
    if len(responses) != len(agents):
        raise _response_error(agents, responses)
    return actions


def _response_error(
    agents: Sequence[AgentId], responses: Mapping[AgentId, DictResponse]
) -> ConfigurationError:
    missing = [agent for agent in agents if agent not in responses]
    if missing:
        return ConfigurationError(
            f"ModelEnv.dict_step needs a response for every running agent; {len(missing)} of "
            f"{len(agents)} have none (first: {missing[:5]}) — answer every INITIAL and RUNNING "
            "observation"
        )
    no_actions = [agent for agent in agents if ACTIONS_KEY not in responses[agent].list_data]
    if no_actions:
        keys = sorted(responses[no_actions[0]].list_data)
        return ConfigurationError(
            f"ModelEnv.dict_step reads list_data['{ACTIONS_KEY}'] of each response; the "
            f"response of agent {no_actions[0]} has keys {keys}"
        )
    running = set(agents)
    extra = sorted(agent for agent in responses if agent not in running)
    return ConfigurationError(
        f"ModelEnv.dict_step got responses for {len(extra)} agents that are not running (first: "
        f"{extra[:5]}); its running agents are the ones of its last observations"
    )


__all__ = ["initial_observations", "stack_actions", "step_observations"]
