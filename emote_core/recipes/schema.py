"""The recipe schema: every knob of a training run, typed, documented and defaulted.

A recipe is a TOML file whose tables mirror these dataclasses. Each field's docstring is its
documentation (shown by ``emote train --help-recipe``-style tools and in errors). The tables of
the algorithm and of its add-ons (``[sac]``, ``[dqn]``, ...) are the dataclasses those plug-ins
declare (:mod:`emote_core.algorithms.registry`); a loaded recipe holds them, typed, in
:attr:`Recipe.sections`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from emote_core.errors import ConfigurationError

MAX_NUM_ENVS = 4096
"""The most environments one process steps together. A vector env steps them one after another,
so beyond a few thousand more of them add memory and no speed; ``emote collect --workers N``
spreads collection over processes."""


def check_num_envs(
    num_envs: int, *, name: str = "env.num_envs", env_steps: int | None = None, budget: str = ""
) -> None:
    """Refuses a number of environments that no run should step together.

    Args:
        num_envs: The environments to step together.
        name: What set it, for the message (a recipe key, an argument or a ``--flag``).
        env_steps: The env steps the run may take, when it has such a budget.
        budget: What set ``env_steps``, for the message.

    Raises:
        ConfigurationError: If ``num_envs`` is above :data:`MAX_NUM_ENVS`, or above
            ``env_steps`` (a single step of every environment would pass the budget).
    """
    given = f"{name} {num_envs:,}" if name.startswith("--") else f"{name} = {num_envs:,}"
    if num_envs > MAX_NUM_ENVS:
        raise ConfigurationError(
            f"{given} is more than {MAX_NUM_ENVS:,}, the most environments one "
            f"process steps together (one after another: more add memory, not speed); lower "
            f"{name} (emote collect --workers N spreads collection over processes)"
        )
    if env_steps is not None and num_envs > env_steps:
        raise ConfigurationError(
            f"{given} is more than the {env_steps:,} env steps of {budget}: one "
            f"step of every environment alone would pass it; lower {name} to at most "
            f"{env_steps:,}"
        )


@dataclass
class EnvConfig:
    """The environment: a gymnasium id, ``module:EnvId``, or an entry point (which wins over
    ``id`` when both are set)."""

    id: str = "Pendulum-v1"
    """A registered gymnasium id (emote's own: ``emote/HitTheMiddle-v0``,
    ``emote/PixelPendulum-v0``, ``emote/PixelCarRacing-v0``), or gymnasium's ``module:EnvId``
    (the module is imported first, then the id made). Ignored when ``entry_point`` is set."""
    entry_point: str | None = None
    """``package.module:callable``: a class or factory called with ``kwargs`` that returns a
    gymnasium env or a PettingZoo ``ParallelEnv``; no registration needed."""
    imports: list[str] = field(default_factory=list)
    """Modules imported before the env is made (those that register ids). Modules are found on
    ``PYTHONPATH``, in the current directory and in the recipe file's directory."""
    num_envs: int = 1
    """Environments stepped together (a vector env), at most :data:`MAX_NUM_ENVS`."""
    kwargs: dict[str, object] = field(default_factory=dict)
    """Keyword arguments for ``gymnasium.make`` (for example ``continuous = true``)."""
    max_episode_steps: int | None = None
    """Cut episodes at this many steps (INTERRUPTED); the env's own limit when unset."""
    normalize_observations: bool = False
    """Scale observations by running mean and variance (kept in checkpoints, frozen while
    evaluating, and part of the exported ONNX graph, so a game sends raw observations)."""
    observation_clip: float = 10.0
    """Normalised observations are clipped to ``[-observation_clip, observation_clip]``."""
    normalize_rewards: bool = False
    """Divide rewards by the running standard deviation of the discounted return while training
    (the stores keep raw rewards)."""

    @property
    def name(self) -> str:
        """How messages and records name the env: the entry point when set, else the id."""
        return self.entry_point or self.id


class SamplerKind(StrEnum):
    """How training batches are drawn from the replay memory."""

    UNIFORM = "uniform"
    """Every stored window equally likely."""
    PRIORITIZED = "prioritized"
    """Prioritized replay: windows drawn in proportion to ``(|TD error| + epsilon) ** alpha``,
    losses weighted by importance-sampling weights; the algorithm feeds its TD errors back."""


_PRIORITY_RANGES = {
    "priority_alpha": (0.0, math.inf),
    "priority_beta": (0.0, 1.0),
    "priority_beta_final": (0.0, 1.0),
    "priority_epsilon": (0.0, math.inf),
}
"""Prioritized replay's recipe settings and their allowed ranges."""


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
    sampler: SamplerKind = SamplerKind.UNIFORM
    """``uniform`` or ``prioritized`` (prioritized replay; SAC and DQN feed TD errors back)."""
    priority_alpha: float = 0.6
    """Prioritized only: how strongly priorities shape sampling (0 is uniform)."""
    priority_beta: float = 0.4
    """Prioritized only: importance-sampling correction at the first update, in [0, 1]."""
    priority_beta_final: float = 1.0
    """Prioritized only: beta reached, linearly, at the run's last update, in [0, 1]; equal to
    ``priority_beta`` keeps beta constant."""
    priority_epsilon: float = 1e-6
    """Prioritized only: added to every ``|TD error|`` so that no window's chance reaches 0."""
    batches_per_sample: int = 1
    """Batches drawn by one sample of the table and used in turn. A GPU table gathers a large
    sample for little more than a small one, so 8-64 cut the host's work per update (the last
    batch of a draw then misses up to that many updates' newest data). Uniform sampling only."""
    store_episodes: bool = True
    """Append live episodes to the run's ``memory_export/`` store as they end. A resumed run
    reads its replay memory back from there; without it a resume starts with an empty memory."""
    follow_interval: int = 20
    """With ``emote train --follow``: updates between looks at the stores for newly committed
    episodes (each look reads one small commit record per shard; new episodes only when
    there are some)."""
    follow_min_seconds: float = 1.0
    """With ``--follow``: seconds at least between two looks, however fast updates go (a look
    at a remote store costs a request per shard); 0 looks every ``follow_interval`` updates."""

    def check(self, source: str) -> None:
        """Checks prioritized replay's settings: in range, and unchanged from their defaults
        with the uniform sampler (where they would change nothing, silently).

        Raises:
            ConfigurationError: Naming the setting, its value and the fix.
        """
        defaults = MemoryConfig()
        for key, (low, high) in _PRIORITY_RANGES.items():
            value = getattr(self, key)
            if self.sampler is not SamplerKind.PRIORITIZED:
                if value != getattr(defaults, key):
                    raise ConfigurationError(
                        f"{source}: 'memory.{key}' = {value} is a setting of prioritized replay "
                        f"but 'memory.sampler' is '{self.sampler}'; set memory.sampler = "
                        f'"prioritized" or remove memory.{key}'
                    )
            elif not low <= value <= high or math.isinf(value):
                bounds = f"in [{low}, {high}]" if high != math.inf else f"finite and >= {low}"
                raise ConfigurationError(f"{source}: 'memory.{key}' must be {bounds}; got {value}")
        if self.sampler is SamplerKind.PRIORITIZED and self.priority_epsilon == 0.0:
            raise ConfigurationError(
                f"{source}: 'memory.priority_epsilon' must be above 0 so that every window keeps "
                "a chance to be drawn; got 0 — use a small value such as 1e-6"
            )


class CompileMode(StrEnum):
    """How the update step runs (``training.compile``); see ``emote_core/callbacks/compiled.py``."""

    NONE = "none"
    """Eagerly, one PyTorch call at a time."""
    COMPILE = "compile"
    """The losses through ``torch.compile`` (CPU and CUDA)."""
    CUDA_GRAPHS = "cuda_graphs"
    """The whole update recorded once as a CUDA graph and replayed (CUDA; eager on a CPU)."""
    COMPILE_CUDA_GRAPHS = "compile+cuda_graphs"
    """Both: compiled losses inside the recorded graph."""


@dataclass
class TrainingConfig:
    """How long and how to train."""

    bp_steps: int = 20_000
    """Backpropagation steps (updates) in the run."""
    inference_steps_per_batch: int = 1
    """Vector-env steps collected before each update that collects (live training)."""
    bp_steps_per_inference: int = 1
    """Updates per collection: ``inference_steps_per_batch`` vector steps are collected before
    every N-th update only, so N updates train on each env step (model-based RL's high
    update-to-data ratio: 20 in MBPO)."""
    checkpoint_interval: int = 5_000
    """Updates between checkpoints (a final one is always written)."""
    log_interval: int = 1_000
    """Updates between TensorBoard and terminal log lines."""
    export_interval: int = 0
    """Updates between ONNX exports of the policy into the run's ``exports/``; 0 exports none."""
    threaded: bool = False
    """Collect in a background thread instead of between updates."""
    compile: CompileMode = CompileMode.NONE
    """How the update step runs: ``"none"`` (eager), ``"compile"`` (``torch.compile`` of the
    losses), ``"cuda_graphs"`` (the whole update replayed as one CUDA graph; on a CPU it trains
    eagerly, with a warning) or ``"compile+cuda_graphs"``. Results equal eager training's within
    float rounding."""
    publish_interval: int | None = None
    """Updates between publications of the policy as ``exports/latest.onnx`` (replaced
    atomically; collectors with ``--follow-policy`` load it). Unset: every 1000 updates when
    the run follows stores (``--follow``), else never; 0: never."""


@dataclass
class EvalConfig:
    """Evaluation while training, when training ends, and by ``emote eval``."""

    episodes: int = 10
    """Episodes per evaluation."""
    interval: int = 0
    """Updates between evaluations while training; 0 evaluates only when training ends (every
    run is evaluated then, into ``eval.json``)."""
    deterministic: bool = True
    """Act with the mean (SAC) or greedy (DQN) action while training evaluates; false samples
    actions from the evaluation's own seeded generator."""
    seed: int = 1_000
    """Seed of the evaluation environment, apart from the training seed: every evaluation plays
    the same episodes, and ``emote eval`` replays them unless given ``--seed``."""
    min_return: float | None = None
    """Mean return the run is expected to reach: ``eval.json`` records whether it did, and
    ``emote eval`` exits 3 below it (``--min-return`` overrides)."""


class WandbMode(StrEnum):
    """How a Weights & Biases run is kept."""

    OFFLINE = "offline"
    """Written into the run directory only (``wandb sync <run_dir>/wandb/offline-run-*`` uploads
    it later); needs no network or account."""
    ONLINE = "online"
    """Streamed to the W&B server as training goes (needs ``wandb login``)."""


@dataclass
class LoggingConfig:
    """Where training logs go besides TensorBoard."""

    wandb: bool = False
    """Also log to Weights & Biases (``emote train --track`` turns it on); needs the ``wandb``
    extra: ``pip install -e ".[wandb]"`` from a clone."""
    wandb_project: str = "emote"
    """The W&B project the run is filed under."""
    wandb_entity: str | None = None
    """The W&B user or team (your default entity when unset)."""
    wandb_mode: WandbMode = WandbMode.OFFLINE
    """``offline`` or ``online``; a ``WANDB_MODE`` environment variable, when set, wins."""


@dataclass
class Recipe:
    """A complete, typed training recipe."""

    name: str = "recipe"
    """The recipe's name (its file name by default)."""
    algorithm: str = "sac"
    """The learning algorithm, by its registered name (``sac``, ``dqn``, or a plug-in's)."""
    addons: list[str] = field(default_factory=list)
    """Add-ons combined with the algorithm, by registered name, each configured in its table."""
    seed: int = 0
    """Seed of the environments, networks and sampling."""
    env: EnvConfig = field(default_factory=EnvConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    sections: dict[str, Any] = field(default_factory=dict)
    """The plug-in tables (the algorithm's and the add-ons'), typed, by table name."""
    env_search_paths: tuple[str, ...] = field(default=(), repr=False, compare=False)
    """Not a TOML key: directories where the env's modules are looked for besides ``sys.path``
    and the current directory (the recipe file's directory; a run's recorded module
    directories). Set by :func:`~emote_core.recipes.loading.load_recipe`, never written back."""

    @property
    def config(self) -> Any:
        """The algorithm's table (``recipe.sections[recipe.algorithm]``)."""
        return self.section(self.algorithm)

    def section(self, name: str) -> Any:
        """The plug-in table ``[name]``.

        Raises:
            KeyError: If the recipe has no such table.
        """
        try:
            return self.sections[name]
        except KeyError:
            raise KeyError(
                f"recipe '{self.name}' has no [{name}] table (it has {sorted(self.sections)})"
            ) from None

    def __getattr__(self, name: str) -> Any:
        # Plug-in tables read like the other tables: ``recipe.sac.learning_rate``.
        sections = self.__dict__.get("sections")
        if sections is not None and name in sections:
            return sections[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


__all__ = [
    "MAX_NUM_ENVS",
    "EnvConfig",
    "EvalConfig",
    "LoggingConfig",
    "MemoryConfig",
    "Recipe",
    "SamplerKind",
    "TrainingConfig",
    "WandbMode",
    "check_num_envs",
]
