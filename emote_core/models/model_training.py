"""Training a dynamics model inside the RL loop: :class:`ModelLoss` steps the model on the real
batches (held-out episodes left out), :class:`LossProgressCheck` scores its members on the held-out
episodes, picks the elites and logs whether the held-out error still falls."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from emote_core.callback import Callback, Order
from emote_core.callbacks.logging_mixin import LoggingMixin
from emote_core.callbacks.loss import LossCallback
from emote_core.errors import ConfigurationError, SamplingError, TestCheckFailed
from emote_core.models._callback_parts import (
    check_holdout_fraction,
    is_holdout,
    load_generator,
    observation_rows,
    save_generator,
)
from emote_core.trainer import TrainingShutdownException
from emote_core.utils.checks import positive_int


class ModelLoss(LossCallback):
    """One optimisation step of a dynamics model per update, on the real batch.

    The step runs in ``begin_batch``, before :class:`BatchSampler` may put model data in the
    batch's place; its ``backward`` does nothing. Rows of held-out episodes (see
    :func:`is_holdout`) are left out; the model's normalisers merge the rows it trains on.

    Args:
        model: The :class:`~emote_core.models.model.DynamicModel` (its weights, normalisers and
            elites are this callback's network in checkpoints).
        optimizer: Over the model's parameters.
        table: The replay table the batch was sampled from (``None`` trains on every row).
        holdout_fraction: The fraction of episodes held out, in ``[0, 1)``.
        input_key: The observation key the model reads.
        seed: Seeds the ensemble's bootstrap draws.
        train_interval: Updates per model step (it steps at updates ``train_interval``,
            ``2 * train_interval``, ...).
        name: Keys logs and checkpoints.
        data_group: The data group of the real batch.
        max_grad_norm: Clip of the gradient norm; ``None`` only measures it.
        lr_schedule: Stepped after every optimizer step.

    Raises:
        ConfigurationError: If ``holdout_fraction`` is outside ``[0, 1)`` or ``train_interval``
            is not a positive integer.
    """

    order: ClassVar[int] = Order.DATA + 5
    compiled_methods: ClassVar[tuple[str, ...]] = ("member_loss",)

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
        self.holdout_fraction = check_holdout_fraction(name, holdout_fraction)
        self.input_key = input_key
        self.train_interval = positive_int(name, "train_interval", train_interval)
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
        states = observation_rows(self.name, observation, self.input_key)
        next_states = observation_rows(self.name, next_observation, self.input_key)
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
        rows = self.model.training_rows(
            observation, next_observation, actions, rewards, generator=self.generator
        )
        loss, info = self.member_loss(*rows)
        if "mse" in info:
            self.log_scalar(f"model/{self.name}_train_mse", info["mse"])
        return loss

    def member_loss(
        self, member_in: Tensor, member_target: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The network's loss on its members' rows: what ``training.compile`` compiles. The
        bootstrap draws and the normalisers' update and checks (host reads) stay in
        :meth:`loss`, eager."""
        return self.model.member_loss(member_in, member_target)

    def state_dict(self) -> dict[str, Any]:
        """The model, optimizer, bootstrap generator and step count."""
        state = super().state_dict()
        save_generator(state, self.generator)
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
            load_generator(state_dict, self.generator)
            self.steps = int(state_dict.get("steps", 0))


class LossProgressCheck(LoggingMixin, Callback):
    """Scores the model on held-out episodes every ``interval`` updates: picks the elites and
    logs whether the held-out error still falls.

    Each check computes every member's normalised MSE on up to ``max_rows`` held-out
    transitions (see :func:`is_holdout`), keeps the best members as elites, and logs
    ``model/holdout_nmse`` (the elites' mean), ``model/holdout_nmse_all`` (every member's),
    ``model/holdout_falling`` (1 when it improved on the best by ``min_improvement``, relative)
    and ``model/checks_since_improvement``.

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
        self.holdout_fraction = check_holdout_fraction(name, holdout_fraction)
        self.interval = positive_int(name, "interval", interval)
        self.max_rows = positive_int(name, "max_rows", max_rows)
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
        states = observation_rows(self.name, batch["observation"], self.input_key)
        next_states = observation_rows(self.name, batch["next_observation"], self.input_key)
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


class LossProgressTestCheck(LoggingMixin, Callback):
    """Checks that a dynamics model's prediction error on the training batches falls, then stops
    training after ``num_bp`` updates.

    Each update, before :class:`ModelLoss` steps, it samples the model's next observations and
    rewards for the batch and records their mean absolute errors (logged as
    ``model/observation_prediction_error`` and ``model/reward_prediction_error``). Every
    ``num_bp // 10`` updates (at least 1) they are averaged. After ``num_bp`` updates, for both
    errors, no average may exceed the one four averages earlier by more than ``tolerance``
    (relative; sampling noise once the model has converged) and the last must be below the first.

    Args:
        model: The :class:`~emote_core.models.model.DynamicModel` (with learned rewards).
        num_bp: Updates before the check, which then stops training.
        tolerance: The relative rise between averages four windows apart taken for noise.
        data_group: The data group of the batch.
        input_key: The observation key the model reads.
        seed: Seeds the model's sampling.
        name: Unique name.

    Raises:
        TestCheckFailed: (at the check) naming the averages that rose.
        ConfigurationError: If ``num_bp`` is not a positive integer or ``tolerance`` is
            negative.
    """

    order: ClassVar[int] = Order.DATA + 4  # before ModelLoss steps on the same batch

    def __init__(
        self,
        *,
        model: torch.nn.Module,
        num_bp: int,
        tolerance: float = 0.1,
        data_group: str = "default",
        input_key: str = "obs",
        seed: int = 0,
        name: str = "loss_progress_test_check",
    ) -> None:
        super().__init__(
            name=name, cycle=positive_int(name, "num_bp", num_bp), data_group=data_group
        )
        if not (math.isfinite(tolerance) and tolerance >= 0.0):
            raise ConfigurationError(f"{name}: tolerance must be 0 or more; got {tolerance!r}")
        self.tolerance = float(tolerance)
        self.model = model
        self.input_key = input_key
        self.window = max(1, num_bp // 10)
        self.generator = torch.Generator().manual_seed(int(seed))
        self.averages: list[np.ndarray] = []
        """The windows' mean errors so far, ``[observation, reward]`` each."""
        self._errors: list[list[float]] = []

    def begin_batch(
        self, observation: Any, next_observation: Any, actions: Tensor, rewards: Tensor
    ) -> None:
        """Records the model's prediction errors on this batch."""
        states = observation_rows(self.name, observation, self.input_key)
        next_states = observation_rows(self.name, next_observation, self.input_key)
        predicted, predicted_rewards = self.model.sample(states, actions, generator=self.generator)
        if predicted_rewards is None:
            raise ConfigurationError(
                f"{self.name}: the model predicts no rewards; build it with learned_rewards=True"
            )
        errors = [
            float((predicted - next_states).abs().mean()),
            float((predicted_rewards - rewards.reshape(predicted_rewards.shape)).abs().mean()),
        ]
        self.log_scalar("model/observation_prediction_error", errors[0])
        self.log_scalar("model/reward_prediction_error", errors[1])
        self._errors.append(errors)
        if len(self._errors) >= self.window:
            self.averages.append(np.mean(np.array(self._errors), axis=0))
            self._errors = []

    def end_cycle(self, bp_step: int) -> None:
        """Fails if an average error rose over four windows or did not fall overall; otherwise
        stops training."""
        averages, limit = self.averages, 1.0 + self.tolerance
        rises = [
            f"{what} error {averages[i][j]:.4g} -> {averages[i + 4][j]:.4g} "
            f"(windows {i} and {i + 4})"
            for i in range(len(averages) - 4)
            for j, what in enumerate(("observation", "reward"))
            if averages[i + 4][j] > averages[i][j] * limit
        ]
        if len(averages) > 1:
            rises += [
                f"{what} error {averages[0][j]:.4g} -> {averages[-1][j]:.4g} (first and last)"
                for j, what in enumerate(("observation", "reward"))
                if not averages[-1][j] < averages[0][j]
            ]
        if rises:
            raise TestCheckFailed(
                f"{self.name}: the model's prediction error did not fall by bp_step {bp_step}: "
                + "; ".join(rises)
            )
        raise TrainingShutdownException(f"model prediction error fell over {bp_step} updates")


__all__ = ["LossProgressCheck", "LossProgressTestCheck", "ModelLoss"]
