"""Do a store, a policy and an environment fit together? Checked before any environment steps.

Every refusal is one line that names both sides in words ("store 'c.zarr' holds observations
'obs' of 4 numbers; Pendulum-v1 gives 3 numbers — the store was collected on CartPole-v1; ..."),
never as raw shapes or class names, and says what to do instead. Stores say which environment
they were collected on through their provenance (:mod:`emote_core.stores.provenance`); stores
without it are checked by their spaces (or, lacking those, their columns) alone.
"""

from __future__ import annotations

import logging
import os
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import torch

from emote_core.assembly.builders import (
    data_sources,
    group_spaces,
    load_trained_agent,
    make_env,
    plugins,
)
from emote_core.errors import ConfigurationError
from emote_core.recipes.schema import Recipe
from emote_core.spaces import BoxSpace, DictSpace, DiscreteSpace, MDPSpace, describe_space
from emote_core.stores.provenance import PolicyKind, PolicyRecord, recorded_env_ids

log = logging.getLogger(__name__)


class StoreUse(StrEnum):
    """What a store is about to be used for: it decides the advice a refusal gives."""

    TRAIN = "train"
    """Read into the table of a training run (``emote train --memory``)."""
    COLLECT = "collect"
    """Appended to (``emote collect --out`` an existing store)."""
    REFERENCE = "reference"
    """Read as an add-on's data group (AMP's reference transitions): observations must fit;
    actions are not read."""


@dataclass(frozen=True)
class Held:
    """What one side holds (a store) or reads and produces (a policy).

    Attributes:
        observations: Observation key -> its space.
        actions: The action space (``None``: a store without an actions column).
        complete: Whether ``observations`` are exactly the observation keys (from recorded
            spaces); a store known only by its columns lists other columns too, and its actions
            column cannot tell a discrete choice from a number.
    """

    observations: dict[str, BoxSpace]
    actions: BoxSpace | None
    complete: bool = True


def held_by_store(store: Any) -> Held:
    """What a store holds: its recorded spaces, else its columns (converted stores from formats
    that record no spaces)."""
    if store.spaces:
        try:
            spaces = MDPSpace.from_json(store.spaces)
            return Held(dict(spaces.state.spaces), spaces.actions)
        except ConfigurationError:
            log.warning("store '%s' records spaces this emote cannot read; using its columns",
                        store.url)  # fmt: skip
    columns = {s.name: BoxSpace(s.dtype, s.shape) for s in store.schemas() if s.stored}
    actions = columns.pop("actions", None)
    return Held(columns, actions, complete=False)


def _fits(held: BoxSpace, given: BoxSpace, complete: bool) -> bool:
    if isinstance(held, DiscreteSpace) and isinstance(given, DiscreteSpace):
        return held.n == given.n
    if isinstance(held, DiscreteSpace) or isinstance(given, DiscreteSpace):
        return not complete and held.shape == given.shape  # a column does not know choices
    return held.shape == given.shape


def _difference(
    held: Held, given: MDPSpace, who: str, verb: str, env_id: str, *, actions: bool = True
) -> str | None:
    """The first difference between what ``who`` holds (``verb="holds"``: a store) or reads
    (``"reads"``: a policy) and what ``env_id`` gives and takes, in words; ``None`` when they
    fit. A policy may ignore observations the environment gives on top; a store may not."""
    observations = given.state.spaces
    for key, space in held.observations.items():
        words = describe_space(space)
        if key not in observations:
            if not held.complete:
                continue  # a column that is no observation (rewards, tags)
            return f"{who} {verb} observations '{key}' of {words}, which {env_id} does not give"
        if not _fits(space, observations[key], held.complete):
            return (
                f"{who} {verb} observations '{key}' of {words}; {env_id} gives "
                f"{describe_space(observations[key])}"
            )
    if verb == "holds":
        for key, space in observations.items():
            if key not in held.observations:
                return (
                    f"{who} holds no observations '{key}', which {env_id} gives "
                    f"({describe_space(space)})"
                )
    if not actions:
        return None
    takes = describe_space(given.actions)
    if held.actions is None:
        return f"{who} holds no actions, which {env_id} takes ({takes})"
    if not _fits(held.actions, given.actions, held.complete):
        acts = "holds actions as" if verb == "holds" else "acts with"
        return f"{who} {acts} {describe_space(held.actions)}; {env_id} takes {takes}"
    return None


def check_store_fits(store: Any, spaces: MDPSpace, recipe: Recipe, *, use: StoreUse) -> None:
    """Refuses a store made on another environment, or holding other observations or actions.

    Args:
        store: An open :class:`~emote_core.stores.zarr_store.MemoryStore`.
        spaces: The recipe's environment's spaces.
        recipe: The recipe (its ``env.name`` names the environment).
        use: What the store is for (the advice differs).

    Raises:
        ConfigurationError: One line naming the store, the environment, and both sides.
    """
    env_id = recipe.env.name
    shards = [dict(shard.group.attrs) for shard in store.shards]
    recorded = recorded_env_ids(store.attributes, shards)
    others = [other for other in recorded if other != env_id]
    where = f"store '{store.url}'"
    if use == StoreUse.TRAIN:
        advice = f"train from stores collected on {env_id}"
    elif use == StoreUse.REFERENCE:
        advice = f"make the reference store on {env_id} (emote collect RECIPE --out STORE)"
    else:
        advice = "collect into a new store (another `out`)"
    if others:
        advice += f", or use a recipe for {others[0]}"
    difference = _difference(
        held_by_store(store), spaces, where, "holds", env_id, actions=use != StoreUse.REFERENCE
    )
    if difference is not None:
        made_on = " and ".join(recorded) if recorded else "another environment"
        if recorded and not others:  # the same id, built with other env.kwargs
            made_on += " with other settings (env.kwargs)"
        raise ConfigurationError(f"{difference} — the store was collected on {made_on}; {advice}")
    if others:
        why = (
            "its episodes come from another environment"
            if use != StoreUse.COLLECT
            else "episodes of two environments do not mix in one store"
        )
        raise ConfigurationError(
            f"{where} was collected on {' and '.join(others)}; this recipe runs {env_id} — "
            f"{why}; {advice}"
        )


def check_store_use(
    stores: Sequence[Any], spaces: MDPSpace, recipe: Recipe, *, use: StoreUse
) -> None:
    """:func:`check_store_fits` for each store."""
    for store in stores:
        check_store_fits(store, spaces, recipe, use=use)


def open_source_stores(recipe: Recipe, spaces: MDPSpace) -> list[Any]:
    """Opens and checks the stores of the recipe's add-on data groups (:func:`data_sources`), in
    their order: each must exist, hold a batch's worth of transitions and fit the environment's
    observations.

    Raises:
        ConfigurationError: One line naming the recipe key and the store.
    """
    from emote_core.errors import FormatError
    from emote_core.stores.zarr_store import MemoryStore

    opened = []
    for source in data_sources(recipe):
        if not os.path.exists(source.store) and "://" not in source.store:
            raise ConfigurationError(
                f"'{source.option}' names '{source.store}', which does not exist (relative paths "
                f"are from the working directory, {os.getcwd()})"
            )
        try:
            store = MemoryStore(source.store)
        except FormatError as error:
            raise ConfigurationError(f"'{source.option}': {error}") from error
        if store.episode_count == 0:
            raise ConfigurationError(
                f"'{source.option}' names store '{store.url}', which holds no episodes; collect "
                "some into it first (emote collect RECIPE --policy RUN --out STORE)"
            )
        try:
            check_store_fits(store, spaces, recipe, use=StoreUse.REFERENCE)
        except ConfigurationError as error:
            raise ConfigurationError(f"'{source.option}': {error}") from error
        needed = (source.batch_size or recipe.memory.batch_size) * source.rollout_length
        if store.transition_count < needed:
            raise ConfigurationError(
                f"'{source.option}' store '{store.url}' holds {store.transition_count} "
                f"transitions in {store.episode_count} "
                f"episode{'s' * (store.episode_count != 1)}; a batch of "
                f"'{source.data_group}' needs {needed} — collect more episodes into it"
            )
        opened.append(store)
    return opened


def check_training_stores(recipe: Recipe, urls: Sequence[str | os.PathLike[str]]) -> None:
    """Checks ``emote train --memory`` stores, and the stores of the recipe's add-on data
    groups, against the recipe's environment before a run directory is written (the
    environment is built, never stepped, and closed). For a multi-agent env of several agent
    groups each store is checked against its group (:func:`group_training_stores`).

    Raises:
        FormatError: If a ``--memory`` store cannot be opened.
        ConfigurationError: If the algorithm cannot act in the environment
            (``AlgorithmFamily.check_spaces``), and as :func:`check_store_fits` and
            :func:`open_source_stores`.
    """
    from emote_core.stores.zarr_store import MemoryStore

    stores = [MemoryStore(url) for url in urls]
    if not stores and not data_sources(recipe):
        return
    env = make_env(recipe, num_envs=1)
    env.close()
    if group_spaces(env):
        group_training_stores(stores, env, recipe)
        return
    spaces = env.spaces
    family, _ = plugins(recipe)  # actions the family cannot take: said before stores are read
    family.check_spaces(spaces, env_id=recipe.env.name)
    check_store_use(stores, spaces, recipe, use=StoreUse.TRAIN)
    open_source_stores(recipe, spaces)


def group_training_stores(stores: Sequence[Any], env: Any, recipe: Recipe) -> dict[str, list[Any]]:
    """Sorts ``--memory`` stores to the agent groups of a multi-agent env with several groups.

    A store goes to the one group whose episodes it holds, as its shards' ``agents`` record
    says (``emote collect`` writes ``OUT.<group>.zarr`` per group), and must fit that group's
    spaces.

    Args:
        stores: Open :class:`~emote_core.stores.zarr_store.MemoryStore` objects.
        env: The env (a ``ParallelEnvWrapper`` of several agent groups).
        recipe: The recipe.

    Returns:
        Group name -> its stores, in the order given (groups without a store are left out).

    Raises:
        ConfigurationError: One line naming the store and the env's groups, for a store without
            the record, of no or several groups, of a group the env does not have, or that does
            not fit its group's spaces.
    """
    from emote_core.env.multi_agent import describe_groups
    from emote_core.stores.agents import store_agents

    described = describe_groups(env.groups)
    fix = "pass the OUT.<group>.zarr stores that emote collect writes for this env"
    env_groups = {g.name: list(g.agents) for g in env.groups}
    sorted_stores: dict[str, list[Any]] = {}
    for store in stores:
        where = f"store '{store.url}'"
        records = store_agents(store) or {}
        if not records or len(records) < len(store.shards):
            raise ConfigurationError(
                f"{where} records no agent group for its episodes, and this multi-agent env "
                f"trains one policy per group ({described}); {fix}"
            )
        held: dict[str, list[str]] = {}
        for record in records.values():
            for group in record["groups"]:
                if group["episodes"]:
                    held.setdefault(group["name"], list(group["agents"]))
        if len(held) != 1:
            what = "no episodes" if not held else f"episodes of groups {', '.join(held)}"
            raise ConfigurationError(
                f"{where} holds {what}; each store trains one group's policy of this env "
                f"({described}) — {fix}"
            )
        ((name, agents),) = held.items()
        if env_groups.get(name) != agents:
            raise ConfigurationError(
                f"{where} holds the episodes of group '{name}' ({', '.join(agents)}), which this "
                f"env does not have (its groups: {described}); {fix}"
            )
        check_store_fits(store, env.group_spaces(name), recipe, use=StoreUse.TRAIN)
        sorted_stores.setdefault(name, []).append(store)
    return sorted_stores


def check_training_mode(recipe: Recipe, *, live: bool) -> None:
    """Refuses collecting while training for a family that learns from stores only.

    Raises:
        ConfigurationError: Naming the algorithm and the command that trains it.
    """
    family, _ = plugins(recipe)
    if family.offline_only and live:
        raise ConfigurationError(
            f"'{family.name}' learns from stored episodes only ({family.summary}); train it with "
            "`memory` stores and `live=False`"
        )


def check_collect_store(url: str | os.PathLike[str], recipe: Recipe, spaces: MDPSpace) -> None:
    """Checks an existing store fits what ``emote collect`` is about to append (nothing to
    check when there is no store there yet).

    Raises:
        ConfigurationError: As :func:`check_store_fits`.
    """
    from emote_core.stores.zarr_store import MemoryStore
    from emote_core.stores.zarr_store.writer import is_store

    if is_store(url):
        check_store_fits(MemoryStore(url), spaces, recipe, use=StoreUse.COLLECT)


def check_policy_fits(
    policy: str,
    trained_on: str | None,
    reads: DictSpace,
    acts: BoxSpace,
    spaces: MDPSpace,
    recipe: Recipe,
) -> None:
    """Refuses a policy that reads observations the environment does not give, or acts in
    another action space; a policy trained on another environment id whose spaces fit is
    allowed, with a warning.

    Args:
        policy: The checkpoint, run directory or ONNX file, as the user named it.
        trained_on: The environment id the policy was trained on (``None``: unknown).
        reads: The observations the policy reads.
        acts: The actions it produces.
        spaces: The environment's spaces.
        recipe: The recipe (its ``env.name`` names the environment).

    Raises:
        ConfigurationError: One line naming the policy, both environments, and both sides.
    """
    env_id = recipe.env.name
    where = f"policy '{policy}'"
    difference = _difference(Held(dict(reads.spaces), acts), spaces, where, "reads", env_id)
    if difference is not None:
        origin = trained_on or "another environment"
        advice = f"collect with a policy trained on {env_id}"
        if trained_on and trained_on != env_id:
            advice += f", or with a recipe for {trained_on}"
        raise ConfigurationError(f"{difference} — it was trained on {origin}; {advice}")
    if trained_on and trained_on != env_id:
        log.warning(
            "policy '%s' was trained on %s and acts here in %s: their spaces fit, so it runs",
            policy, trained_on, env_id,
        )  # fmt: skip


def _onnx_env_id(recipe_toml: str) -> str | None:
    """The env inside an export's recipe TOML, its entry point or else its id (``None`` when it
    carries none)."""
    try:
        env = tomllib.loads(recipe_toml).get("env", {}) if recipe_toml else {}
    except tomllib.TOMLDecodeError:
        return None
    found = env.get("entry_point") or env.get("id") if isinstance(env, dict) else None
    return found if isinstance(found, str) else None


def onnx_collect_agent(
    path: str | os.PathLike[str], recipe: Recipe, spaces: MDPSpace, *, seed: int | None
) -> tuple[Any, PolicyRecord]:
    """An ONNX policy file as a sampling agent, checked against the environment's spaces.

    Args:
        path: The ``.onnx`` file.
        recipe: The collect's recipe (its ``env.name`` names the environment).
        spaces: The environment's spaces.
        seed: Seeds the agent's noise.

    Raises:
        ConfigurationError: If the file is missing or does not fit the environment.
        FormatError: If it is not a loadable emote policy export.
    """
    from emote_core.onnx.agent import OnnxAgentProxy

    policy = os.fspath(path)
    agent = OnnxAgentProxy(policy, deterministic=False, seed=seed)
    metadata = agent.metadata
    trained_on = _onnx_env_id(metadata.recipe_toml)
    check_policy_fits(
        policy, trained_on, metadata.observation_space, metadata.action_space, spaces, recipe
    )
    return agent, PolicyRecord.of_file(PolicyKind.ONNX, policy)


def collect_agent(
    policy: str, recipe: Recipe, env: Any, device: torch.device
) -> tuple[Any, PolicyRecord]:
    """The agent ``emote collect`` acts with, checked against the environment, and its record.

    Args:
        policy: ``"random"``, a checkpoint file or run directory, or an ``.onnx`` file.
        recipe: The collect's recipe.
        env: Its environment (a ``DictGymWrapper``), built but not stepped.
        device: Where a checkpoint's networks live.

    Raises:
        ConfigurationError: If the policy does not fit the environment (:func:`check_policy_fits`).
        CheckpointError: If a checkpoint does not load.
    """
    from emote_core.onnx.agent import is_onnx_file
    from emote_core.proxies import RandomAgentProxy

    several = group_spaces(env)
    if several:
        return _group_collect_agent(policy, recipe, env, device, several)
    spaces = env.spaces
    if policy == "random":
        agent = RandomAgentProxy(
            action_space=env.single_action_space, seed=recipe.seed,
            action_mask_key=spaces.action_mask_key,
        )  # fmt: skip
        return agent, PolicyRecord(PolicyKind.RANDOM)
    if is_onnx_file(policy):  # onnxruntime alone, sampling actions
        return onnx_collect_agent(policy, recipe, spaces, seed=recipe.seed)
    trained, _, agent, trained_spaces, checkpoint = load_trained_agent(
        Path(policy), device=device, deterministic=False
    )
    check_policy_fits(
        policy, trained.env.name, trained_spaces.state, trained_spaces.actions, spaces, recipe
    )
    return agent, PolicyRecord.of_file(PolicyKind.CHECKPOINT, checkpoint)


def _group_collect_agent(
    policy: str, recipe: Recipe, env: Any, device: torch.device, several: dict[str, MDPSpace]
) -> tuple[Any, PolicyRecord]:
    """:func:`collect_agent` for a multi-agent env whose agents form several groups: random
    actions, or a run's (checkpoint's) policy of each group for its agents.

    Raises:
        ConfigurationError: For an ONNX file (it holds one group's policy), or a run whose
            groups do not fit the environment's.
    """
    from emote_core.env.multi_agent import describe_groups, random_group_agents
    from emote_core.onnx.agent import is_onnx_file

    if policy == "random":
        return random_group_agents(env, recipe.seed), PolicyRecord(PolicyKind.RANDOM)
    described = f"{len(several)} agent groups ({describe_groups(env.groups)})"
    if is_onnx_file(policy):
        raise ConfigurationError(
            f"`policy={str(policy)!r}`: this multi-agent env has {described}, and an ONNX file "
            "holds one group's policy; pass the run directory (or a checkpoint) that trained them "
            "all"
        )
    trained, _, agent, trained_spaces, checkpoint = load_trained_agent(
        Path(policy), device=device, deterministic=False
    )
    if not isinstance(trained_spaces, dict) or set(trained_spaces) != set(several):
        held = sorted(trained_spaces) if isinstance(trained_spaces, dict) else "one policy"
        raise ConfigurationError(
            f"`policy={str(policy)!r}` holds {held}; this multi-agent env has {described} — pass a "
            "run trained on this env"
        )
    for group, spaces in several.items():
        mine = trained_spaces[group]
        check_policy_fits(policy, trained.env.name, mine.state, mine.actions, spaces, recipe)
    agent.env = env  # the ids of the env it collects on (the same agents)
    return agent, PolicyRecord.of_file(PolicyKind.CHECKPOINT, checkpoint)


__all__ = [
    "Held",
    "StoreUse",
    "check_collect_store",
    "check_policy_fits",
    "check_store_fits",
    "check_store_use",
    "check_training_stores",
    "collect_agent",
    "group_training_stores",
    "held_by_store",
    "onnx_collect_agent",
    "open_source_stores",
]
