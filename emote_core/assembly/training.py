"""Assembling a training run from a recipe: table, networks, collector, losses, logs."""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from emote_core.algorithms.registry import Networks, TrainingParts
from emote_core.assembly.builders import (
    build_context,
    data_sources,
    group_prefix,
    group_spaces,
    make_env,
    make_networks,
    plugins,
    policy_graph,
    training_parts,
)
from emote_core.assembly.compatibility import (
    StoreUse,
    check_store_use,
    check_training_mode,
    group_training_stores,
    open_source_stores,
)
from emote_core.assembly.monitoring import env_step_counter, monitoring_callbacks
from emote_core.callback import Callback
from emote_core.callbacks.progress import ProgressReporter, ProgressSink
from emote_core.errors import ConfigurationError, FormatError
from emote_core.recipes.loading import recipe_to_toml
from emote_core.recipes.schema import MemoryConfig, Recipe, SamplerKind
from emote_core.runs import RunDirectory, claim_entries
from emote_core.spaces import MDPSpace
from emote_core.trainer import Trainer
from emote_core.utils.distributed import DistributedContext, rank_seed
from emote_core.utils.memory_budget import check_memory_fits

log = logging.getLogger(__name__)

DEFAULT_PUBLISH_INTERVAL = 1_000
"""Updates between publications of ``exports/latest.onnx`` by a run that follows stores, when
its recipe leaves ``training.publish_interval`` unset."""


@dataclass
class TrainingRun:
    """What :func:`build_training` assembled."""

    trainer: Trainer
    run: RunDirectory
    table: Any
    """The replay table (the first group's, in a run of several agent groups)."""
    networks: Networks | dict[str, Networks]
    """The networks, or each agent group's by name in a run of several."""
    env: Any | None
    collector: Any | None
    bp_steps: int
    stop: threading.Event
    """Set to stop training cleanly after the update in progress: the trainer's shutdown signal,
    or under ``torchrun`` the request every rank sees at the end of the same update."""
    follower: Any | None = None
    """The :class:`~emote_core.stores.follow.StoreFollower` of a ``--follow`` run."""
    exporter: Any | None = None
    """The ``OnnxExporter`` (periodic exports and publications), when the run has one."""
    evaluator: Any | None = None
    """The ``Evaluator``, whose ``report`` is the final evaluation (rank 0 only)."""
    terminator: Any | None = None
    """The ``BackPropStepsTerminator``, whose ``start_step`` is the update a resume began at."""


def build_training(
    recipe: Recipe,
    *,
    run: RunDirectory,
    device: torch.device,
    live: bool = True,
    stores: Sequence[str | Path] = (),
    resume: bool = False,
    bp_steps: int | None = None,
    terminal_log: bool = True,
    skip_damaged: bool = False,
    allow_nonfinite: bool = False,
    progress: ProgressSink | None = None,
    follow: bool = False,
    distributed: DistributedContext | None = None,
) -> TrainingRun:
    """Builds every part of a training run described by ``recipe``.

    Args:
        recipe: The recipe.
        run: The prepared run directory.
        device: Where networks and the table live.
        live: Collect experience while training (else train only from ``stores``).
        stores: emote-memory stores to start the table from.
        resume: Continue from the run's latest checkpoint.
        bp_steps: Total updates of the run (the recipe's ``training.bp_steps`` by default).
        terminal_log: Also log a line per log interval to the terminal (stderr).
        skip_damaged: Train on the intact episodes of damaged stores (refused by default).
        allow_nonfinite: Train on stores whose float columns hold NaN or infinities (refused
            by default).
        progress: Receives progress snapshots at the start, every half second and at the end
            (see ``ProgressReporter``).
        follow: Keep taking in the episodes committed to ``stores`` while training; without
            live collection, the first update waits for ``memory.warmup_steps`` transitions.
        distributed: This rank of a data-parallel run (``torchrun``): gradients are averaged,
            and only rank 0 writes the run directory.

    Raises:
        ConfigurationError: If the recipe, the stores and the mode do not fit together.
    """
    from emote_core.callbacks.checkpointing import CheckpointLoader
    from emote_core.callbacks.distributed import DataParallel
    from emote_core.callbacks.evaluation import Evaluator
    from emote_core.callbacks.generic import BackPropStepsTerminator
    from emote_core.memory import JointMemoryLoader
    from emote_core.onnx.exporter import OnnxExporter
    from emote_core.stores.memory_checkpoint import ReplayMemoryCheckpoint
    from emote_core.stores.zarr_store import MemoryStore

    if not live and not stores and not resume:
        raise ConfigurationError("`live=False` trains from stored memory only: pass `stores`")
    check_training_mode(recipe, live=live)
    env = make_env(recipe)
    several = group_spaces(env)
    if several:  # a multi-agent env of several agent groups: one policy per group
        try:
            return _build_group_training(
                recipe, several, env=env, run=run, device=device, live=live, stores=stores,
                resume=resume, bp_steps=bp_steps, terminal_log=terminal_log, progress=progress,
                follow=follow, distributed=distributed, skip_damaged=skip_damaged,
                allow_nonfinite=allow_nonfinite,
            )  # fmt: skip
        except BaseException:
            env.close()
            raise
    spaces = env.spaces
    env_action_space = env.env_action_space  # the env's own bounds, for ONNX metadata
    opened = [MemoryStore(store) for store in stores]
    check_store_use(opened, spaces, recipe, use=StoreUse.TRAIN)
    total = bp_steps if bp_steps is not None else recipe.training.bp_steps
    family, _ = plugins(recipe)
    table_spaces = family.table_spaces(recipe.config, spaces)  # GenRL's: latent actions
    if stores and table_spaces is not spaces:  # its own actions, even where they look alike
        raise ConfigurationError(
            f"'{recipe.algorithm}' stores other actions than the environment's in its memory, so "
            "it trains on what it collects itself; leave out `stores`"
        )
    loader = _replay_loader(recipe, table_spaces, device, total)
    table = loader.table
    follower = None
    if follow:
        from emote_core.stores.follow import StoreFollower

        follower = StoreFollower(table, stores, skip_damaged=skip_damaged)
    memory = ReplayMemoryCheckpoint(
        table=table, sources=stores, skip_damaged=skip_damaged, export_store=run.memory_export,
        follower=follower,
    )  # fmt: skip
    if not resume:  # a resumed run's memory is what its checkpoint recorded (restore_state)
        memory.fill(opened)  # the stores the check above read: not opened again
        if not allow_nonfinite:
            _refuse_nonfinite(table, stores)
    if not live and not resume and not follow and not loader.is_ready():
        short = _short_of_a_batch(table, recipe.memory.batch_size, recipe.memory.rollout_length)
        raise ConfigurationError(
            f"the stores hold {short}; pass stores of more episodes, or lower 'memory.batch_size'"
        )
    source_memories, source_loaders = _source_loaders(recipe, spaces, device, resume=resume)
    if source_loaders:  # the add-ons' data groups beside the replay memory's, in every batch
        loader = JointMemoryLoader([loader, *source_loaders])

    check_networks_fit(recipe, spaces, device)
    networks = make_networks(recipe, spaces, device)
    parts = training_parts(recipe, networks, build_context(recipe, spaces, device, table=table))
    _check_priorities(recipe, table, parts)
    callbacks: list[Callback] = [*parts.callbacks, memory, *source_memories]
    checkpointed: list[Callback] = [*parts.callbacks, memory, *source_memories]
    normalization = _input_normalization(recipe, networks, device)
    if normalization is not None:
        callbacks.append(normalization)
        checkpointed.append(normalization)
        if not resume:  # the stores' observations, each once; a resume restores the statistics
            _record_table(normalization, table)
        if follower is not None:  # and the episodes followed from here on
            follower.episode_listeners.append(
                normalization_statistics(None, normalization).record_episode
            )

    main = distributed is None or distributed.is_main  # the rank that writes the run directory
    collector = None
    if live:
        collector = _collector(
            recipe, env, parts, run, table, loader, table_spaces=table_spaces, resume=resume,
            export=recipe.memory.store_episodes and main,
            seed=rank_seed(recipe.seed, distributed.rank) if distributed else recipe.seed,
            normalization=normalization,
        )  # fmt: skip
        callbacks.append(collector)
        if recipe.memory.store_episodes and main:
            memory.exporter = collector.memory
        checkpointed.append(collector)
    else:
        env.close()
        env = None

    if follower is not None:
        from emote_core.stores.follow_training import FollowStores

        callbacks.append(
            FollowStores(
                follower=follower, loader=loader, interval=recipe.memory.follow_interval,
                min_seconds=recipe.memory.follow_min_seconds, wait=not live,
                warmup_transitions=0 if live else recipe.memory.warmup_steps,
            )
        )  # fmt: skip
    loggables = [c for c in callbacks if hasattr(c, "scalar_logs")]
    if recipe.training.compile != "none":
        from emote_core.callbacks.compiled import compiled_training_callbacks

        if distributed is not None and recipe.training.compile.endswith("cuda_graphs"):
            raise ConfigurationError(
                f"training.compile = '{recipe.training.compile}' cannot run under torchrun: "
                "data-parallel averaging happens between backward and the optimizer step, "
                "outside a recorded graph; use 'compile' or 'none'"
            )
        update, _ = compiled_training_callbacks(
            parts.callbacks, mode=str(recipe.training.compile), device=device
        )
        callbacks = [*update, *callbacks[len(parts.callbacks) :]]
    terminator = BackPropStepsTerminator(bp_steps=total)
    callbacks.append(terminator)
    alike = list(callbacks)  # the same on every rank: collectives walk these in one order
    if main:
        callbacks += _writing_callbacks(
            recipe, run=run, networks=networks, spaces=spaces, device=device, collector=collector,
            checkpointed=checkpointed, loggables=loggables, terminal_log=terminal_log,
            progress=progress, total=total, env_action_space=env_action_space, follow=follow,
        )  # fmt: skip
    if resume:
        callbacks.append(CheckpointLoader(callbacks=checkpointed, run_dir=run.path))
    stop = None
    if distributed is not None:
        parallel = DataParallel(
            context=distributed, callbacks=alike, networks=[networks], seed=recipe.seed,
            device=device,
        )  # fmt: skip
        callbacks.append(parallel)
        stop = parallel.stop_request
    trainer = Trainer(callbacks, loader)
    return TrainingRun(
        trainer, run, table, networks, env, collector, total,
        stop=stop if stop is not None else trainer.shutdown_signal, follower=follower,
        exporter=next((c for c in callbacks if isinstance(c, OnnxExporter)), None),
        evaluator=next((c for c in callbacks if isinstance(c, Evaluator)), None),
        terminator=terminator,
    )  # fmt: skip


def _build_group_training(
    recipe: Recipe,
    groups: dict[str, Any],
    *,
    env: Any,
    run: RunDirectory,
    device: torch.device,
    live: bool,
    stores: Sequence[str | Path],
    resume: bool,
    bp_steps: int | None,
    terminal_log: bool,
    progress: ProgressSink | None,
    follow: bool,
    distributed: DistributedContext | None,
    skip_damaged: bool,
    allow_nonfinite: bool,
) -> TrainingRun:
    """:func:`build_training` for a multi-agent env whose agents form several groups: each
    group gets the family's own networks, callbacks, replay table and collecting agent, built
    as for one policy; its callbacks are named ``<group>/<name>`` and read the batch's data
    group ``<group>``. One collector steps every agent, each group's agents acting with its
    agent and their episodes going to its table.

    Each group's table starts from the ``stores`` of its group (:func:`group_training_stores`),
    its live episodes go to the run's ``memory_export.<group>`` store, and its checkpoint
    entry ``<group>/replay_memory`` references both, so a resume refills every table exactly.

    Raises:
        ConfigurationError: For a store of no group of the env, a group without a batch's
            worth of stored transitions under ``--no-live``, and what such a run does not take:
            ``--follow``, ``torchrun``, add-ons' data groups.
    """
    from emote_core.callbacks.checkpointing import CheckpointLoader
    from emote_core.callbacks.generic import BackPropStepsTerminator
    from emote_core.env import GymCollector, ThreadedGymCollector
    from emote_core.env.multi_agent import (
        GroupAgents,
        GroupMemories,
        describe_groups,
        group_store,
        random_group_agents,
    )
    from emote_core.memory import JointMemoryLoader
    from emote_core.memory.proxy import MemoryTableProxy
    from emote_core.onnx.exporter import OnnxExporter
    from emote_core.stores.memory_checkpoint import ReplayMemoryCheckpoint
    from emote_core.stores.zarr_store import MemoryStore

    described = f"{len(groups)} agent groups ({describe_groups(env.groups)})"
    refused = [
        (follow, "`follow=True` (train from the stores as they are, or live)"),
        (distributed is not None, "torchrun"),
        (bool(data_sources(recipe)), "add-ons that train on data groups of their own"),
    ]
    for taken, what in refused:
        if taken:
            raise ConfigurationError(
                f"this multi-agent env has {described}, one policy each; such a run does not "
                f"take {what} — leave it out, or give every agent the same spaces"
            )
    stores_of = group_training_stores([MemoryStore(s) for s in stores], env, recipe)
    total = bp_steps if bp_steps is not None else recipe.training.bp_steps
    family, _ = plugins(recipe)
    loaders, agents, memories = [], {}, {}
    callbacks: list[Callback] = []
    updates: list[Callback] = []
    checkpointed: list[Callback] = []
    networks_of: dict[str, Networks] = {}
    if live and recipe.memory.store_episodes:  # each group's store is the run's, for --force
        claim_entries(run, [Path(group_store(str(run.memory_export), g)).name for g in groups])
    for group, spaces in groups.items():
        prefix = group_prefix(group)
        table_spaces = family.table_spaces(recipe.config, spaces)
        loaders.append(_replay_loader(recipe, table_spaces, device, total, data_group=group))
        table = loaders[-1].table
        opened = stores_of.get(group, [])
        if opened and table_spaces is not spaces:  # its own actions, even where they look alike
            raise ConfigurationError(
                f"'{recipe.algorithm}' stores other actions than the environment's in its "
                "memory, so it trains on what it collects itself; leave out `stores`"
            )
        export_store = Path(group_store(str(run.memory_export), group))
        replay = ReplayMemoryCheckpoint(
            table=table, sources=[s.url for s in opened], skip_damaged=skip_damaged,
            export_store=export_store, name=prefix + "replay_memory",
        )  # fmt: skip
        if not resume:  # a resumed run's memory is what its checkpoint recorded
            replay.fill(opened)
            if not allow_nonfinite:
                _refuse_nonfinite(table, [s.url for s in opened])
        if not live and not resume and not loaders[-1].is_ready():
            memory = recipe.memory
            short = _short_of_a_batch(table, memory.batch_size, memory.rollout_length)
            raise ConfigurationError(
                f"group '{group}' of this multi-agent env has stored {short} — pass in `stores` "
                f"a store of group "
                f"'{group}' that holds enough (emote collect writes OUT.{group}.zarr), or train "
                "live"
            )
        check_networks_fit(recipe, spaces, device)
        networks = networks_of[group] = make_networks(recipe, spaces, device)
        parts = training_parts(recipe, networks, build_context(recipe, spaces, device, table=table))
        _check_priorities(recipe, table, parts)
        own = list(parts.callbacks)
        memory: Any = MemoryTableProxy(table, name=group)
        if live and recipe.memory.store_episodes:
            memory = replay.exporter = _group_exporter(
                recipe, memory, run, export_store, table_spaces, resume=resume
            )
        normalization = _input_normalization(recipe, networks, device)
        if normalization is not None:
            own.append(normalization)
            if not resume:  # the stores' observations, each once; a resume restores them
                _record_table(normalization, table)
            memory = normalization_statistics(memory, normalization)
        if parts.memory_wrapper is not None:
            memory = parts.memory_wrapper(memory)
        for callback in own:  # the group's names in logs and checkpoints, its data group
            callback.name = prefix + callback.name
            if callback.data_group == "default":
                callback.data_group = group
        updates += parts.callbacks
        callbacks += [*own, replay]
        checkpointed += [*own, replay]
        agents[group] = parts.agent
        memories[group] = memory
    loader = JointMemoryLoader(loaders)
    collector = None
    if live:
        collector_class = ThreadedGymCollector if recipe.training.threaded else GymCollector
        collector = collector_class(
            env=env, agent=GroupAgents(env, agents), memory=GroupMemories(env, memories),
            warmup_steps=recipe.memory.warmup_steps,
            inference_steps_per_batch=recipe.training.inference_steps_per_batch,
            bp_steps_per_inference=recipe.training.bp_steps_per_inference,
            seed=recipe.seed, warmup_agent=random_group_agents(env, recipe.seed),
            ready_check=loader,
        )  # fmt: skip
        callbacks.append(collector)
        checkpointed.append(collector)
    else:  # evaluations make envs of their own; this one only tells agents' groups apart
        env.close()
    loggables = [c for c in callbacks if hasattr(c, "scalar_logs")]
    if recipe.training.compile != "none":
        from emote_core.callbacks.compiled import compiled_training_callbacks

        compiled, _ = compiled_training_callbacks(
            updates, mode=str(recipe.training.compile), device=device
        )
        callbacks = [*compiled, *(c for c in callbacks if c not in updates)]
    terminator = BackPropStepsTerminator(bp_steps=total)
    callbacks.append(terminator)
    env_action_spaces = {g.name: g.action_space for g in env.groups}
    callbacks += _writing_callbacks(
        recipe, run=run, networks=networks_of, spaces=groups, device=device, collector=collector,
        checkpointed=checkpointed, loggables=loggables, terminal_log=terminal_log,
        progress=progress, total=total, env_action_space=env_action_spaces, follow=False,
        group_env=env,
    )  # fmt: skip
    if resume:
        callbacks.append(CheckpointLoader(callbacks=checkpointed, run_dir=run.path))
    trainer = Trainer(callbacks, loader)
    return TrainingRun(
        trainer, run, loaders[0].table, networks_of, env if live else None, collector, total,
        stop=trainer.shutdown_signal,
        exporter=next((c for c in callbacks if isinstance(c, OnnxExporter)), None),
        evaluator=next((c for c in callbacks if _is_evaluator(c)), None),
        terminator=terminator,
    )  # fmt: skip


def _is_evaluator(callback: Callback) -> bool:
    from emote_core.callbacks.evaluation import Evaluator

    return isinstance(callback, Evaluator)


TRAINING_COPIES = 4
"""Copies of every parameter that training holds: weights, gradients and Adam's two moments."""
_SIZE_KEY = re.compile(r"hidden|dims?$|size$|width|channels|features")
"""Names of the plug-in tables' keys that set how large networks are."""


def _counted(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def _short_of_a_batch(table: Any, windows: int, rollout_length: int, *, keys: bool = True) -> str:
    """What a table holds and why it cannot give one batch of ``windows`` windows of
    ``rollout_length`` transitions (too few transitions, or no episode that long); ``keys``
    names the recipe's ``memory`` keys that set them."""
    held = f"{_counted(table.size(), 'transition')} in {_counted(table.episode_count, 'episode')}"
    count = f"'memory.batch_size' = {windows}" if keys else f"{windows}"
    length = _counted(rollout_length, "transition")
    length = f"'memory.rollout_length' = {length}" if keys else length
    if table.size() < windows * rollout_length:
        return (
            f"{held}, fewer than the {windows * rollout_length:,} of one batch ({count} windows "
            f"of {length})"
        )
    return f"{held}, none as long as a window ({length})"


def _refuse_nonfinite(table: Any, stores: Sequence[str | Path]) -> None:
    found = table.find_nonfinite()
    if found is None:
        return
    named = ", ".join(f"'{store}'" for store in stores)
    raise FormatError(
        f"store {named}: column '{found.column}' holds "
        f"{_counted(found.count, 'non-finite value')} (NaN or inf) in "
        f"{_counted(found.episodes, 'episode')}, the first in episode {found.episode} at row "
        f"{found.row}; training on them turns losses into NaN — repair the store, "
        "or pass `allow_nonfinite=True` to train on them"
    )


def check_networks_fit(recipe: Recipe, spaces: Any, device: torch.device) -> None:
    """Refuses networks too large to train on ``device`` before any is allocated.

    The recipe's networks are built on PyTorch's meta device (shapes without data), their
    parameters counted, and :data:`TRAINING_COPIES` of each weighed against the memory available.

    Raises:
        ConfigurationError: Naming the recipe key that sets the largest size, its value, the
            estimate and the memory available.
    """
    meta = torch.device("meta")
    try:
        with meta:
            networks = make_networks(recipe, spaces, meta)
    except (NotImplementedError, RuntimeError) as error:  # a plug-in that needs real tensors
        log.debug("the networks' size is not checked before they are made: %s", error)
        return
    parameters = {id(p): p for module in _modules(vars(networks)) for p in module.parameters()}
    count = sum(p.numel() for p in parameters.values())
    needed = TRAINING_COPIES * sum(p.numel() * p.element_size() for p in parameters.values())
    sizes = _size_settings(recipe)
    key, value = sizes[0] if sizes else ("", None)
    check_memory_fits(
        needed, device,
        what=f"training the networks of {key} = {value}" if key else "training the networks",
        detail=f"{count:,} parameters, each held as weights, gradients and two optimizer moments",
        fix=f"lower {key}" if key else "choose smaller networks",
    )  # fmt: skip


def _modules(value: Any) -> list[torch.nn.Module]:
    """The modules in ``value``, in its lists, tuples and dicts too."""
    if isinstance(value, torch.nn.Module):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list | tuple):
        return [module for item in value for module in _modules(item)]
    return []


def _size_settings(recipe: Recipe) -> list[tuple[str, Any]]:
    """The plug-in tables' keys that size networks, with their values: those changed from the
    default first, then by the largest number each holds."""
    found: list[tuple[bool, int, str, Any]] = []

    def visit(prefix: str, config: Any) -> None:
        try:
            default = type(config)()
        except TypeError:  # a table without defaults for every key
            default = None
        for field in dataclasses.fields(config):
            value, key = getattr(config, field.name), f"{prefix}.{field.name}"
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                visit(key, value)
                continue
            numbers = value if isinstance(value, list) else [value]
            if not numbers or not all(type(n) is int for n in numbers):
                continue
            if "batch" in field.name or not _SIZE_KEY.search(field.name):
                continue
            changed = default is not None and getattr(default, field.name, None) != value
            found.append((changed, max(numbers), key, value))

    for name, config in recipe.sections.items():
        if dataclasses.is_dataclass(config):
            visit(name, config)
    found.sort(key=lambda item: (item[0], item[1]), reverse=True)
    return [(key, value) for _, _, key, value in found]


def _writing_callbacks(
    recipe: Recipe,
    *,
    run: RunDirectory,
    networks: Networks,
    spaces: Any,
    device: torch.device,
    collector: Any | None,
    checkpointed: list[Callback],
    loggables: list[Any],
    terminal_log: bool,
    progress: ProgressSink | None,
    total: int,
    env_action_space: Any,
    follow: bool,
    group_env: Any = None,
) -> list[Callback]:
    """What writes the run directory and reports: TensorBoard, checkpoints, evaluations, W&B,
    the terminal log, progress and ONNX exports (rank 0's alone under ``torchrun``).

    A run of several agent groups passes ``networks``, ``spaces`` and ``env_action_space`` by
    group and its env as ``group_env``: evaluations play every group with its policy, and each
    group's policy is exported to ``exports/<group>/``."""
    from torch.utils.tensorboard import SummaryWriter

    from emote_core.callbacks.checkpointing import Checkpointer
    from emote_core.callbacks.logging import TensorboardLogger, TerminalLogger

    writer = SummaryWriter(log_dir=str(run.tensorboard))
    interval = recipe.training.log_interval
    callbacks: list[Callback] = []
    checkpointer = Checkpointer(
        callbacks=checkpointed, run_dir=run.path,
        checkpoint_interval=recipe.training.checkpoint_interval,
    )  # fmt: skip
    callbacks += [
        TensorboardLogger(
            callbacks=loggables, writer=writer, log_interval=interval,
            env_steps=env_step_counter(collector),
        ),
        checkpointer,
        *monitoring_callbacks(
            recipe, run=run, networks=networks, spaces=spaces, device=device, writer=writer,
            checkpointer=checkpointer, collector=collector, loggables=loggables,
            group_env=group_env,
        ),
    ]  # fmt: skip
    if terminal_log:
        callbacks.append(TerminalLogger(callbacks=loggables, log_interval=interval))
    if progress is not None:
        callbacks.append(ProgressReporter(sink=progress, total=total, callbacks=loggables))
    publish = recipe.training.publish_interval
    if publish is None:  # unset: a following learner feeds its collectors
        publish = DEFAULT_PUBLISH_INTERVAL if follow else 0
    exporter = None
    if (recipe.training.export_interval or publish) and group_env is not None:
        from emote_core.onnx.exporter import OnnxExporter

        for group, group_networks in networks.items():  # type: ignore[attr-defined]
            callbacks.append(
                OnnxExporter(
                    graph=functools.partial(policy_graph, recipe, group_networks, spaces[group]),
                    directory=run.exports / group,
                    interval=recipe.training.export_interval or None,
                    recipe_name=recipe.name,
                    recipe_toml=recipe_to_toml(recipe),
                    env_action_space=env_action_space[group],
                    publish_interval=publish,
                    name=group_prefix(group) + "onnx_exporter",
                )
            )
    elif recipe.training.export_interval or publish:
        from emote_core.onnx.exporter import OnnxExporter

        exporter = OnnxExporter(
            graph=functools.partial(policy_graph, recipe, networks, spaces),
            directory=run.exports, interval=recipe.training.export_interval or None,
            recipe_name=recipe.name, recipe_toml=recipe_to_toml(recipe),
            env_action_space=env_action_space, publish_interval=publish,
        )  # fmt: skip
        callbacks.append(exporter)
        if collector is not None:  # requests from other threads are served during warm-up too
            collector.exporter = exporter
    return callbacks


def _source_loaders(
    recipe: Recipe, spaces: Any, device: torch.device, *, resume: bool
) -> tuple[list[Any], list[Any]]:
    """For each add-on data group: its store read whole into a table of its own, recorded in
    checkpoints like a ``--memory`` store (a resume reads back the same episodes and sampling
    generators), and a loader under the group's name.

    Returns:
        ``(memory checkpoint callbacks, loaders)``.

    Raises:
        ConfigurationError: If a store is missing, empty, does not fit the environment, or holds
            fewer transitions than a batch of its group needs.
    """
    from emote_core.memory import DictObsMemoryTable, MemoryLoader
    from emote_core.stores.memory_checkpoint import ReplayMemoryCheckpoint

    sources = data_sources(recipe)
    stores = open_source_stores(recipe, spaces)
    memories, loaders = [], []
    for k, (source, store) in enumerate(zip(sources, stores, strict=True), start=1):
        table = DictObsMemoryTable(
            spaces=spaces, maxlen=max(store.transition_count, 1), device=device,
            seed=recipe.seed + k,  # not the replay table's stream
        )  # fmt: skip
        memory = ReplayMemoryCheckpoint(
            table=table, sources=[source.store], name=f"{source.data_group}_memory"
        )
        if not resume:  # else restore_state reads back what the checkpoint recorded
            memory.fill([store])
        group_loader = MemoryLoader(
            table=table, rollout_count=source.batch_size or recipe.memory.batch_size,
            rollout_length=source.rollout_length, data_group=source.data_group,
        )  # fmt: skip
        if not resume and not group_loader.is_ready():
            short = _short_of_a_batch(
                table, group_loader.rollout_count, source.rollout_length, keys=False
            )
            raise ConfigurationError(
                f"'{source.option}' store '{store.url}' holds {short} for data group "
                f"'{source.data_group}' — collect more episodes"
            )
        memories.append(memory)
        loaders.append(group_loader)
    return memories, loaders


def _replay_loader(
    recipe: Recipe,
    spaces: MDPSpace,
    device: torch.device,
    updates: int,
    *,
    data_group: str = "default",
) -> Any:
    """An empty replay table for ``spaces`` (n-step windows when ``memory.rollout_length`` > 1)
    and the loader that samples the recipe's batches from it into ``data_group``."""
    from emote_core.memory import DictObsMemoryTable, DictObsNStepMemoryTable, MemoryLoader

    memory = recipe.memory
    table_class = DictObsNStepMemoryTable if memory.rollout_length > 1 else DictObsMemoryTable
    table = table_class(
        spaces=spaces, maxlen=memory.maxlen, device=device, seed=recipe.seed,
        sampler=_sampler(memory, updates),
    )  # fmt: skip
    return MemoryLoader(
        table=table, rollout_count=memory.batch_size, rollout_length=memory.rollout_length,
        batches_per_sample=memory.batches_per_sample, data_group=data_group,
    )  # fmt: skip


def _check_priorities(recipe: Recipe, table: Any, parts: TrainingParts) -> None:
    """Refuses prioritized sampling for an algorithm that feeds no TD errors back."""
    from emote_core.memory.priorities import PriorityUpdater

    if table.prioritized and not any(isinstance(c, PriorityUpdater) for c in parts.callbacks):
        raise ConfigurationError(
            f'memory.sampler = "prioritized" needs the algorithm to feed its TD errors back, '
            f"and '{recipe.algorithm}' adds no PriorityUpdater to its training callbacks; set "
            'memory.sampler = "uniform" (or wire its losses with emote_core.memory.priorities)'
        )


def _sampler(memory: MemoryConfig, updates: int) -> Any:
    """The table's sample strategy as the recipe's ``memory.sampler`` says; prioritized replay's
    beta moves linearly from ``priority_beta`` to ``priority_beta_final`` over ``updates``."""
    from emote_core.memory.strategies import PrioritizedSampleStrategy, UniformSampleStrategy
    from emote_core.schedules import LinearSchedule

    if memory.sampler is not SamplerKind.PRIORITIZED:
        return UniformSampleStrategy()
    beta: Any = memory.priority_beta
    if memory.priority_beta_final != beta:
        beta = LinearSchedule(beta, memory.priority_beta_final, max(updates, 1))
    return PrioritizedSampleStrategy(
        alpha=memory.priority_alpha, beta=beta, epsilon=memory.priority_epsilon
    )


def _collector(
    recipe: Recipe,
    env: Any,
    parts: TrainingParts,
    run: RunDirectory,
    table: Any,
    loader: Any,
    *,
    table_spaces: Any,
    resume: bool,
    export: bool,
    seed: int,
    normalization: Any = None,
) -> Any:
    from emote_core.assembly.provenance import session_provenance
    from emote_core.env import GymCollector, ThreadedGymCollector
    from emote_core.memory.proxy import MemoryTableProxy
    from emote_core.proxies import RandomAgentProxy
    from emote_core.stores.memory_export import MemoryExporterProxyWrapper
    from emote_core.stores.provenance import PolicyKind, PolicyRecord
    from emote_core.stores.zarr_store.layout import DEFAULT_SHARD

    memory: Any = MemoryTableProxy(table)
    if export:
        acting = PolicyRecord(PolicyKind.TRAINING, str(run.path.absolute()))
        memory = MemoryExporterProxyWrapper(
            memory, target_memory_name="memory", inf_steps_per_memory_export=1_000,
            experiment_root_path=run.path, min_time_per_export=0.0,
            spaces=table_spaces.to_json(), provenance=session_provenance(recipe, policy=acting),
            shard=_fresh_shard(run.memory_export) if resume else DEFAULT_SHARD,
        )  # fmt: skip
    if normalization is not None:  # every collected step, once, as the memory takes it in
        memory = normalization_statistics(memory, normalization)
    if parts.memory_wrapper is not None:  # outermost: the table and the export see what it makes
        memory = parts.memory_wrapper(memory)
    warmup_agent = RandomAgentProxy(
        action_space=env.single_action_space, seed=seed,
        action_mask_key=env.spaces.action_mask_key,
    )  # fmt: skip
    collector_class = ThreadedGymCollector if recipe.training.threaded else GymCollector
    return collector_class(
        env=env, agent=parts.agent, memory=memory, warmup_steps=recipe.memory.warmup_steps,
        inference_steps_per_batch=recipe.training.inference_steps_per_batch,
        bp_steps_per_inference=recipe.training.bp_steps_per_inference,
        seed=seed, warmup_agent=warmup_agent, ready_check=loader,
    )  # fmt: skip


def _group_exporter(
    recipe: Recipe, memory: Any, run: RunDirectory, store: Path, spaces: MDPSpace, *, resume: bool
) -> Any:
    """``memory`` wrapped to append one agent group's live episodes to ``store`` (a resumed
    run writes a shard of its own)."""
    from emote_core.assembly.provenance import session_provenance
    from emote_core.stores.memory_export import MemoryExporterProxyWrapper
    from emote_core.stores.provenance import PolicyKind, PolicyRecord
    from emote_core.stores.zarr_store.layout import DEFAULT_SHARD

    acting = PolicyRecord(PolicyKind.TRAINING, str(run.path.absolute()))
    return MemoryExporterProxyWrapper(
        memory, target_memory_name=store.name, inf_steps_per_memory_export=1_000,
        experiment_root_path=run.path, min_time_per_export=0.0, spaces=spaces.to_json(),
        provenance=session_provenance(recipe, policy=acting), store=store,
        shard=_fresh_shard(store) if resume else DEFAULT_SHARD,
    )  # fmt: skip


def _input_normalization(recipe: Recipe, networks: Networks, device: torch.device) -> Any:
    """The callback that normalises batches and checkpoints the statistics, when the recipe's
    ``env.normalize_observations`` or ``env.normalize_rewards`` is on (else ``None``).

    Rewards are scaled by the discounted return's deviation under the algorithm table's
    ``gamma`` (0.99 for a family without one)."""
    from emote_core.algorithms.normalization import InputNormalization
    from emote_core.nn.normalization import ReturnNormalizer

    env = recipe.env
    if not (env.normalize_observations or env.normalize_rewards):
        return None
    returns = None
    if env.normalize_rewards:
        gamma = getattr(recipe.config, "gamma", None)
        returns = ReturnNormalizer(gamma if isinstance(gamma, float | int) else 0.99).to(device)
    return InputNormalization(observations=networks.observation_normalizer, returns=returns)


def normalization_statistics(memory: Any, normalization: Any) -> Any:
    """``memory`` wrapped to merge every step it takes in into the normalisers' statistics."""
    from emote_core.algorithms.normalization import NormalizationStatistics

    return NormalizationStatistics(
        memory, observations=normalization.observations, returns=normalization.returns
    )


def _record_table(normalization: Any, table: Any) -> None:
    """Merges the episodes a table starts with (read from stores) into the statistics."""
    if table.episode_count == 0:
        return
    recorder = normalization_statistics(None, normalization)
    for _, sequence, _ in table.episodes():
        recorder.record_episode(sequence)


def _fresh_shard(store: Path) -> str:
    """A shard name the run's export store does not have yet: each resume writes its own."""
    from emote_core.stores.zarr_store.layout import SHARDS

    taken = {p.name for p in (store / SHARDS).iterdir()} if (store / SHARDS).is_dir() else set()
    return next(f"resume-{k}" for k in range(1, len(taken) + 2) if f"resume-{k}" not in taken)


__all__ = [
    "DEFAULT_PUBLISH_INTERVAL",
    "TRAINING_COPIES",
    "TrainingRun",
    "build_training",
    "check_networks_fit",
]
