"""Observation normalisation and reward scaling for any algorithm family.

One :class:`~emote_core.nn.normalization.ObservationNormalizer` per run sits in front of every
network that reads observations: agents act on normalised observations
(:class:`NormalizingAgentProxy`), every training batch's ``observation`` and
``next_observation`` are normalised before targets and losses read them
(:class:`InputNormalization`), and exports carry it inside the graph. Its statistics take in each
observation the run's memory takes in, once: the stores a run starts from, then every collected
step (:class:`NormalizationStatistics`, a memory-proxy wrapper) — never replayed batches. Rewards
are divided by the running standard deviation of the discounted return the same way; the table
and stores keep raw values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from emote_core.callback import Callback, Order
from emote_core.memory.proxy import REWARDS_COLUMN, MemoryProxy
from emote_core.memory.wrappers import MemoryProxyWrapper
from emote_core.nn.normalization import ObservationNormalizer, ReturnNormalizer
from emote_core.typing import AgentId, DictObservation, DictResponse, EpisodeState

NORMALIZATION_CALLBACK = "input_normalization"
"""The checkpoint name of :class:`InputNormalization`'s state."""

_FINAL = (EpisodeState.TERMINAL, EpisodeState.INTERRUPTED)


class NormalizingAgentProxy:
    """An agent proxy that acts on normalised observations: it normalises each observation's
    entries with a (shared) :class:`ObservationNormalizer` and hands them to ``inner``.

    It never updates the statistics (that is :class:`NormalizationStatistics`'s work), so the
    same proxy serves collection and evaluation. Everything else (``policy``, ``input_names``,
    ``random_generators``, ...) is the inner proxy's.

    Args:
        inner: The agent proxy of the family.
        normalizer: The run's observation normaliser.
    """

    def __init__(self, inner: Any, normalizer: ObservationNormalizer) -> None:
        self.__dict__["inner"] = inner
        self.__dict__["normalizer"] = normalizer
        if callable(getattr(inner, "act_batch", None)):
            self.__dict__["act_batch"] = self._act_batch

    def __call__(
        self, observations: Mapping[AgentId, DictObservation]
    ) -> dict[AgentId, DictResponse]:
        """The inner proxy's responses to the observations normalised (one normaliser call
        per entry for all agents)."""
        agents = list(observations)
        arrays = {agent: dict(observations[agent].array_data) for agent in agents}
        for key in self.normalizer.keys:
            holding = [agent for agent in agents if key in arrays[agent]]
            if holding:
                rows = np.stack([np.asarray(arrays[agent][key]) for agent in holding])
                normalized_rows = self._normalize({key: rows})[key]
                for row, agent in enumerate(holding):
                    arrays[agent][key] = normalized_rows[row]
        normalized = {
            agent: DictObservation(
                episode_state=observations[agent].episode_state,
                array_data=arrays[agent],
                rewards=observations[agent].rewards,
                metadata=observations[agent].metadata,
            )
            for agent in agents
        }
        return self.inner(normalized)

    def _act_batch(self, observations: Mapping[str, np.ndarray]) -> Any:
        return self.inner.act_batch(self._normalize(observations))

    def _normalize(self, observation: Mapping[str, Any]) -> dict[str, Any]:
        normalizer = self.normalizer
        out = dict(observation)
        with torch.no_grad():
            for key in normalizer.keys:
                if key in out:
                    value = torch.as_tensor(np.asarray(out[key])).to(normalizer_device(normalizer))
                    out[key] = normalizer.normalize_entry(key, value).cpu().numpy()
        return out

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("inner", "normalizer"):
            raise AttributeError(name)
        return getattr(self.__dict__["inner"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        # ``policy`` and the like belong to the inner proxy (the threaded collector swaps it).
        setattr(self.inner, name, value)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"


def normalizing_agent(agent: Any, normalizer: ObservationNormalizer | None) -> Any:
    """``agent`` acting on observations normalised by ``normalizer`` (``agent`` itself when
    ``normalizer`` is ``None``)."""
    return agent if normalizer is None else NormalizingAgentProxy(agent, normalizer)


def normalizer_device(module: Any) -> Any:
    """The device of a module's first buffer (CPU when it has none)."""
    buffer = next(module.buffers(), None)
    return buffer.device if buffer is not None else torch.device("cpu")


class NormalizationStatistics(MemoryProxyWrapper):
    """A memory-proxy wrapper that merges every observation (and the discounted return of every
    reward) the memory takes in into the run's statistics, once, before passing it on.

    Args:
        inner: The wrapped memory proxy.
        observations: The observation normaliser to update, or ``None``.
        returns: The return normaliser to update, or ``None``.
    """

    def __init__(
        self,
        inner: MemoryProxy,
        *,
        observations: ObservationNormalizer | None,
        returns: ReturnNormalizer | None,
    ) -> None:
        super().__init__(inner)
        self._observations = observations
        self._returns = returns
        self._open_returns: dict[AgentId, float] = {}

    def add(
        self,
        observations: Mapping[AgentId, DictObservation],
        responses: Mapping[AgentId, DictResponse],
    ) -> None:
        """Updates the statistics from one step of every agent, then passes it on."""
        if self._observations is not None and observations:
            keys = self._observations.keys
            self._observations.update(
                {key: np.stack([np.asarray(o.array_data[key]) for o in observations.values()])
                 for key in keys if all(key in o.array_data for o in observations.values())}
            )  # fmt: skip
        if self._returns is not None:
            returns = []
            for agent, observation in observations.items():
                if observation.episode_state == EpisodeState.INITIAL:
                    self._open_returns[agent] = 0.0
                    continue
                reward = (observation.rewards or {}).get("reward")
                if reward is None:
                    continue
                running = self._returns.gamma * self._open_returns.get(agent, 0.0) + float(reward)
                returns.append(running)
                if observation.episode_state in _FINAL:
                    self._open_returns.pop(agent, None)
                else:
                    self._open_returns[agent] = running
            self._returns.update(np.asarray(returns, dtype=np.float64))
        self._inner.add(observations, responses)

    def add_episode(self, sequence: Mapping[str, np.ndarray], end_state: EpisodeState) -> None:
        """Updates the statistics from a whole episode, then passes it on."""
        self.record_episode(sequence)
        super().add_episode(sequence, end_state)

    def record_episode(self, sequence: Mapping[str, np.ndarray]) -> None:
        """Merges one episode's observations and discounted returns into the statistics."""
        if self._observations is not None:
            self._observations.update(sequence)
        rewards = sequence.get(REWARDS_COLUMN)
        if self._returns is not None and rewards is not None:
            self._returns.update(self._returns.discounted_returns(np.asarray(rewards)))


class InputNormalization(Callback):
    """Normalises each training batch's observations and scales its rewards, before any target
    or loss reads them, and keeps both normalisers' statistics in checkpoints.

    Args:
        observations: The run's observation normaliser, or ``None`` to leave observations raw.
        returns: The return normaliser whose standard deviation divides rewards, or ``None``.
        data_group: The batch's group to normalise.
    """

    order = Order.DATA + 10

    def __init__(
        self,
        *,
        observations: ObservationNormalizer | None,
        returns: ReturnNormalizer | None,
        data_group: str = "default",
        name: str = NORMALIZATION_CALLBACK,
    ) -> None:
        super().__init__(name=name, data_group=data_group)
        self.observations = observations
        self.returns = returns

    def begin_batch(
        self,
        observation: Mapping[str, Tensor],
        next_observation: Mapping[str, Tensor],
        rewards: Tensor,
    ) -> dict[str, Any]:
        """The batch's ``observation``, ``next_observation`` and ``rewards``, normalised."""
        group: dict[str, Any] = {}
        if self.observations is not None:
            group["observation"] = self.observations(observation)
            group["next_observation"] = self.observations(next_observation)
        if self.returns is not None:
            group["rewards"] = self.returns.scale(rewards)
        return {self.data_group: group}

    def state_dict(self) -> dict[str, Any]:
        """The statistics of both normalisers."""
        state = super().state_dict()
        if self.observations is not None:
            state["observations"] = self.observations.state_dict()
        if self.returns is not None:
            state["returns"] = self.returns.state_dict()
        return state

    def load_state_dict(
        self,
        state_dict: dict[str, Any],
        load_network: bool = True,
        load_optimizer: bool = True,
        load_hparams: bool = True,
    ) -> None:
        """Restores the statistics."""
        super().load_state_dict(state_dict, load_network, load_optimizer, load_hparams)
        if self.observations is not None and "observations" in state_dict:
            self.observations.load_state_dict(state_dict["observations"])
        if self.returns is not None and "returns" in state_dict:
            self.returns.load_state_dict(state_dict["returns"])


__all__ = [
    "NORMALIZATION_CALLBACK",
    "InputNormalization",
    "NormalizationStatistics",
    "NormalizingAgentProxy",
    "normalizer_device",
    "normalizing_agent",
]
