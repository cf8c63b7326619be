"""EpsilonGreedyAgentProxy: acting for DQN from a Q network."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from emote_core.errors import ConfigurationError
from emote_core.proxies.base import acting_agents, inference_mode_of
from emote_core.proxies.generic import ACTIONS_KEY
from emote_core.typing import AgentId, DictObservation, DictResponse


@runtime_checkable
class ScheduledValue(Protocol):
    """Anything with a current ``value``, such as a ``BPStepScheduler``."""

    @property
    def value(self) -> float:
        """The value now."""
        ...


class EpsilonGreedyAgentProxy:
    """Takes the greedy action of a Q network, or with probability epsilon a uniform one.

    Actions are ``int64`` arrays of shape ``(1,)``, as ``DictGymWrapper`` takes for ``Discrete``
    action spaces.

    Args:
        q_network: Maps a ``(B, ...)`` float32 observation batch to ``(B, num_actions)`` values.
        device: Where the network runs.
        num_actions: The number of discrete actions.
        epsilon: The exploration probability: a number in ``[0, 1]``, or an object whose
            ``value`` is read at every call (a schedule stepped by training).
        input_key: The observation key the network reads.
        seed: Seeds the exploration draws; ``None`` draws from fresh entropy.

    Raises:
        ConfigurationError: If ``num_actions`` is not a positive integer or a fixed epsilon is
            outside ``[0, 1]``; at a call, if a scheduled epsilon is outside ``[0, 1]`` or the
            network's output width is not ``num_actions``.
    """

    def __init__(
        self,
        *,
        q_network: nn.Module,
        device: torch.device | str,
        num_actions: int,
        epsilon: float | ScheduledValue,
        input_key: str = "obs",
        seed: int | None = None,
    ) -> None:
        if isinstance(num_actions, bool) or not isinstance(num_actions, int) or num_actions < 1:
            raise ConfigurationError(
                f"EpsilonGreedyAgentProxy's num_actions must be a positive integer; got "
                f"{num_actions!r}"
            )
        if not isinstance(epsilon, ScheduledValue):
            _check_probability(epsilon)
        self.q_network = q_network
        self.device = torch.device(device)
        self.num_actions = num_actions
        self.epsilon = epsilon
        self.input_key = input_key
        self._rng = np.random.default_rng(seed)

    def random_generators(self) -> dict[str, np.random.Generator]:
        """Its exploration draws, for checkpoints."""
        return {"actions": self._rng}

    @property
    def policy(self) -> nn.Module:
        """The Q network (under the name collectors that copy policies look for)."""
        return self.q_network

    @policy.setter
    def policy(self, network: nn.Module) -> None:
        self.q_network = network

    @property
    def input_names(self) -> tuple[str, ...]:
        """The observation key the network reads."""
        return (self.input_key,)

    @property
    def output_names(self) -> tuple[str, ...]:
        """``("actions",)``."""
        return (ACTIONS_KEY,)

    def current_epsilon(self) -> float:
        """The exploration probability in force now."""
        value = self.epsilon.value if isinstance(self.epsilon, ScheduledValue) else self.epsilon
        return _check_probability(value)

    def __call__(
        self, observations: Mapping[AgentId, DictObservation]
    ) -> dict[AgentId, DictResponse]:
        """Responds to every ``INITIAL`` and ``RUNNING`` observation."""
        agents = acting_agents(observations)
        if not agents:
            return {}
        epsilon = self.current_epsilon()
        try:
            rows = [np.asarray(observations[a].array_data[self.input_key]) for a in agents]
        except KeyError as error:
            raise ConfigurationError(
                f"EpsilonGreedyAgentProxy reads observation '{self.input_key}', which an "
                f"observation lacks; fix input_key"
            ) from error
        actions = self._act(np.stack(rows), epsilon)
        return {
            agent: DictResponse(list_data={ACTIONS_KEY: actions[row : row + 1]})
            for row, agent in enumerate(agents)
        }

    def act_batch(self, observations: Mapping[str, np.ndarray]) -> np.ndarray:
        """Actions for a batch of agents at once, ``{key: (B, ...)}`` in, ``(B, 1)`` int64 out.

        Acts exactly as :meth:`__call__` on the same rows would (the same exploration draws).

        Raises:
            ConfigurationError: If the observations lack :attr:`input_key`, or the network's
                output width is not ``num_actions``.
        """
        if self.input_key not in observations:
            raise ConfigurationError(
                f"EpsilonGreedyAgentProxy reads observation '{self.input_key}'; the observations "
                f"have {sorted(observations)} — fix input_key"
            )
        epsilon = self.current_epsilon()
        return self._act(np.asarray(observations[self.input_key]), epsilon)[:, None]

    def _act(self, rows: np.ndarray, epsilon: float) -> np.ndarray:
        """Greedy or (with probability ``epsilon``) uniform actions for a ``(B, ...)`` batch."""
        count = len(rows)
        batch = torch.as_tensor(rows, dtype=torch.float32, device=self.device)
        with inference_mode_of(self.q_network):
            values = self.q_network(batch)
        if values.shape != (count, self.num_actions):
            raise ConfigurationError(
                f"EpsilonGreedyAgentProxy: the Q network returned shape {tuple(values.shape)}; "
                f"expected ({count}, {self.num_actions}) — check num_actions"
            )
        actions = values.argmax(dim=1).cpu().numpy().astype(np.int64)
        explore = self._rng.random(count) < epsilon
        explored = int(explore.sum())
        if explored:  # an empty draw takes nothing from the generator: skip its cost
            actions[explore] = self._rng.integers(0, self.num_actions, size=explored)
        return actions


def _check_probability(value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0.0 <= value <= 1.0
    ):
        raise ConfigurationError(
            f"epsilon must be a probability in [0, 1] (or a schedule whose value is one); got "
            f"{value!r}"
        )
    return float(value)


__all__ = ["EpsilonGreedyAgentProxy", "ScheduledValue"]
