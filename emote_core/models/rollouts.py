"""Using a dynamics model inside the RL loop: :class:`ModelBasedCollector` branches rollouts from
the real batch's observations into a model memory, :class:`BatchSampler` decides per update
whether the RL losses train on a batch of it."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch

from emote_core.callback import Callback, Order
from emote_core.callbacks.logging_mixin import LoggingMixin
from emote_core.errors import ConfigurationError
from emote_core.models._callback_parts import (
    load_generator,
    observation_rows,
    save_generator,
)
from emote_core.schedules import BPStepScheduler
from emote_core.utils.checks import positive_int
from emote_core.utils.random_state import capture, generators_of, restore


class ModelBasedCollector(LoggingMixin, Callback):
    """Each update, branches model rollouts from the real batch's observations with the current
    policy, into the model memory.

    Each rollout enters the model table as one episode (INTERRUPTED at its length, or TERMINAL)
    through ``memory``. Its length at update ``k`` is ``rollout_scheduler.evaluate_at(k)``
    (rounded down); the memory is resized to hold the last ``num_bp_to_retain_buffer`` updates'
    rollouts.

    Args:
        model_env: Simulates the rollouts.
        agent: Acts in them (the training policy, exploring).
        memory: Receives them (it has the model table's ``resize``).
        rollout_scheduler: Rollout length by update; every value must be at least 1.
        num_bp_to_retain_buffer: Updates whose rollouts the model memory keeps.
        rollout_batch_size: Rollouts per update, from the batch's first rows (``None``: all).
        warmup_bp_steps: Updates before the first rollout (the model trains meanwhile).
        input_key: The observation key rollouts start from.
        data_group: The data group of the real batch.
        name: Keys logs and checkpoints.

    Raises:
        ConfigurationError: If a count is not a positive integer or a rollout length below 1 is
            scheduled.
    """

    order: ClassVar[int] = Order.DATA + 10

    def __init__(
        self,
        *,
        model_env: Any,
        agent: Any,
        memory: Any,
        rollout_scheduler: BPStepScheduler,
        num_bp_to_retain_buffer: int = 1_000,
        rollout_batch_size: int | None = None,
        warmup_bp_steps: int = 0,
        input_key: str = "obs",
        data_group: str = "default",
        name: str = "model_collector",
    ) -> None:
        super().__init__(name=name, data_group=data_group)
        self.model_env = model_env
        self.agent = agent
        self.memory = memory
        self.rollout_scheduler = rollout_scheduler
        self.num_bp_to_retain_buffer = positive_int(
            name, "num_bp_to_retain_buffer", num_bp_to_retain_buffer
        )
        if rollout_batch_size is not None:
            positive_int(name, "rollout_batch_size", rollout_batch_size)
        self.rollout_batch_size = rollout_batch_size
        if isinstance(warmup_bp_steps, bool) or not isinstance(warmup_bp_steps, int):
            raise ConfigurationError(f"{name}: warmup_bp_steps must be an integer >= 0")
        if warmup_bp_steps < 0:
            raise ConfigurationError(f"{name}: warmup_bp_steps must be >= 0; got {warmup_bp_steps}")
        self.warmup_bp_steps = warmup_bp_steps
        self.input_key = input_key
        self.rollout_length = self._length_at(warmup_bp_steps + 1)
        self._capacity: int | None = None
        self.rollouts = 0
        """Rollouts collected (since this process started)."""

    def _length_at(self, bp_step: int) -> int:
        value = self.rollout_scheduler.evaluate_at(bp_step)
        if not math.isfinite(value) or value < 1:
            raise ConfigurationError(
                f"{self.name}: the rollout schedule gives a rollout length of {value} at update "
                f"{bp_step}; rollout lengths must be at least 1"
            )
        return int(value)

    def _fit_memory(self, rollouts: int) -> None:
        capacity = rollouts * self.rollout_length * self.num_bp_to_retain_buffer
        if capacity != self._capacity:
            self.memory.resize(capacity)
            self._capacity = capacity

    def begin_batch(self, observation: Any, bp_step: int) -> None:
        """Rolls the model out from the batch's observations (after the warm-up)."""
        if bp_step <= self.warmup_bp_steps:
            return
        self.rollout_length = self._length_at(bp_step)
        states = observation_rows(self.name, observation, self.input_key)
        if self.rollout_batch_size is not None:
            states = states[: self.rollout_batch_size]
        self._fit_memory(states.shape[0])
        summary = self.model_env.rollout(self.agent, self.memory, states, self.rollout_length)
        self.rollouts += states.shape[0]
        self.log_scalar("training/model_rollout_length", self.rollout_length)
        for key in ("reward", "terminated", "interrupted"):
            if key in summary:
                self.log_scalar(f"model/rollout_{key}", summary[key])

    def random_generators(self) -> dict[str, Any]:
        """The acting agent's and the model environment's generators."""
        generators: dict[str, Any] = generators_of(self.agent, "agent.")
        generator = getattr(self.model_env, "generator", None)
        if isinstance(generator, torch.Generator):
            generators["model_env"] = generator
        return generators

    def state_dict(self) -> dict[str, Any]:
        """The generators' states and the logs (the model memory is not saved: a resumed run
        refills it from its first update on)."""
        state = super().state_dict()
        state["random_state"] = capture(self.random_generators())
        return state

    def load_state_dict(
        self,
        state_dict: dict[str, Any],
        load_network: bool = True,
        load_optimizer: bool = True,
        load_hparams: bool = True,
    ) -> None:
        """Restores :meth:`state_dict`'s."""
        super().load_state_dict(state_dict, load_network, load_optimizer, load_hparams)
        restore(self.random_generators(), state_dict.get("random_state", {}), owner=self.name,
                strict=False)  # fmt: skip


class BatchSampler(LoggingMixin, Callback):
    """Per update, a Bernoulli draw with a scheduled probability decides whether the RL data
    group holds a batch of the model memory or the real batch.

    Args:
        dataloader: Samples the model memory (a ``MemoryLoader`` over the model table).
        prob_scheduler: The probability of model data by update (``evaluate_at(bp_step)``),
            within ``[0, 1]``.
        rl_data_group: The data group the RL losses read; a model batch replaces its values.
        seed: Seeds the draws (or pass ``generator``).
        generator: The draws' generator.
        name: Keys logs and checkpoints.

    While the model memory cannot fill a batch, the real batch stays.
    """

    order: ClassVar[int] = Order.DATA + 15

    def __init__(
        self,
        *,
        dataloader: Any,
        prob_scheduler: BPStepScheduler,
        rl_data_group: str = "default",
        seed: int = 0,
        generator: torch.Generator | None = None,
        name: str = "batch_sampler",
    ) -> None:
        super().__init__(name=name)
        self.dataloader = dataloader
        self.prob_scheduler = prob_scheduler
        self.rl_data_group = rl_data_group
        self.generator = generator if generator is not None else torch.Generator()
        if generator is None:
            self.generator.manual_seed(int(seed))
        self.model_batches = 0
        """Updates whose RL data came from the model memory (since this process started)."""

    def probability_at(self, bp_step: int) -> float:
        """The scheduled probability of model data at ``bp_step``.

        Raises:
            ConfigurationError: If the schedule leaves ``[0, 1]``.
        """
        probability = self.prob_scheduler.evaluate_at(bp_step)
        if not 0.0 <= probability <= 1.0:
            raise ConfigurationError(
                f"{self.name}: the schedule gives a probability of {probability} at update "
                f"{bp_step}; it must be within [0, 1]"
            )
        return float(probability)

    def use_model_batch(self, bp_step: int) -> bool:
        """The Bernoulli draw of update ``bp_step`` (one draw from the generator per call)."""
        return self._draw(self.probability_at(bp_step))

    def _draw(self, probability: float) -> bool:
        return float(torch.rand((), generator=self.generator)) < probability

    def begin_batch(self, bp_step: int) -> dict[str, Any] | None:
        """The model batch in the RL data group's place, when drawn and available."""
        probability = self.probability_at(bp_step)
        self.log_scalar("training/prob_sampling_from_model", probability)
        if not self._draw(probability) or not self.dataloader.is_ready():
            return None
        self.model_batches += 1
        batch = self.dataloader.sample()
        data = batch.get(self.dataloader.data_group, batch)
        return {self.rl_data_group: data}

    def random_generators(self) -> dict[str, Any]:
        """The draws' generator."""
        return {"draws": self.generator}

    def state_dict(self) -> dict[str, Any]:
        """The draws' generator and the logs."""
        state = super().state_dict()
        save_generator(state, self.generator)
        return state

    def load_state_dict(
        self,
        state_dict: dict[str, Any],
        load_network: bool = True,
        load_optimizer: bool = True,
        load_hparams: bool = True,
    ) -> None:
        """Restores :meth:`state_dict`'s."""
        super().load_state_dict(state_dict, load_network, load_optimizer, load_hparams)
        load_generator(state_dict, self.generator)


__all__ = ["BatchSampler", "ModelBasedCollector"]
