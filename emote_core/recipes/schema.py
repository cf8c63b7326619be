"""The recipe schema: every knob of a training run, typed, documented and defaulted.

A recipe is a TOML file whose tables mirror these dataclasses. Each field's docstring is its
documentation (shown by ``emote train --help-recipe``-style tools and in errors).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Algorithm(StrEnum):
    """The learning algorithms a recipe can name."""

    SAC = "sac"
    """Soft actor-critic, for continuous (Box) actions."""
    DQN = "dqn"
    """Deep Q-learning (double DQN), for discrete actions."""


@dataclass
class EnvConfig:
    """The gymnasium environment."""

    id: str = "Pendulum-v1"
    """A registered gymnasium id (emote's own: ``emote/HitTheMiddle-v0``)."""
    num_envs: int = 1
    """Environments stepped together (a vector env)."""
    kwargs: dict[str, object] = field(default_factory=dict)
    """Keyword arguments for ``gymnasium.make`` (for example ``continuous = true``)."""
    max_episode_steps: int | None = None
    """Cut episodes at this many steps (INTERRUPTED); the env's own limit when unset."""


@dataclass
class MemoryConfig:
    """The replay memory and how it is sampled."""

    maxlen: int = 1_000_000
    """Most transitions held; whole oldest episodes are ejected beyond it."""
    batch_size: int = 256
    """Windows per training batch."""
    rollout_length: int = 1
    """Transitions per window (n-step returns when above 1)."""
    warmup_steps: int = 1_000
    """Env steps collected (random-policy quality) before training starts."""
    store_episodes: bool = False
    """Also append live episodes to ``memory.zarr`` in the run directory."""


@dataclass
class TrainingConfig:
    """How long and how to train."""

    bp_steps: int = 20_000
    """Backpropagation steps (updates) in the run."""
    inference_steps_per_batch: int = 1
    """Vector-env steps collected before each update (live training)."""
    checkpoint_interval: int = 5_000
    """Updates between checkpoints (a final one is always written)."""
    log_interval: int = 1_000
    """Updates between TensorBoard and terminal log lines."""
    export_interval: int = 0
    """Updates between ONNX exports of the policy into the run's ``exports/``; 0 exports none."""
    threaded: bool = False
    """Collect in a background thread instead of between updates."""


@dataclass
class SacConfig:
    """Soft actor-critic hyperparameters."""

    hidden_dims: list[int] = field(default_factory=lambda: [256, 256])
    """Hidden layer widths of the policy and both Q networks."""
    learning_rate: float = 3e-4
    """Adam learning rate of the policy, the Q networks and the temperature."""
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 0.005
    """Polyak factor of the target Q networks."""
    reward_scale: float = 1.0
    """Multiplies rewards in the Q targets."""
    target_entropy: float | None = None
    """Entropy the temperature aims for; ``-action_dim`` when unset."""
    max_alpha: float = 10.0
    """Upper bound of the temperature."""
    max_grad_norm: float = 10.0
    """Gradient norm clip of every loss."""


@dataclass
class DqnConfig:
    """Double DQN hyperparameters."""

    hidden_dims: list[int] = field(default_factory=lambda: [256, 256])
    """Hidden layer widths of the Q network."""
    learning_rate: float = 1e-3
    """Adam learning rate."""
    gamma: float = 0.99
    """Discount factor."""
    target_update_interval: int = 500
    """Updates between copies of the Q network into its target."""
    epsilon_start: float = 1.0
    """Exploration rate at the first step."""
    epsilon_end: float = 0.05
    """Exploration rate after the decay."""
    epsilon_decay_steps: int = 10_000
    """Updates over which exploration decays linearly."""
    max_grad_norm: float = 10.0
    """Gradient norm clip."""


@dataclass
class EvalConfig:
    """Evaluation after training and by ``emote eval``."""

    episodes: int = 10
    """Episodes per evaluation."""
    min_return: float | None = None
    """Mean return the run is expected to reach (``emote eval --min-return`` overrides)."""


@dataclass
class Recipe:
    """A complete, typed training recipe."""

    name: str = "recipe"
    """The recipe's name (its file name by default)."""
    algorithm: Algorithm = Algorithm.SAC
    """The learning algorithm: ``sac`` or ``dqn``."""
    seed: int = 0
    """Seed of the environments, networks and sampling."""
    env: EnvConfig = field(default_factory=EnvConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    sac: SacConfig = field(default_factory=SacConfig)
    dqn: DqnConfig = field(default_factory=DqnConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


__all__ = [
    "Algorithm",
    "DqnConfig",
    "EnvConfig",
    "EvalConfig",
    "MemoryConfig",
    "Recipe",
    "SacConfig",
    "TrainingConfig",
]
