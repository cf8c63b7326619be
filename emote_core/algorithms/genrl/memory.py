"""MemoryProxyWithEncoder: the replay memory of SAC in GenRL's latent space holds latent actions.

Agents act in the environment with decoded actions (:class:`~emote_core.algorithms.genrl.wrappers.
PolicyWrapper`), so what they report is an environment action. Before each step reaches the
memory proxy, this wrapper replaces every reported action with the policy action that stands for
it: the encoder's latent mean for that action and observation, in policy space
(``clamp(mean / latent_scale, -1, 1)``, see :mod:`emote_core.algorithms.genrl.scaling`).
SAC then trains on what the agents did, in the space its policy acts in; the table's action column
is ``latent_dim`` wide.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from emote_core.algorithms.genrl.scaling import check_latent_scale, latent_to_policy
from emote_core.algorithms.genrl.wrappers import EncoderWrapper
from emote_core.errors import ConfigurationError
from emote_core.memory.proxy import REWARDS_COLUMN, MemoryProxy
from emote_core.memory.wrappers import MemoryTableProxyWrapper
from emote_core.nn.inputs import flatten_observation
from emote_core.typing import AgentId, DictObservation, DictResponse, EpisodeState

ACTIONS_KEY = "actions"
"""The response key of the action an environment takes (and the table stores)."""

_ACTING = (EpisodeState.INITIAL, EpisodeState.RUNNING)


class MemoryProxyWithEncoder(MemoryTableProxyWrapper):
    """Stores the latent (policy-space) action of each step instead of the environment action.

    For the agents whose observation is ``INITIAL`` or ``RUNNING``, all of one step's actions
    are encoded in one batch without gradients, on the encoder's device; the responses passed on
    are new :class:`~emote_core.typing.DictResponse` objects (the caller's are not changed) whose
    ``action_key`` entry is the float32 policy action of shape ``(latent_dim,)``. Final
    observations pass on unchanged. Everything else (``is_initial``, ``table``, ``size``) is the
    wrapped proxy's.

    Args:
        inner: The memory proxy (or wrapper) whose table has a ``latent_dim`` wide action column.
        encoder: The VAE's encoder wrapped for labelling (a bare encoder is wrapped here).
        latent_scale: ``latent = latent_scale * policy_action``: the same value as the
            :class:`~emote_core.algorithms.genrl.wrappers.PolicyWrapper`'s.
        observation_keys: The observation keys the encoder reads, in flattening order (``None``:
            every key, sorted, as :func:`~emote_core.nn.inputs.flatten_observation`).
        action_key: The response key of the action.

    Raises:
        ConfigurationError: If ``latent_scale`` is not finite and positive.
    """

    def __init__(
        self,
        inner: MemoryProxy,
        *,
        encoder: EncoderWrapper | nn.Module,
        latent_scale: float,
        observation_keys: Sequence[str] | None = None,
        action_key: str = ACTIONS_KEY,
    ) -> None:
        super().__init__(inner)
        owner = type(self).__name__
        self.latent_scale = check_latent_scale(owner, latent_scale)
        self.encoder = encoder if isinstance(encoder, EncoderWrapper) else EncoderWrapper(encoder)
        self.observation_keys = list(observation_keys) if observation_keys is not None else None
        self.action_key = action_key

    def add(
        self,
        observations: Mapping[AgentId, DictObservation],
        responses: Mapping[AgentId, DictResponse],
    ) -> None:
        """Passes the step on with every acting agent's action replaced by its latent action.

        Raises:
            ConfigurationError: If an acting agent's response has no ``action_key``, an
                observation lacks a key the encoder reads, or the widths do not fit the encoder.
        """
        agents = [
            agent
            for agent, observation in observations.items()
            if observation.episode_state in _ACTING and agent in responses
        ]
        if agents:
            responses = self._relabelled(agents, observations, responses)
        self._inner.add(observations, responses)

    def _relabelled(
        self,
        agents: list[AgentId],
        observations: Mapping[AgentId, DictObservation],
        responses: Mapping[AgentId, DictResponse],
    ) -> dict[AgentId, DictResponse]:
        owner = type(self).__name__
        for agent in agents:
            if self.action_key not in responses[agent].list_data:
                raise ConfigurationError(
                    f"{owner}: agent {agent!r}'s response has no '{self.action_key}' (it has "
                    f"{sorted(responses[agent].list_data)}); pass action_key=... naming the action"
                )
        device = _device_of(self.encoder)
        keys = self.observation_keys or sorted(observations[agents[0]].array_data)
        batch = {key: self._stacked(key, agents, observations, device) for key in keys}
        key = self.action_key
        actions = np.stack(
            [np.asarray(responses[a].list_data[key], dtype=np.float32).reshape(-1) for a in agents]
        )
        labels = self._labels(actions, batch, keys, device)
        relabelled = dict(responses)
        for row, agent in enumerate(agents):
            response = responses[agent]
            relabelled[agent] = DictResponse(
                list_data={**response.list_data, self.action_key: labels[row]},
                scalar_data=dict(response.scalar_data),
            )
        return relabelled

    def add_episode(self, sequence: Mapping[str, np.ndarray], end_state: EpisodeState) -> None:
        """Passes a whole episode on with its actions replaced by their latent actions, encoded
        in one batch (the same labels as step by step: each depends on its own row only).

        Raises:
            ConfigurationError: If the episode has no ``action_key``, or lacks an observation
                key the encoder reads.
        """
        owner, key = type(self).__name__, self.action_key
        if key not in sequence:
            raise ConfigurationError(
                f"{owner}: the episode has no '{key}' (it has {sorted(sequence)}); pass "
                "action_key=... naming the action"
            )
        actions = np.asarray(sequence[key], dtype=np.float32)
        count = len(actions)
        keys = self.observation_keys or sorted(
            k for k in sequence if k not in (key, REWARDS_COLUMN)
        )
        missing = [k for k in keys if k not in sequence]
        if missing:
            raise ConfigurationError(
                f"{owner}: the episode has no observation {missing} (it has {sorted(sequence)}); "
                f"the encoder reads {self.observation_keys or 'every key'}"
            )
        device = _device_of(self.encoder)
        batch = {
            k: torch.as_tensor(np.asarray(sequence[k][:count], dtype=np.float32), device=device)
            for k in keys
        }
        labels = self._labels(actions.reshape(count, -1), batch, keys, device)
        self._inner.add_episode({**sequence, key: labels}, end_state)  # type: ignore[attr-defined]

    def _labels(
        self,
        actions: np.ndarray,
        batch: dict[str, torch.Tensor],
        keys: Sequence[str],
        device: torch.device,
    ) -> np.ndarray:
        """The policy-space latent actions of ``(B, action)`` actions at ``batch``'s rows."""
        with torch.no_grad():
            means = self.encoder(
                torch.as_tensor(actions, device=device), flatten_observation(batch, keys)
            )
            return latent_to_policy(means, self.latent_scale).cpu().numpy()

    def _stacked(
        self,
        key: str,
        agents: list[AgentId],
        observations: Mapping[AgentId, DictObservation],
        device: torch.device,
    ) -> torch.Tensor:
        rows: list[Any] = []
        for agent in agents:
            data = observations[agent].array_data
            if key not in data:
                raise ConfigurationError(
                    f"{type(self).__name__}: agent {agent!r}'s observation has no '{key}' (it has "
                    f"{sorted(data)}); the encoder reads {self.observation_keys or 'every key'}"
                )
            rows.append(np.asarray(data[key], dtype=np.float32))
        return torch.as_tensor(np.stack(rows), device=device)


def _device_of(module: nn.Module) -> torch.device:
    parameter = next(module.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


__all__ = ["ACTIONS_KEY", "MemoryProxyWithEncoder"]
