"""Model-based RL as a registered add-on: the recipe table ``[model]`` (a dynamics ensemble, its
training and MBPO's rollouts) and the callbacks that train and use it beside an algorithm.

``addons = ["model"]`` on a SAC recipe trains MBPO-style: every update the ensemble takes a step on
the real batch, short rollouts branch from the batch's observations with the current policy into a
model memory, and the RL losses train on a batch of that memory with probability
``model.model_data_probability`` (else on the real batch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

import torch

from emote_core.algorithms.registry import (
    AddOn,
    AlgorithmFamily,
    BuildContext,
    Networks,
    TrainingParts,
    register_addon,
)
from emote_core.callback import Callback
from emote_core.errors import ConfigurationError
from emote_core.schedules import TruncatedLinearSchedule
from emote_core.spaces import DiscreteSpace, MDPSpace


class ModelKind(StrEnum):
    """What predicts the next observation (``[model] kind``)."""

    GAUSSIAN_ENSEMBLE = "gaussian_ensemble"
    """An ensemble of Gaussian MLPs, each trained on its own bootstrap of every batch; rollouts
    sample one elite member per row (MBPO's and mbrl-lib's model)."""
    DETERMINISTIC = "deterministic"
    """One MLP trained on the squared error; rollouts take its prediction."""


class Activation(StrEnum):
    """The hidden layers' activation (``[model] activation``)."""

    SILU = "silu"
    RELU = "relu"
    TANH = "tanh"
    ELU = "elu"


@dataclass
class ModelConfig:
    """A learned dynamics model and MBPO-style training on its rollouts (the table ``[model]``).

    Counts of updates are training updates (bp steps); with ``training.bp_steps_per_inference =
    20`` there are 20 per env step.
    """

    kind: ModelKind = ModelKind.GAUSSIAN_ENSEMBLE
    """``gaussian_ensemble`` or ``deterministic``."""
    ensemble_size: int = 7
    """Members of the ensemble (``gaussian_ensemble``)."""
    num_elites: int = 5
    """Members rollouts sample from: the best on held-out episodes at the latest check."""
    hidden_size: int = 200
    """Width of each hidden layer."""
    num_layers: int = 4
    """Hidden layers per member."""
    activation: Activation = Activation.SILU
    """The hidden layers' activation."""
    termination: str = "none"
    """The environment's known termination, by name (``none``, ``pendulum``,
    ``inverted_pendulum``, ``hopper``, ...): a rollout ends TERMINAL where it says so."""
    no_delta_dims: list[int] = field(default_factory=list)
    """Observation dimensions predicted as values, not as changes from the observation."""
    learning_rate: float = 1e-3
    """Adam learning rate of the model."""
    weight_decay: float = 5e-5
    """Adam weight decay of the model."""
    train_interval: int = 1
    """Updates per model step (the model steps on every ``train_interval``-th update's batch)."""
    holdout_fraction: float = 0.2
    """Fraction of the real episodes the model never trains on; they pick the elites and measure
    its held-out error."""
    check_interval: int = 1_000
    """Updates between held-out checks (elites picked, ``model/holdout_nmse`` logged)."""
    warmup_updates: int = 1_000
    """Updates the model trains before the first rollout; the RL losses train on real data
    meanwhile."""
    rollouts_per_update: int = 256
    """Rollouts branched per update, from the real batch's first observations (at most
    ``memory.batch_size``)."""
    rollout_length: int = 1
    """Model steps per rollout at first."""
    final_rollout_length: int | None = None
    """Rollout length reached at ``rollout_ramp_end`` (linear from ``rollout_ramp_begin``);
    unset keeps ``rollout_length``."""
    rollout_ramp_begin: int = 0
    """The last update at ``rollout_length``."""
    rollout_ramp_end: int = 0
    """The first update at ``final_rollout_length``."""
    retain_updates: int = 1_000
    """Updates whose rollouts the model memory keeps (older ones are ejected)."""
    model_data_probability: float = 0.95
    """Chance that an update's RL batch comes from the model memory, once it holds a batch."""


def _positive(source: str, key: str, value: int) -> None:
    if value < 1:
        raise ConfigurationError(f"{source}: 'model.{key}' must be at least 1; got {value}")


@register_addon
class ModelBasedAddOn(AddOn):
    """Trains a dynamics ensemble from the replay memory and the algorithm on its short rollouts
    (MBPO)."""

    name: ClassVar[str] = "model"
    config_class: ClassVar[type] = ModelConfig
    summary: ClassVar[str] = "a learned dynamics model: MBPO-style training on its rollouts"

    def validate(self, config: ModelConfig, *, source: str) -> None:
        from emote_core.models.termination import termination_function

        for key in ("ensemble_size", "num_elites", "hidden_size", "num_layers", "check_interval",
                    "rollouts_per_update", "rollout_length", "retain_updates",
                    "train_interval"):  # fmt: skip
            _positive(source, key, getattr(config, key))
        if config.final_rollout_length is not None:
            _positive(source, "final_rollout_length", config.final_rollout_length)
        if config.num_elites > config.ensemble_size:
            raise ConfigurationError(
                f"{source}: 'model.num_elites' ({config.num_elites}) must not exceed "
                f"'model.ensemble_size' ({config.ensemble_size})"
            )
        if config.kind is ModelKind.DETERMINISTIC and (config.ensemble_size, config.num_elites) != (
            1, 1,
        ):  # fmt: skip
            raise ConfigurationError(
                f"{source}: 'model.kind' = \"deterministic\" is one network; set "
                "model.ensemble_size = 1 and model.num_elites = 1"
            )
        for key in ("warmup_updates", "rollout_ramp_begin", "rollout_ramp_end"):
            if getattr(config, key) < 0:
                raise ConfigurationError(
                    f"{source}: 'model.{key}' must be >= 0; got {getattr(config, key)}"
                )
        if config.rollout_ramp_end < config.rollout_ramp_begin:
            raise ConfigurationError(
                f"{source}: 'model.rollout_ramp_end' ({config.rollout_ramp_end}) is before "
                f"'model.rollout_ramp_begin' ({config.rollout_ramp_begin})"
            )
        for key, low, high in (("holdout_fraction", 0.0, 1.0),
                               ("model_data_probability", 0.0, 1.0 + 1e-12)):  # fmt: skip
            value = getattr(config, key)
            if not (math.isfinite(value) and low <= value < high):
                bounds = "[0, 1)" if key == "holdout_fraction" else "[0, 1]"
                raise ConfigurationError(
                    f"{source}: 'model.{key}' must be in {bounds}; got {value}"
                )
        if not (math.isfinite(config.weight_decay) and config.weight_decay >= 0.0):
            raise ConfigurationError(
                f"{source}: 'model.weight_decay' must be finite and >= 0; got {config.weight_decay}"
            )
        try:
            termination_function(config.termination)
        except ConfigurationError as error:
            raise ConfigurationError(f"{source}: 'model.termination': {error}") from None

    def check(
        self, config: ModelConfig, algorithm: AlgorithmFamily, spaces: MDPSpace, *, env_id: str
    ) -> None:
        """Refuses discrete actions and observations other than one flat vector."""
        if isinstance(spaces.actions, DiscreteSpace):
            raise ConfigurationError(
                f"the model add-on learns dynamics over continuous actions; '{env_id}' has "
                "discrete ones"
            )
        keys = list(spaces.state.keys())
        if len(keys) != 1 or len(spaces.state[keys[0]].shape) != 1:
            raise ConfigurationError(
                f"the model add-on predicts one flat observation vector; '{env_id}' gives "
                f"{ {k: tuple(spaces.state[k].shape) for k in keys} }"
            )
        size = int(spaces.state[keys[0]].shape[0])
        outside = [d for d in config.no_delta_dims if not 0 <= d < size]
        if outside:
            raise ConfigurationError(
                f"'model.no_delta_dims' {outside} are outside the observation of '{env_id}', "
                f"which has {size} dimensions"
            )

    def callbacks(
        self,
        config: ModelConfig,
        networks: Networks,
        parts: TrainingParts,
        context: BuildContext,
    ) -> list[Callback]:
        from emote_core.memory import DictObsMemoryTable, MemoryLoader
        from emote_core.memory.proxy import MemoryTableProxy
        from emote_core.models import LossProgressCheck, ModelEnv
        from emote_core.models.callbacks import BatchSampler, ModelBasedCollector, ModelLoss

        table = context.table
        if table is None:
            raise ConfigurationError("the model add-on trains from the replay table; none given")
        if context.rollout_length != 1:
            raise ConfigurationError(
                "the model add-on trains on one-transition windows; set memory.rollout_length = 1 "
                f"(got {context.rollout_length})"
            )
        if getattr(table, "prioritized", False):
            raise ConfigurationError(
                "the model add-on samples the replay memory uniformly; set memory.sampler = "
                '"uniform"'
            )
        if config.rollouts_per_update > context.batch_size:
            raise ConfigurationError(
                f"'model.rollouts_per_update' ({config.rollouts_per_update}) exceeds "
                f"memory.batch_size ({context.batch_size}): rollouts branch from the batch's rows"
            )
        if parts.agent_factory is None:
            raise ConfigurationError("the model add-on needs an agent factory to act in rollouts")
        key = context.spaces.state.keys()[0]
        model = build_model(config, context)
        seed = context.seed
        model_table = DictObsMemoryTable(
            spaces=context.spaces, device=context.device, seed=seed + 104_729,
            maxlen=config.rollouts_per_update * _longest_rollout(config) * config.retain_updates,
        )  # fmt: skip
        model_env = ModelEnv(
            model=model, termination_fn=config.termination, input_key=key,
            generator=torch.Generator().manual_seed(seed + 15_485_863),
        )  # fmt: skip
        optimizer = torch.optim.Adam(
            model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay
        )
        start = config.warmup_updates
        return [
            ModelLoss(
                model=model, optimizer=optimizer, table=table, input_key=key, seed=seed + 1,
                holdout_fraction=config.holdout_fraction, train_interval=config.train_interval,
            ),
            LossProgressCheck(
                model=model, table=table, holdout_fraction=config.holdout_fraction,
                interval=config.check_interval, input_key=key, seed=seed + 2,
            ),
            ModelBasedCollector(
                model_env=model_env, agent=parts.agent_factory(seed + 3),
                memory=MemoryTableProxy(model_table, name="model"),
                rollout_scheduler=rollout_schedule(config),
                num_bp_to_retain_buffer=config.retain_updates,
                rollout_batch_size=config.rollouts_per_update, warmup_bp_steps=start,
                input_key=key,
            ),
            BatchSampler(
                dataloader=MemoryLoader(
                    table=model_table, rollout_count=context.batch_size, rollout_length=1
                ),
                prob_scheduler=TruncatedLinearSchedule(
                    start, start, 0.0, config.model_data_probability
                ),
                seed=seed + 4,
            ),
        ]  # fmt: skip


def _longest_rollout(config: ModelConfig) -> int:
    return max(config.rollout_length, config.final_rollout_length or config.rollout_length)


def rollout_schedule(config: ModelConfig) -> TruncatedLinearSchedule:
    """Rollout length by update: ``rollout_length`` up to ``rollout_ramp_begin``, linear to
    ``final_rollout_length`` at ``rollout_ramp_end``."""
    final = config.final_rollout_length or config.rollout_length
    if final == config.rollout_length:
        return TruncatedLinearSchedule(0, 0, final, final)
    return TruncatedLinearSchedule(
        config.rollout_ramp_begin, config.rollout_ramp_end, config.rollout_length, final
    )


def build_model(config: ModelConfig, context: BuildContext) -> Any:
    """The recipe's dynamic model, initialised from the recipe's seed, on its device."""
    from emote_core.models import DeterministicModel, DynamicModel, EnsembleOfGaussian

    spaces = context.spaces
    observation_size = int(spaces.state[spaces.state.keys()[0]].shape[0])
    action_size = int(math.prod(spaces.actions.shape))
    in_size, out_size = observation_size + action_size, observation_size + 1
    generator = torch.Generator().manual_seed(context.seed + 7)
    layers: dict[str, Any] = {
        "in_size": in_size, "out_size": out_size, "hidden_size": config.hidden_size,
        "num_layers": config.num_layers, "activation": str(config.activation),
        "generator": generator,
    }  # fmt: skip
    if config.kind is ModelKind.DETERMINISTIC:
        network: Any = DeterministicModel(**layers)
    else:
        network = EnsembleOfGaussian(
            **layers, ensemble_size=config.ensemble_size, num_elites=config.num_elites
        )
    model = DynamicModel(
        model=network, observation_size=observation_size, action_size=action_size,
        learned_rewards=True, no_delta_list=list(config.no_delta_dims),
    )  # fmt: skip
    return model.to(context.device)


__all__ = ["Activation", "ModelBasedAddOn", "ModelConfig", "ModelKind", "build_model"]
