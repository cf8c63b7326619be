"""From a recipe or a run to running parts: environments, networks, agents and callbacks.

Everything algorithm-specific comes from the recipe's plug-ins in
:mod:`emote_core.algorithms.registry`; nothing here names an algorithm.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from emote_core.algorithms.normalization import NORMALIZATION_CALLBACK, normalizing_agent
from emote_core.algorithms.registry import (
    AddOn,
    AlgorithmFamily,
    BuildContext,
    DataSource,
    Networks,
    TrainingParts,
    get_addon,
    get_algorithm,
)
from emote_core.env.making import EnvSource, check_source, env_factory, is_parallel_env
from emote_core.errors import CheckpointError, ConfigurationError
from emote_core.nn.normalization import ObservationNormalizer
from emote_core.onnx.graph import PolicyGraph, normalized_policy_graph
from emote_core.recipes.loading import load_recipe
from emote_core.recipes.schema import Recipe
from emote_core.spaces import MDPSpace
from emote_core.utils.dependencies import missing_dependency

log = logging.getLogger(__name__)


def env_source(recipe: Recipe) -> EnvSource:
    """How the recipe's env is made, its modules looked for on ``sys.path``, then in the
    recipe's ``env_search_paths`` (its file's directory, a run's recorded module directories),
    then in the current directory."""
    env = recipe.env
    return EnvSource(
        id=None if env.entry_point else env.id,
        entry_point=env.entry_point,
        kwargs=dict(env.kwargs),
        imports=tuple(env.imports),
        max_episode_steps=env.max_episode_steps,
        search_paths=(*recipe.env_search_paths, str(Path.cwd())),
    )


def check_env(recipe: Recipe) -> None:
    """Checks the recipe's env can be made (its modules import, its id is registered or its
    entry point is a callable) without making it.

    Raises:
        ConfigurationError: If it cannot, in one line.
    """
    check_source(env_source(recipe))


def check_env_id(env_id: str, search_paths: tuple[str, ...] = ()) -> None:
    """Checks ``env_id`` is registered with gymnasium (``module:EnvId`` imports the module
    first), suggesting the closest ids if not.

    Raises:
        ConfigurationError: If it is not registered.
    """
    check_source(EnvSource(id=env_id, search_paths=(*search_paths, str(Path.cwd()))))


def make_env(
    recipe: Recipe,
    *,
    num_envs: int | None = None,
    render_mode: str | None = None,
    wrappers: list[Callable[[Any], Any]] | None = None,
) -> Any:
    """The recipe's environment as a ``DictGymWrapper`` over a gymnasium vector env (a
    PettingZoo ``ParallelEnv`` goes through :func:`emote_core.env.multi_agent.wrap_parallel_env`).

    Args:
        recipe: Names the env (``[env]``).
        num_envs: Environments stepped together (default: the recipe's ``env.num_envs``).
        render_mode: Passed to each env (``"rgb_array"`` to record video).
        wrappers: Wrap each single env, innermost first.

    Raises:
        ConfigurationError: If the env cannot be made (see
            :func:`emote_core.env.making.env_factory`) or rejects ``env.kwargs``.
        MissingDependencyError: If the env needs an optional package that is not installed.
    """
    from emote_core.env import DictGymWrapper, make_vector_env

    name = recipe.env.name
    count = num_envs or recipe.env.num_envs
    try:
        make = env_factory(env_source(recipe))
        first = make(render_mode=render_mode)
        if is_parallel_env(first):
            first.close()
            from emote_core.env.multi_agent import wrap_parallel_env

            return wrap_parallel_env(make, num_envs=count, render_mode=render_mode)
        made = [first]  # the env made to tell its kind is the vector env's first

        def reuse_first(**kwargs: Any) -> Any:
            return made.pop() if made else make(**kwargs)

        kwargs = {} if render_mode is None else {"render_mode": render_mode}
        vector = make_vector_env(reuse_first, num_envs=count, wrappers=wrappers, **kwargs)
    except ConfigurationError:
        raise
    except TypeError as error:  # an env constructor that does not take a given keyword
        raise ConfigurationError(f"env '{name}' rejected env.kwargs: {error}") from error
    except Exception as error:
        missing = missing_dependency(error, f"env '{name}'")
        if missing is None:
            raise
        raise missing from error
    return DictGymWrapper(vector)


def plugins(recipe: Recipe) -> tuple[AlgorithmFamily, list[AddOn]]:
    """The recipe's algorithm family and add-ons, from the registry.

    Raises:
        ConfigurationError: If one is not registered.
    """
    return get_algorithm(recipe.algorithm), [get_addon(name) for name in recipe.addons]


def build_context(
    recipe: Recipe, spaces: MDPSpace, device: torch.device, *, table: Any = None
) -> BuildContext:
    """What the recipe's plug-ins are built for."""
    return BuildContext(
        spaces=spaces, device=device, seed=recipe.seed,
        rollout_length=recipe.memory.rollout_length, batch_size=recipe.memory.batch_size,
        env_id=recipe.env.name, table=table,
    )  # fmt: skip


def make_networks(recipe: Recipe, spaces: MDPSpace, device: torch.device) -> Networks:
    """Fresh networks for the recipe's algorithm and add-ons, seeded with the recipe's seed.

    Raises:
        ConfigurationError: If the algorithm or an add-on cannot act in the environment.
    """
    family, addons = plugins(recipe)
    family.check_spaces(spaces, env_id=recipe.env.name)
    for addon in addons:
        addon.check(recipe.section(addon.name), family, spaces, env_id=recipe.env.name)
    torch.manual_seed(recipe.seed)
    context = build_context(recipe, spaces, device)
    networks = family.make_networks(recipe.config, context)
    for addon in addons:
        networks = addon.adapt_networks(recipe.section(addon.name), networks, context)
    if recipe.env.normalize_observations:  # one per run, in front of every network
        normalizer = ObservationNormalizer(spaces, clip=recipe.env.observation_clip).to(device)
        object.__setattr__(networks, "observation_normalizer", normalizer)
    return networks


def make_agent(
    recipe: Recipe,
    networks: Networks,
    spaces: MDPSpace,
    device: torch.device,
    *,
    deterministic: bool = False,
) -> Any:
    """The agent proxy acting with trained networks (outside training), on normalised
    observations when the networks have an observation normaliser."""
    family, _ = plugins(recipe)
    context = build_context(recipe, spaces, device)
    agent = family.acting_agent(recipe.config, networks, context, deterministic=deterministic)
    return normalizing_agent(agent, networks.observation_normalizer)


def training_parts(recipe: Recipe, networks: Networks, context: BuildContext) -> TrainingParts:
    """The algorithm's callbacks and collecting agent, with every add-on's callbacks added."""
    family, addons = plugins(recipe)
    parts = family.training_parts(recipe.config, networks, context)
    parts.agent = normalizing_agent(parts.agent, networks.observation_normalizer)
    if parts.agent_factory is None:
        parts.agent_factory = functools.partial(
            _exploring_agent, family, recipe.config, networks, context
        )
    for addon in addons:
        parts.callbacks += addon.callbacks(recipe.section(addon.name), networks, parts, context)
    return parts


def _exploring_agent(
    family: AlgorithmFamily, config: Any, networks: Networks, context: BuildContext, seed: int
) -> Any:
    """Another exploring agent of the family's, with its own seed."""
    return family.acting_agent(
        config, networks, dataclasses.replace(context, seed=seed), deterministic=False
    )


def data_sources(recipe: Recipe) -> list[DataSource]:
    """The data groups the recipe's add-ons train on, each with its batch size resolved.

    Raises:
        ConfigurationError: If a group is ``default`` or two add-ons name the same group.
    """
    _, addons = plugins(recipe)
    sources: list[DataSource] = []
    for addon in addons:
        for source in addon.data_sources(recipe.section(addon.name)):
            taken = {"default", *(s.data_group for s in sources)}
            if source.data_group in taken:
                raise ConfigurationError(
                    f"add-on '{addon.name}' asks for data group '{source.data_group}', which "
                    "the replay memory or another add-on already fills; choose another name"
                )
            if source.batch_size is None:
                source = dataclasses.replace(source, batch_size=recipe.memory.batch_size)
            sources.append(source)
    return sources


def policy_graph(recipe: Recipe, networks: Networks, spaces: MDPSpace) -> PolicyGraph:
    """The ONNX-exportable graph of the acting network (a snapshot, taken now), with the
    observation normaliser inside when there is one: the graph takes raw observations."""
    family, _ = plugins(recipe)
    graph = family.policy_graph(networks.acting, spaces)
    if networks.observation_normalizer is not None:
        graph = normalized_policy_graph(graph, networks.observation_normalizer)
    return graph


GROUP_SEPARATOR = "/"
"""Joins an agent group's name and a callback's name (``adversary/policy``): in a run of a
multi-agent env with several agent groups, each group's callbacks are named so in logs and
checkpoints."""


def group_prefix(group: str | None) -> str:
    """What the names of ``group``'s callbacks start with (``""`` for a run of one policy)."""
    return f"{group}{GROUP_SEPARATOR}" if group else ""


def group_spaces(env: Any) -> dict[str, MDPSpace]:
    """Group name -> the agents' MDP space, for a multi-agent env whose agents form several
    groups (one policy each); ``{}`` for any other env (one policy for every agent)."""
    from emote_core.env.multi_agent import several_groups

    return {g.name: env.group_spaces(g.name) for g in several_groups(env)}


def acting_state(
    checkpoint: dict[str, Any], family: AlgorithmFamily, spaces: MDPSpace, group: str | None = None
) -> dict[str, Any]:
    """The acting network's weights inside a training checkpoint of a run of ``spaces`` (of agent
    group ``group``'s policy in a run of several)."""
    name = group_prefix(group) + family.acting_callback_for(spaces)
    try:
        return checkpoint["callbacks"][name]["network_state_dict"]
    except KeyError as error:
        raise CheckpointError(
            f"the checkpoint holds no '{name}' network state (callbacks: "
            f"{sorted(checkpoint.get('callbacks', {}))}); was it written by a {family.name} run?"
        ) from error


def load_normalization(
    checkpoint: dict[str, Any], networks: Networks, path: Path, group: str | None = None
) -> None:
    """Restores the observation statistics of a training checkpoint (of agent group ``group``
    in a run of several) into the networks' normaliser, frozen (no-op when they have none).

    Raises:
        CheckpointError: If the checkpoint holds no statistics for it.
    """
    normalizer = networks.observation_normalizer
    if normalizer is None:
        return
    saved = (
        checkpoint.get("callbacks", {})
        .get(group_prefix(group) + NORMALIZATION_CALLBACK, {})
        .get("observations")
    )
    if saved is None:
        raise CheckpointError(
            f"checkpoint '{path}' holds no observation statistics, but the recipe sets "
            "env.normalize_observations = true; pass the recipe the run was trained with"
        )
    try:
        normalizer.load_state_dict(saved)
    except RuntimeError as error:
        raise CheckpointError(
            f"checkpoint '{path}' holds observation statistics that do not fit the recipe's "
            f"observations: {str(error).splitlines()[0]}"
        ) from error
    normalizer.frozen = True


def resolve_checkpoint(target: Path) -> tuple[Path, Path]:
    """``(checkpoint file, run directory)`` for a checkpoint file or a run directory (its
    newest checkpoint that loads; newer ones that do not are skipped with a warning).

    Raises:
        CheckpointError: If there is no checkpoint there, or none that loads.
    """
    from emote_core.callbacks.checkpointing import is_torch_file, load_latest_checkpoint

    if target.is_dir():
        latest, _ = load_latest_checkpoint(target)
        return latest, target
    if not target.is_file():
        raise CheckpointError(f"'{target}' is neither a checkpoint file nor a run directory")
    if not is_torch_file(target):
        raise CheckpointError(
            f"'{target}' is not a checkpoint (a file emote's training wrote with torch.save) or a "
            "run directory; pass runs/<run> or runs/<run>/checkpoints/checkpoint_<step>.tar"
        )
    return target, target.parent.parent


def trained_recipe(target: Path) -> Recipe:
    """The recipe of the run that a checkpoint file or run directory belongs to, its env's
    modules found where the run recorded them (:func:`emote_core.runs.run_recipe`).

    Raises:
        CheckpointError: If there is no run recipe there.
        ConfigurationError: If the recipe does not load or a recorded env module is gone.
    """
    from emote_core.runs import RunDirectory, run_recipe

    run = RunDirectory(target if target.is_dir() else target.parent.parent)
    if not run.recipe_file.exists():
        raise CheckpointError(
            f"'{target}' is not a run directory or a checkpoint inside one (no recipe.toml in "
            f"'{run.path}'); pass a RECIPE"
        )
    return run_recipe(run)


def load_trained_agent(
    target: Path,
    *,
    device: torch.device,
    recipe: Recipe | str | Path | None = None,
    deterministic: bool = True,
) -> tuple[Recipe, Networks | dict[str, Networks], Any, MDPSpace | dict[str, MDPSpace], Path]:
    """Rebuilds the acting network of a run from its recipe and a checkpoint, in eval mode.

    Returns:
        ``(recipe, networks, agent, spaces, checkpoint path)``. For a multi-agent env whose
        agents form several groups, ``networks`` and ``spaces`` map each group's name to its
        own, and ``agent`` (a ``GroupAgents``) acts for every agent with its group's policy.

    Raises:
        CheckpointError: If the checkpoint or the run's recipe is missing or does not fit.
    """
    from emote_core.callbacks.checkpointing import load_checkpoint

    checkpoint_path, run_path = resolve_checkpoint(target)
    if recipe is None:
        from emote_core.runs import RunDirectory, run_recipe

        run = RunDirectory(run_path)
        if not run.recipe_file.exists():  # a pipe or folder there: run_recipe says "not a file"
            raise CheckpointError(
                f"no recipe.toml in '{run_path}' to rebuild the networks of '{checkpoint_path}'; "
                "pass `recipe`"
            )
        recipe = run_recipe(run)  # with the [eval] settings that resumes changed
    if not isinstance(recipe, Recipe):
        recipe = load_recipe(recipe)
    data = load_checkpoint(checkpoint_path)
    env = make_env(recipe, num_envs=1)
    env.close()
    several = group_spaces(env)
    if several:
        from emote_core.env.multi_agent import GroupAgents

        built = {
            group: _trained(recipe, data, spaces, device, checkpoint_path, deterministic, group)
            for group, spaces in several.items()
        }
        agents = GroupAgents(env, {group: agent for group, (_, agent) in built.items()})
        networks_of = {group: networks for group, (networks, _) in built.items()}
        return recipe, networks_of, agents, several, checkpoint_path
    spaces = env.spaces
    networks, agent = _trained(recipe, data, spaces, device, checkpoint_path, deterministic, None)
    return recipe, networks, agent, spaces, checkpoint_path


def _trained(
    recipe: Recipe,
    data: dict[str, Any],
    spaces: MDPSpace,
    device: torch.device,
    checkpoint_path: Path,
    deterministic: bool,
    group: str | None,
) -> tuple[Networks, Any]:
    """The networks (in eval mode) and acting agent of one policy of a checkpoint."""
    networks = make_networks(recipe, spaces, device)
    whose = f" (agent group '{group}')" if group else ""
    try:
        networks.acting.load_state_dict(acting_state(data, plugins(recipe)[0], spaces, group))
    except RuntimeError as error:
        raise CheckpointError(
            f"checkpoint '{checkpoint_path}' does not fit the recipe's networks{whose}: "
            f"{str(error).splitlines()[0]}"
        ) from error
    load_normalization(data, networks, checkpoint_path, group)
    networks.acting.eval()  # it only acts from here on (and acts faster in eval mode)
    agent = make_agent(recipe, networks, spaces, device, deterministic=deterministic)
    return networks, agent


__all__ = [
    "GROUP_SEPARATOR",
    "acting_state",
    "build_context",
    "check_env",
    "check_env_id",
    "data_sources",
    "env_source",
    "group_prefix",
    "group_spaces",
    "load_normalization",
    "load_trained_agent",
    "make_agent",
    "make_env",
    "make_networks",
    "plugins",
    "policy_graph",
    "resolve_checkpoint",
    "trained_recipe",
    "training_parts",
]
