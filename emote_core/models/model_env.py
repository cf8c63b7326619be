"""ModelEnv: a vector of model-simulated environments, started from real observations.

:class:`ModelEnv` steps ``B`` rollouts with a learned dynamics model, as tensors
(:meth:`ModelEnv.reset`, :meth:`ModelEnv.step`) or in the agent-proxy format
(:meth:`ModelEnv.dict_reset`, :meth:`ModelEnv.dict_step`, :meth:`ModelEnv.rollout`). A rollout
ends TERMINAL when the termination function says so and INTERRUPTED after ``rollout_length``
steps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from emote_core.errors import ConfigurationError
from emote_core.memory.proxy import MemoryProxy
from emote_core.models.agent_format import initial_observations, stack_actions, step_observations
from emote_core.models.termination import TerminationFnType, termination_function
from emote_core.proxies.base import AgentProxy
from emote_core.typing import AgentId, DictObservation, DictResponse, RewardFnType
from emote_core.utils.checks import positive_int


class DynamicsSampler(Protocol):
    """What :class:`ModelEnv` simulates with: a model that samples next observations."""

    def sample(
        self, observation: Tensor, action: Tensor, *, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """Samples ``(next_observation (B, O), reward (B, 1) or None)`` for ``(B, O)``
        observations and ``(B, A)`` actions; ``None`` when the model learns no rewards."""
        ...


class ModelEnv:
    """``B`` rollouts of a learned dynamics model, stepped together until each one ends.

    Args:
        model: Predicts next observations (and, optionally, rewards); see
            :class:`DynamicsSampler`. It is called under ``torch.no_grad()``.
        termination_fn: ``fn(actions, next_observation) -> (B, 1) bool`` (numbers count as
            terminal where they are not 0), or the name of a registered one (see
            :mod:`emote_core.models.termination`).
        reward_fn: ``reward_fn(actions, next_observation) -> (B, 1)``: when given, rewards come
            from it; when ``None``, the model must return learned rewards.
        generator: Passed to ``model.sample`` so rollouts are reproducible.
        input_key: The observation key of the dict API (what the agent proxy reads).
        device: Where observations are moved at reset; ``None`` keeps them where they are.

    Raises:
        ConfigurationError: If ``model`` has no ``sample`` method, ``termination_fn`` is neither
            callable nor a registered name, ``reward_fn`` is not callable, ``generator`` is not a
            ``torch.Generator`` or ``input_key`` is not a non-empty string.
    """

    def __init__(
        self,
        *,
        model: DynamicsSampler,
        termination_fn: TerminationFnType | str,
        reward_fn: RewardFnType | None = None,
        generator: torch.Generator | None = None,
        input_key: str = "obs",
        device: torch.device | str | None = None,
    ) -> None:
        if not callable(getattr(model, "sample", None)):
            raise ConfigurationError(
                "ModelEnv's model must have a sample(observation, action, *, generator) method "
                f"returning (next_observation, reward or None); got {type(model).__name__}"
            )
        if isinstance(termination_fn, str):
            termination_fn = termination_function(termination_fn)
        elif not callable(termination_fn):
            raise ConfigurationError(
                "ModelEnv's termination_fn must be a callable fn(actions, next_observation) or "
                f"the name of a registered one; got {termination_fn!r}"
            )
        if reward_fn is not None and not callable(reward_fn):
            raise ConfigurationError(
                "ModelEnv's reward_fn must be None (use the model's learned rewards) or a "
                f"callable reward_fn(actions, next_observation); got {reward_fn!r}"
            )
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ConfigurationError(
                f"ModelEnv's generator must be a torch.Generator or None; got {generator!r}"
            )
        if not isinstance(input_key, str) or not input_key:
            raise ConfigurationError(
                f"ModelEnv's input_key must be a non-empty string; got {input_key!r}"
            )
        self.model = model
        self.termination_fn = termination_fn
        self.reward_fn = reward_fn
        self.generator = generator
        self.input_key = input_key
        self.device = None if device is None else torch.device(device)
        self._observation: Tensor | None = None
        self._running = torch.zeros(0, dtype=torch.long)
        self._agents = np.zeros(0, dtype=np.int64)
        self._next_agent = 0
        self._num_envs = 0
        self._steps = 0
        self._rollout_length = 0

    # State.

    @property
    def num_envs(self) -> int:
        """The number of rollouts the last reset started."""
        return self._num_envs

    @property
    def running(self) -> Tensor:
        """The row numbers (in the last reset's batch) of the rollouts still running, in the
        order :meth:`step` takes their actions."""
        return self._running

    @property
    def running_agents(self) -> list[AgentId]:
        """The agent ids of the rollouts still running, in the order of :attr:`running`."""
        return self._agents.tolist()

    @property
    def steps(self) -> int:
        """Steps taken since the last reset."""
        return self._steps

    @property
    def rollout_length(self) -> int:
        """The most steps a rollout of the last reset takes."""
        return self._rollout_length

    # Tensor API.

    def reset(self, observation: Tensor, rollout_length: int) -> Tensor:
        """Starts one rollout from each row of ``observation``; earlier rollouts are dropped.

        Args:
            observation: ``(B, O)`` real observations, ``B >= 1``.
            rollout_length: The most steps each rollout takes (a positive integer).

        Returns:
            The observations the rollouts start from (on :attr:`device`, when set).

        Raises:
            ConfigurationError: If ``rollout_length`` is not a positive integer or
                ``observation`` is not a non-empty ``(B, O)`` batch.
        """
        length = positive_int("ModelEnv", "rollout_length", rollout_length)
        batch = torch.as_tensor(observation).detach()
        if batch.ndim != 2 or batch.shape[0] == 0:
            raise ConfigurationError(
                "ModelEnv.reset takes a (B, O) batch of observations with at least one row; got "
                f"shape {tuple(batch.shape)} — reshape single observations to (1, O)"
            )
        if not batch.is_floating_point():
            batch = batch.float()
        if self.device is not None:
            batch = batch.to(self.device)
        count = batch.shape[0]
        self._observation = batch
        self._running = torch.arange(count, device=batch.device)
        self._agents = np.arange(self._next_agent, self._next_agent + count, dtype=np.int64)
        self._next_agent += count
        self._num_envs = count
        self._steps = 0
        self._rollout_length = length
        return batch

    def step(self, actions: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Steps every running rollout with its row of ``actions``.

        Args:
            actions: ``(B', A)``, one row per running rollout, in the order of :attr:`running`.

        Returns:
            ``(next_observation (B', O), rewards (B', 1), terminated (B', 1) bool,
            truncated (B', 1) bool)``, rows in the order :attr:`running` had before the step.
            Rows that terminated or were truncated leave :attr:`running`.

        Raises:
            ConfigurationError: If no rollout is running, ``actions`` has not one row per
                running rollout, there are no rewards (no ``reward_fn`` and no learned rewards),
                or the model, reward or termination function returns the wrong shape.
        """
        observation = self._require_running("step")
        count = observation.shape[0]
        actions = torch.as_tensor(actions, device=observation.device)
        if actions.ndim != 2 or actions.shape[0] != count:
            raise ConfigurationError(
                f"ModelEnv.step takes one action row per running rollout, a ({count}, A) "
                f"tensor; got shape {tuple(actions.shape)} — running holds the rows to act for"
            )
        with torch.no_grad():
            next_observation, learned = self.model.sample(
                observation, actions, generator=self.generator
            )
            if tuple(next_observation.shape) != tuple(observation.shape):
                raise ConfigurationError(
                    f"the model's sample returned next observations of shape "
                    f"{tuple(next_observation.shape)} for observations of shape "
                    f"{tuple(observation.shape)}; it must return one of the same shape"
                )
            rewards = self._rewards(actions, next_observation, learned, count)
            terminated = self._terminated(actions, next_observation, count)
        self._steps += 1
        if self._steps >= self._rollout_length:
            truncated = ~terminated
        else:
            truncated = torch.zeros_like(terminated)
        ended = (terminated | truncated).squeeze(-1)
        keep = ~ended.cpu().numpy()
        if keep.all():
            self._observation = next_observation
        else:
            kept = ~ended
            self._observation = next_observation[kept]
            self._running = self._running[kept]
            self._agents = self._agents[keep]
        return next_observation, rewards, terminated, truncated

    def _require_running(self, method: str) -> Tensor:
        if self._observation is None:
            raise ConfigurationError(f"ModelEnv.{method} needs rollouts; call reset first")
        if self._observation.shape[0] == 0:
            raise ConfigurationError(
                f"ModelEnv.{method}: all {self.num_envs} rollouts have ended (after "
                f"{self._steps} steps of at most {self._rollout_length}); call reset to start "
                "new ones"
            )
        return self._observation

    def _rewards(
        self, actions: Tensor, next_observation: Tensor, learned: Tensor | None, count: int
    ) -> Tensor:
        if self.reward_fn is not None:
            rewards, source = self.reward_fn(actions, next_observation), "reward_fn"
        elif learned is None:
            raise ConfigurationError(
                "ModelEnv has no reward_fn and the model returned no learned rewards; pass "
                "reward_fn=... (called as reward_fn(actions, next_observation)) or use a model "
                "that learns rewards"
            )
        else:
            rewards, source = learned, "the model's learned reward"
        rewards = torch.as_tensor(rewards)
        if tuple(rewards.shape) not in ((count,), (count, 1)):
            raise ConfigurationError(
                f"{source} must give one reward per rollout, shape ({count}, 1); got shape "
                f"{tuple(rewards.shape)}"
            )
        return rewards.reshape(count, 1)

    def _terminated(self, actions: Tensor, next_observation: Tensor, count: int) -> Tensor:
        terminated = self.termination_fn(actions, next_observation)
        if (
            isinstance(terminated, Tensor)
            and terminated.dtype != torch.bool
            and not terminated.is_complex()
        ):
            terminated = terminated != 0  # 0/1 flags, as upstream's truth test read them
        if not isinstance(terminated, Tensor) or tuple(terminated.shape) not in (
            (count,),
            (count, 1),
        ):
            got = (
                f"{terminated.dtype} of shape {tuple(terminated.shape)}"
                if isinstance(terminated, Tensor)
                else type(terminated).__name__
            )
            raise ConfigurationError(
                f"termination_fn must return a bool (or 0/1) tensor of shape ({count}, 1); got "
                f"{got}"
            )
        return terminated.reshape(count, 1)

    # Agent-proxy API.

    def dict_reset(
        self, observation: Tensor | Mapping[str, Any], rollout_length: int
    ) -> dict[AgentId, DictObservation]:
        """Starts rollouts as :meth:`reset` does and reports them as agents.

        Args:
            observation: ``(B, O)`` observations, or a mapping holding them under
                :attr:`input_key` (as a sampled batch's ``"observation"`` entry does).
            rollout_length: The most steps each rollout takes (a positive integer).

        Returns:
            One ``INITIAL`` observation per row, ``{input_key: float32 row}``, under agent ids
            never used before by this environment.

        Raises:
            ConfigurationError: As :meth:`reset` does, or if the mapping lacks :attr:`input_key`.
        """
        if isinstance(observation, Mapping):
            if self.input_key not in observation:
                raise ConfigurationError(
                    f"ModelEnv.dict_reset: the observations have no '{self.input_key}' (they "
                    f"have {sorted(observation)}); set input_key to the key the model reads"
                )
            observation = observation[self.input_key]
        batch = self.reset(observation, rollout_length)
        # A copy: the memory keeps these rows, and the caller may reuse its tensor.
        rows = batch.to("cpu", torch.float32).numpy().copy()
        return initial_observations(self._agents.tolist(), rows, self.input_key)

    def dict_step(
        self, responses: Mapping[AgentId, DictResponse]
    ) -> tuple[dict[AgentId, DictObservation], dict[str, float]]:
        """Steps every running agent with ``responses[agent].list_data["actions"]``.

        Returns:
            Each stepped agent's next observation — ``RUNNING``, ``TERMINAL`` or
            ``INTERRUPTED`` (at the length limit) with ``rewards={"reward": r}`` — and a summary:
            ``"reward"`` (mean over the stepped agents), ``"terminated"`` and ``"interrupted"``
            (agents that ended at this step) and ``"running"`` (agents left). Agents that ended
            do not appear in later steps.

        Raises:
            ConfigurationError: If a running agent has no response or no ``"actions"``, a
                response names an agent that is not running, or as :meth:`step` does.
        """
        observations, _, info = self._dict_step(responses)
        return observations, info

    def _dict_step(
        self, responses: Mapping[AgentId, DictResponse]
    ) -> tuple[dict[AgentId, DictObservation], list[AgentId], dict[str, float]]:
        observation = self._require_running("dict_step")
        agents = self._agents.tolist()
        actions = stack_actions(agents, responses)
        batch = torch.as_tensor(actions, dtype=observation.dtype, device=observation.device)
        next_observation, rewards, terminated, truncated = self.step(batch)
        # A copy, as at reset: the memory keeps these rows while the model may see the tensor.
        rows = next_observation.to("cpu", torch.float32).numpy().copy()
        reward_values = rewards.reshape(-1).tolist()
        flags = torch.cat((terminated, truncated), dim=1).cpu().numpy()
        stepped, ended = step_observations(
            agents, rows, reward_values, flags[:, 0], flags[:, 1], self.input_key
        )
        info = {
            "reward": float(np.mean(reward_values)),
            "terminated": float(flags[:, 0].sum()),
            "interrupted": float(flags[:, 1].sum()),
            "running": float(self._agents.size),
        }
        return stepped, ended, info

    def rollout(
        self,
        agent: AgentProxy | Callable[[Mapping[AgentId, DictObservation]], dict],
        memory: MemoryProxy,
        observation: Tensor | Mapping[str, Any],
        rollout_length: int,
    ) -> dict[str, float]:
        """Plays rollouts from ``observation`` to their end, recording every step in ``memory``.

        Each step gives the observations and the agent's responses to ``memory.add``; the final
        observations of rollouts that ended are given at once, with no responses, so their
        episodes close in the memory (as :class:`~emote_core.env.collectors.GymCollector` does).

        Args:
            agent: Answers observations with actions (an agent proxy).
            memory: Receives every step (a :class:`~emote_core.memory.proxy.MemoryTableProxy`).
            observation: The start observations, as :meth:`dict_reset` takes them.
            rollout_length: The most steps each rollout takes.

        Returns:
            ``"episodes"`` (rollouts started), ``"transitions"`` (steps recorded), ``"reward"``
            (mean reward per transition), ``"terminated"`` and ``"interrupted"`` (how the
            rollouts ended).

        Raises:
            ConfigurationError: As :meth:`dict_reset` and :meth:`dict_step` do.
        """
        observations = self.dict_reset(observation, rollout_length)
        summary = {"episodes": float(len(observations)), "transitions": 0.0, "reward": 0.0}
        summary.update(terminated=0.0, interrupted=0.0)
        reward_sum = 0.0
        while observations:
            responses = agent(observations)
            memory.add(observations, responses)
            observations, ended, info = self._dict_step(responses)
            summary["transitions"] += len(observations)
            reward_sum += info["reward"] * len(observations)
            summary["terminated"] += info["terminated"]
            summary["interrupted"] += info["interrupted"]
            if ended:
                memory.add({a: observations.pop(a) for a in ended}, {})
        summary["reward"] = reward_sum / summary["transitions"]
        return summary

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_envs={self.num_envs}, running={len(self._agents)}, "
            f"steps={self._steps}, rollout_length={self._rollout_length}, "
            f"input_key={self.input_key!r})"
        )


__all__ = ["DynamicsSampler", "ModelEnv"]
