"""EpsilonGreedyAgentProxy: acting for DQN from a Q network."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from emote_core.errors import ConfigurationError
from emote_core.proxies.base import acting_agents, inference_mode_of
from emote_core.proxies.generic import ACTIONS_KEY
from emote_core.spaces import ACTION_MASK_KEY
from emote_core.typing import AgentId, DictObservation, DictResponse


@runtime_checkable
class ScheduledValue(Protocol):
    """Anything with a current ``value``, such as a ``BPStepScheduler``."""

    @property
    def value(self) -> float:
        """The value now."""
        ...


def allowed_actions(masks: np.ndarray, num_actions: int, rows: Sequence[object]) -> np.ndarray:
    """The actions discrete action masks allow, as booleans (an entry above 0.5 allows).

    Args:
        masks: ``(B, num_actions)`` masks, one row per acting agent.
        num_actions: The ``n`` of the ``Discrete(n)`` actions.
        rows: What each row is in messages (agent ids, or batch rows).

    Raises:
        ConfigurationError: If the masks are not ``(B, num_actions)``, or a row allows no action.
    """
    masks = np.asarray(masks)
    if masks.shape != (len(rows), num_actions):
        raise ConfigurationError(
            f"action masks of shape {masks.shape[1:]} per agent; {num_actions} discrete actions "
            f"need one entry per action, shape ({num_actions},) — fix the env's '{ACTION_MASK_KEY}'"
        )
    allowed = masks > 0.5
    none = np.flatnonzero(~allowed.any(axis=1))
    if none.size:
        raise ConfigurationError(
            f"the action mask of {rows[int(none[0])]} allows none of the {num_actions} actions; "
            "an agent asked to act needs at least one allowed action — end its episode "
            "(terminated) instead"
        )
    return allowed


class EpsilonGreedyAgentProxy:
    """Takes the greedy action of a Q network, or with probability epsilon a uniform one.

    Actions are ``int64`` arrays of shape ``(1,)``, chosen among those the mask allows (with
    ``action_mask_key``).

    Args:
        q_network: Maps a ``(B, ...)`` float32 observation batch to ``(B, num_actions)`` values.
        device: Where the network runs.
        num_actions: The number of discrete actions.
        epsilon: The exploration probability: a number in ``[0, 1]``, or an object whose
            ``value`` is read at every call (a schedule stepped by training).
        input_key: The observation key the network reads.
        seed: Seeds the exploration draws; ``None`` draws from fresh entropy.
        action_mask_key: The observation holding each agent's action mask (``num_actions``
            entries, nonzero where allowed); ``None``: every action is allowed.
        flatten: Flatten each observation to one row, as DQN's losses and exports do.

    Raises:
        ConfigurationError: If ``num_actions`` is not a positive integer or a fixed epsilon is
            outside ``[0, 1]``; at a call, if a scheduled epsilon is outside ``[0, 1]``, the
            network's output width is not ``num_actions``, or an action mask is missing, of
            another shape, or allows no action.
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
        action_mask_key: str | None = None,
        flatten: bool = False,
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
        self.action_mask_key = action_mask_key
        self.flatten = flatten
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
        keys = [self.input_key, *([self.action_mask_key] if self.action_mask_key else [])]
        try:
            columns = [[np.asarray(observations[a].array_data[k]) for a in agents] for k in keys]
        except KeyError as error:
            raise ConfigurationError(
                f"EpsilonGreedyAgentProxy reads observation {error}, which an observation "
                f"lacks; fix input_key (or action_mask_key)"
            ) from error
        allowed = None
        if self.action_mask_key:
            masks = _stack_masks(columns[1], self.num_actions)
            allowed = allowed_actions(masks, self.num_actions, [f"agent {a}" for a in agents])
        actions = self._act(np.stack(columns[0]), epsilon, allowed)
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
        for key in (self.input_key, self.action_mask_key):
            if key is not None and key not in observations:
                raise ConfigurationError(
                    f"EpsilonGreedyAgentProxy reads observation '{key}'; the observations "
                    f"have {sorted(observations)} — fix input_key (or action_mask_key)"
                )
        epsilon = self.current_epsilon()
        rows = np.asarray(observations[self.input_key])
        allowed = None
        if self.action_mask_key is not None:
            names = [f"row {row}" for row in range(len(rows))]
            masks = np.asarray(observations[self.action_mask_key])
            allowed = allowed_actions(masks, self.num_actions, names)
        return self._act(rows, epsilon, allowed)[:, None]

    def _act(self, rows: np.ndarray, epsilon: float, allowed: np.ndarray | None) -> np.ndarray:
        """Greedy or (with probability ``epsilon``) uniform actions for a ``(B, ...)`` batch,
        among the ``allowed`` ones (``(B, num_actions)`` booleans) where given."""
        count = len(rows)
        batch = torch.as_tensor(rows, dtype=torch.float32, device=self.device)
        if self.flatten:
            batch = batch.reshape(count, -1)
        with inference_mode_of(self.q_network):
            values = self.q_network(batch)
        if values.shape != (count, self.num_actions):
            raise ConfigurationError(
                f"EpsilonGreedyAgentProxy: the Q network returned shape {tuple(values.shape)}; "
                f"expected ({count}, {self.num_actions}) — check num_actions"
            )
        if allowed is not None:
            mask = torch.as_tensor(allowed, device=values.device)
            values = values.masked_fill(~mask, -torch.inf)
        actions = values.argmax(dim=1).cpu().numpy().astype(np.int64)
        explore = self._rng.random(count) < epsilon
        explored = int(explore.sum())
        if not explored:  # an empty draw takes nothing from the generator: skip its cost
            return actions
        if allowed is None:
            actions[explore] = self._rng.integers(0, self.num_actions, size=explored)
            return actions
        # Uniform among the allowed: the allowed action with the highest uniform key.
        keys = np.where(allowed[explore], self._rng.random((explored, self.num_actions)), -1.0)
        actions[explore] = keys.argmax(axis=1)
        return actions


def _stack_masks(rows: list[np.ndarray], num_actions: int) -> np.ndarray:
    """Per-agent masks as one ``(B, num_actions)`` array (refusing rows of another shape)."""
    shapes = {row.shape for row in rows}
    if shapes != {(num_actions,)}:
        raise ConfigurationError(
            f"action masks of shape {sorted(shapes)[0]}; {num_actions} discrete actions need one "
            f"entry per action, shape ({num_actions},) — fix the env's '{ACTION_MASK_KEY}'"
        )
    return np.stack(rows)


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


__all__ = ["EpsilonGreedyAgentProxy", "ScheduledValue", "allowed_actions"]
