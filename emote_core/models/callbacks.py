"""The callbacks of MBPO-style training: a dynamics model learns from the real batches, branches
short rollouts from their observations with the current policy, and the RL losses train on a mix
of real and imagined transitions.

Within each update's ``begin_batch`` (before the targets and the losses read the batch):

1. :class:`ModelLoss` takes one optimisation step of the model on the real batch (episodes held
   out for validation excluded);
2. :class:`LossProgressCheck`, every few updates, scores each ensemble member on the held-out
   episodes, keeps the best as elites and logs whether the held-out error still falls;
3. :class:`ModelBasedCollector` rolls the model out from the batch's observations with the
   policy, into the model memory (a table of its own, holding the last few updates' rollouts);
4. :class:`BatchSampler` draws whether this update's RL data group is a batch of the model
   memory or stays the real batch.

Held-out episodes are chosen by their identity (:func:`is_holdout`): a fixed, evenly spread
fraction of the replay table's episodes that the model never trains on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from emote_core.callback import Callback, Order
from emote_core.callbacks.logging_mixin import LoggingMixin
from emote_core.callbacks.loss import LossCallback
from emote_core.errors import ConfigurationError, SamplingError
from emote_core.schedules import BPStepScheduler

_FIBONACCI = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio: spreads consecutive ids evenly


def is_holdout(identities: np.ndarray, fraction: float) -> np.ndarray:
    """Whether each episode identity is held out from model training.

    About ``fraction`` of all identities are, spread evenly over consecutive ones (Fibonacci
    hashing of ``identity + 1``): of a collector's episodes 0, 1, 2, ... the 5th, 10th, ... are
    held out at 0.2, and the first never is. The choice depends on the identity alone, so it
    survives resumes and store round trips.
    """
    ids = np.asarray(identities, dtype=np.int64).astype(np.uint64) + np.uint64(1)
    with np.errstate(over="ignore"):
        hashed = ids * _FIBONACCI  # wraps modulo 2^64, on purpose
    return (hashed >> np.uint64(40)).astype(np.float64) / float(1 << 24) < fraction


def _check_fraction(owner: str, fraction: Any) -> float:
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        raise ConfigurationError(f"{owner}: holdout_fraction must be a number; got {fraction!r}")
    if not 0.0 <= fraction < 1.0:
        raise ConfigurationError(
            f"{owner}: holdout_fraction must be in [0, 1); got {fraction} (0 trains on every "
            "episode and scores the model on training data)"
        )
    return float(fraction)


def _positive(owner: str, what: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{owner}: {what} must be a positive integer; got {value!r}")
    return value


def _observation_rows(owner: str, observation: Any, key: str) -> Tensor:
    if isinstance(observation, Mapping):
        if key not in observation:
            raise ConfigurationError(
                f"{owner}: the batch's observations have no '{key}' (they have "
                f"{sorted(observation)}); set input_key"
            )
        return observation[key]
    return observation


def _generator_state(state: dict[str, Any], generator: torch.Generator) -> None:
    state["generator_state"] = generator.get_state()


def _load_generator(state: Mapping[str, Any], generator: torch.Generator) -> None:
    saved = state.get("generator_state")
    if saved is not None:
        generator.set_state(saved)


class ModelLoss(LossCallback):
    """One optimisation step of a dynamics model per update, on the real batch.

    The step runs in ``begin_batch``, before :class:`BatchSampler` may put model data in the
    batch's place; its ``backward`` does nothing. Rows of held-out episodes (see
    :func:`is_holdout`) are left out; the model's normalisers merge the rows it trains on.

    Args:
        model: The :class:`~emote_core.models.model.DynamicModel` (its weights, normalisers and
            elites are this callback's network in checkpoints).
        optimizer: Over the model's parameters.
        table: The replay table the batch was sampled from: the identities of its last sample
            tell held-out rows apart. ``None`` trains on every row.
        holdout_fraction: The fraction of episodes held out, in ``[0, 1)``.
        input_key: The observation key the model reads.
        seed: Seeds the ensemble's bootstrap draws.
        train_interval: Updates per model step: the model steps at updates ``train_interval``,
            ``2 * train_interval``, ... (an ensemble's step costs several RL updates' worth).
        name: Keys logs and checkpoints.
        data_group: The data group of the real batch.
        max_grad_norm: Clip of the gradient norm; ``None`` only measures it.
        lr_schedule: Stepped after every optimizer step.

    Raises:
        ConfigurationError: If ``holdout_fraction`` is outside ``[0, 1)`` or ``train_interval``
            is not a positive integer.
    """

    order: ClassVar[int] = Order.DATA + 5

    def __init__(
        self,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        table: Any = None,
        holdout_fraction: float = 0.0,
        input_key: str = "obs",
        seed: int = 0,
        train_interval: int = 1,
        name: str = "dynamic_model",
        data_group: str = "default",
        max_grad_norm: float | None = None,
        lr_schedule: torch.optim.lr_scheduler.LRScheduler | None = None,
    ) -> None:
        super().__init__(
            name=name, network=model, optimizer=optimizer, lr_schedule=lr_schedule,
            max_grad_norm=max_grad_norm, data_group=data_group,
        )  # fmt: skip
        self.model = model
        self.table = table
        self.holdout_fraction = _check_fraction(name, holdout_fraction)
        self.input_key = input_key
        self.train_interval = _positive(name, "train_interval", train_interval)
        self.generator = torch.Generator().manual_seed(int(seed))
        self.steps = 0
        """Optimisation steps taken (across resumes)."""

    def _training_rows(self, count: int) -> np.ndarray | None:
        """Which of the batch's ``count`` rows to train on (``None``: all)."""
        if self.table is None or self.holdout_fraction == 0.0:
            return None
        identities, _ = self.table.last_sample_indices
        if len(identities) != count:
            raise ConfigurationError(
                f"{self.name}: the batch has {count} rows but the table's last sample held "
                f"{len(identities)} windows; the model trains on one-transition windows of the "
                "table it is given (memory.rollout_length = 1)"
            )
        return np.flatnonzero(~is_holdout(identities, self.holdout_fraction))

    def begin_batch(
        self,
        observation: Any,
        actions: Tensor,
        next_observation: Any,
        rewards: Tensor | None = None,
        bp_step: int = 1,
    ) -> None:
        """The model's optimisation step on the real batch's training rows, when due."""
        if bp_step % self.train_interval:
            return
        states = _observation_rows(self.name, observation, self.input_key)
        next_states = _observation_rows(self.name, next_observation, self.input_key)
        if next_states.shape[0] != states.shape[0]:
            raise ConfigurationError(
                f"{self.name}: the batch has {states.shape[0]} observations and "
                f"{next_states.shape[0]} next observations; the model trains on one-transition "
                "windows (memory.rollout_length = 1)"
            )
        rows = self._training_rows(states.shape[0])
        if rows is not None:
            if len(rows) == 0:
                return
            index = torch.as_tensor(rows, device=states.device)
            states, next_states, actions = states[index], next_states[index], actions[index]
            rewards = rewards[index] if rewards is not None else None
        super().backward(
            observation=states, next_observation=next_states, actions=actions, rewards=rewards
        )
        self.steps += 1

    def backward(self, **state: Any) -> None:
        """Nothing: the model stepped in ``begin_batch``."""

    def loss(
        self, observation: Tensor, next_observation: Tensor, actions: Tensor, rewards: Tensor
    ) -> Tensor:
        """The model's loss (Gaussian NLL of its ensemble, or MSE) on the given rows."""
        loss, info = self.model.loss(
            observation, next_observation, actions, rewards, generator=self.generator
        )
        if "mse" in info:
            self.log_scalar(f"model/{self.name}_train_mse", info["mse"])
        return loss

    def state_dict(self) -> dict[str, Any]:
        """The model, optimizer, bootstrap generator and step count."""
        state = super().state_dict()
        _generator_state(state, self.generator)
        state["steps"] = self.steps
        return state

    def load_state_dict(
        self,
        state_dict: dict[str, Any],
        load_network: bool = True,
        load_optimizer: bool = True,
        load_hparams: bool = True,
    ) -> None:
        """Restores :meth:`state_dict`'s (the generator and count with the network)."""
        super().load_state_dict(state_dict, load_network, load_optimizer, load_hparams)
        if load_network:
            _load_generator(state_dict, self.generator)
            self.steps = int(state_dict.get("steps", 0))


class LossProgressCheck(LoggingMixin, Callback):
    """Scores the model on held-out episodes every ``interval`` updates: picks the elites and
    logs whether the held-out error still falls.

    Each check takes up to ``max_rows`` transitions of the replay table's held-out episodes (see
    :func:`is_holdout`; with ``holdout_fraction`` 0, a random sample of every episode), computes
    each member's mean squared error in normalised target units, keeps the best members as the
    elites the model samples from, and logs:

    - ``model/holdout_nmse``: the elites' mean normalised MSE (the fraction of the targets'
      variance the model does not explain);
    - ``model/holdout_nmse_all``: every member's mean;
    - ``model/holdout_falling``: 1 when the check improved on the best so far by at least
      ``min_improvement`` (relative), else 0; ``model/checks_since_improvement`` counts the
      checks since it last did.

    Args:
        model: The dynamic model (``member_mse``, ``set_elites``).
        table: The replay table.
        holdout_fraction: As the :class:`ModelLoss` was given.
        interval: Updates between checks.
        max_rows: Most held-out transitions per check (a random subset beyond it).
        min_improvement: The relative fall that counts as still falling.
        input_key: The observation key the model reads.
        seed: Seeds the choice of rows.
        name: Keys logs and checkpoints.

    Raises:
        ConfigurationError: If a count is not a positive integer or a fraction is out of range.
    """

    order: ClassVar[int] = Order.DATA + 6

    def __init__(
        self,
        *,
        model: torch.nn.Module,
        table: Any,
        holdout_fraction: float,
        interval: int = 1_000,
        max_rows: int = 4_096,
        min_improvement: float = 0.01,
        input_key: str = "obs",
        seed: int = 0,
        name: str = "model_progress",
    ) -> None:
        super().__init__(name=name)
        self.model = model
        self.table = table
        self.holdout_fraction = _check_fraction(name, holdout_fraction)
        self.interval = _positive(name, "interval", interval)
        self.max_rows = _positive(name, "max_rows", max_rows)
        if not 0.0 <= min_improvement < 1.0:
            raise ConfigurationError(
                f"{name}: min_improvement must be in [0, 1); got {min_improvement}"
            )
        self.min_improvement = float(min_improvement)
        self.input_key = input_key
        self.rng = np.random.default_rng(seed)
        self.best = math.inf
        self.checks_since_improvement = 0
        self.last_nmse = math.nan
        """The elites' held-out normalised MSE at the latest check (NaN before one)."""

    def holdout_windows(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(identities, offsets)`` of the transitions a check scores (``None``: none held)."""
        index = self.table.index
        slots = np.flatnonzero(index.live)
        identities = index.ids[slots]
        if self.holdout_fraction > 0.0:
            chosen = is_holdout(identities, self.holdout_fraction)
            slots, identities = slots[chosen], identities[chosen]
        lengths = index.lengths[slots].astype(np.int64)
        total = int(lengths.sum())
        if total == 0:
            return None
        picks = np.arange(total)
        if total > self.max_rows:
            picks = np.sort(self.rng.choice(total, size=self.max_rows, replace=False))
        starts = np.cumsum(lengths) - lengths
        episode = np.searchsorted(starts, picks, side="right") - 1
        return identities[episode], picks - starts[episode]

    def begin_batch(self, bp_step: int) -> None:
        """Checks the model when ``bp_step`` is a multiple of ``interval``."""
        if bp_step % self.interval:
            return
        self.check()

    def check(self) -> float | None:
        """Scores the members now and picks the elites; the elites' normalised MSE, or ``None``
        when the table holds no held-out transition yet."""
        windows = self.holdout_windows()
        if windows is None:
            return None
        try:
            batch = self.table.sample_by_index(*windows, 1)
        except SamplingError:  # episodes ejected between the listing and the read
            return None
        states = _observation_rows(self.name, batch["observation"], self.input_key)
        next_states = _observation_rows(self.name, batch["next_observation"], self.input_key)
        scores = self.model.member_mse(states, next_states, batch["actions"], batch["rewards"])
        self.model.set_elites(scores)
        elites = self.model.model.elites
        nmse = float(scores[elites].mean())
        self.last_nmse = nmse
        falling = nmse < self.best * (1.0 - self.min_improvement)
        if falling:
            self.best = nmse
            self.checks_since_improvement = 0
        else:
            self.checks_since_improvement += 1
        self.log_scalar("model/holdout_nmse", nmse)
        self.log_scalar("model/holdout_nmse_all", float(scores.mean()))
        self.log_scalar("model/holdout_rows", float(len(windows[0])))
        self.log_scalar("model/holdout_falling", 1.0 if falling else 0.0)
        self.log_scalar("model/checks_since_improvement", float(self.checks_since_improvement))
        return nmse

    def state_dict(self) -> dict[str, Any]:
        """The best error so far, the count since, and the row generator."""
        state = super().state_dict()
        state.update(
            best=self.best,
            checks_since_improvement=self.checks_since_improvement,
            last_nmse=self.last_nmse,
            rng=self.rng.bit_generator.state,
        )
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
        self.best = float(state_dict.get("best", math.inf))
        self.checks_since_improvement = int(state_dict.get("checks_since_improvement", 0))
        self.last_nmse = float(state_dict.get("last_nmse", math.nan))
        if "rng" in state_dict:
            self.rng.bit_generator.state = state_dict["rng"]


class ModelBasedCollector(LoggingMixin, Callback):
    """Each update, branches model rollouts from the real batch's observations with the current
    policy, into the model memory.

    The rollouts go through the agent-proxy format: ``model_env.rollout(agent, memory, ...)``
    plays ``agent`` (an exploring agent proxy) in the :class:`~emote_core.models.model_env.
    ModelEnv` and hands every step to ``memory`` (a ``MemoryTableProxy`` over the model table),
    so each rollout enters the table as one episode, INTERRUPTED at its length or TERMINAL.

    The rollout length at update ``bp_step`` is ``rollout_scheduler.evaluate_at(bp_step)``
    (rounded down); the model memory is resized to hold the last ``num_bp_to_retain_buffer``
    updates' rollouts at the current length, the oldest ejected first.

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
        self.num_bp_to_retain_buffer = _positive(
            name, "num_bp_to_retain_buffer", num_bp_to_retain_buffer
        )
        if rollout_batch_size is not None:
            _positive(name, "rollout_batch_size", rollout_batch_size)
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
        states = _observation_rows(self.name, observation, self.input_key)
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
        generators: dict[str, Any] = {}
        random_generators = getattr(self.agent, "random_generators", None)
        if callable(random_generators):
            generators.update({f"agent.{k}": g for k, g in random_generators().items()})
        generator = getattr(self.model_env, "generator", None)
        if isinstance(generator, torch.Generator):
            generators["model_env"] = generator
        return generators

    def state_dict(self) -> dict[str, Any]:
        """The generators' states and the logs (the model memory is not saved: a resumed run
        refills it from its first update on)."""
        from emote_core.utils.random_state import capture

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
        from emote_core.utils.random_state import restore

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
        draw = float(torch.rand((), generator=self.generator))
        return draw < self.probability_at(bp_step)

    def begin_batch(self, bp_step: int) -> dict[str, Any] | None:
        """The model batch in the RL data group's place, when drawn and available."""
        probability = self.probability_at(bp_step)
        self.log_scalar("training/prob_sampling_from_model", probability)
        if not self.use_model_batch(bp_step) or not self.dataloader.is_ready():
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
        _generator_state(state, self.generator)
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
        _load_generator(state_dict, self.generator)


__all__ = ["BatchSampler", "LossProgressCheck", "ModelBasedCollector", "ModelLoss", "is_holdout"]
