"""Evaluating an agent on a recipe's environment: returns over whole episodes, and their
normalised score (0 = random, 100 = expert) where reference returns are known."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np

from emote_core.assembly.builders import check_env, make_env
from emote_core.callbacks.checkpointing import CHECKPOINT_DIRECTORY, is_torch_file
from emote_core.env.multi_agent import (
    EnvEpisode,
    GroupAgents,
    ParallelEnvWrapper,
    describe_groups,
    several_groups,
)
from emote_core.errors import ConfigurationError, EmoteError
from emote_core.onnx.agent import is_onnx_file
from emote_core.recipes.schema import Recipe
from emote_core.runs import RunDirectory, is_run
from emote_core.runs.record import read_run_record
from emote_core.stores.provenance import ReferenceReturns, reference_returns


class PolicyKind(Enum):
    """What ``emote eval`` was given to evaluate."""

    ONNX = "onnx"
    """An exported ``.onnx`` policy, run in onnxruntime."""
    RUN = "run"
    """A run directory: its newest checkpoint that loads, on its ``recipe.toml``."""
    CHECKPOINT = "checkpoint"
    """A checkpoint file, on the ``recipe.toml`` of the run it sits in."""


def policy_kind(target: Path) -> PolicyKind:
    """Recognises an evaluation target from what is on disk, before anything is loaded.

    Raises:
        ConfigurationError: If ``target`` is none of the three: a text file, random bytes, a
            folder that holds neither ``run.json`` nor ``checkpoints/``, a named pipe or a device
            (never opened), or nothing at all.
    """
    if is_onnx_file(target):
        return PolicyKind.ONNX
    if target.is_dir() and (is_run(target) or (target / CHECKPOINT_DIRECTORY).is_dir()):
        return PolicyKind.RUN
    if target.is_file() and is_torch_file(target):
        return PolicyKind.CHECKPOINT
    if target.exists() and not target.is_dir() and not target.is_file():
        raise ConfigurationError(
            f"'{target}' is not a file (mode {stat.filemode(target.stat().st_mode)}); pass "
            "runs/<run>, a checkpoint_<step>.tar or an .onnx file"
        )
    if not target.exists():
        raise ConfigurationError(
            f"'{target}' does not exist: it is neither a checkpoint file nor a run directory "
            "nor an ONNX policy"
        )
    why = (
        "a folder without run.json or checkpoints/"
        if target.is_dir()
        else "a file that torch.save did not write, without the .onnx suffix"
    )
    raise ConfigurationError(
        f"'{target}' is not a run directory, a checkpoint or an ONNX policy ({why}); pass "
        "runs/<run>, a checkpoint_<step>.tar or an .onnx file"
    )


def evaluate(
    agent: Any,
    recipe: Recipe,
    *,
    episodes: int,
    seed: int,
    on_episode: Callable[[list[float]], None] | None = None,
    video_dir: Path | None = None,
) -> dict[str, Any]:
    """Runs ``agent`` on one environment for ``episodes`` whole episodes.

    Args:
        agent: Acts on the environment's observations.
        recipe: Names the environment.
        episodes: How many episodes to run.
        seed: Seeds the environment's first reset.
        on_episode: Called with the returns so far each time an episode ends (for progress).
        video_dir: Record every episode as an MP4 file in this folder (created; files already
            there are kept, the videos take the next free names ``episode-<n>.mp4``).

    Returns:
        ``{env, seed, episodes, returns, lengths, mean_return, std_return, lowest_return,
        highest_return}``, and ``videos`` (the files, in episode order) with ``video_dir``. For
        a multi-agent env an episode is the env's: its return the team return (every agent's
        return summed), with ``mean_team_return`` and ``groups`` (per group: ``agents``,
        ``returns`` of each agent life, ``mean_return``).

    Raises:
        ConfigurationError: If ``video_dir`` is a file, or is given for an env that renders no
            rgb_array frames or a multi-agent env; or the env's agents form several groups and
            ``agent`` is not a ``GroupAgents`` (one policy per group).
        MissingDependencyError: If ``video_dir`` is given without the ``video`` extra.
    """
    recorders: list[Any] = []
    wrappers = None
    if video_dir is not None:
        from emote_core.env.video import EpisodeVideos, check_renders_frames, require_video_writer

        require_video_writer()
        check_env(recipe)
        if not recipe.env.entry_point:  # an entry point's class is known only when made
            check_renders_frames(recipe.env.id)
        if video_dir.exists() and not video_dir.is_dir():
            raise ConfigurationError(
                f"the video folder '{video_dir}' is a file; pass a folder (created when missing)"
            )

        def record(single: Any) -> Any:
            recorders.append(EpisodeVideos(single, video_dir, episodes=episodes))
            return recorders[-1]

        wrappers = [record]
    env = make_env(
        recipe, num_envs=1, render_mode="rgb_array" if video_dir else None, wrappers=wrappers
    )
    if video_dir is not None and isinstance(env, ParallelEnvWrapper):
        env.close()
        raise ConfigurationError(
            f"`video_dir` records the episodes of gymnasium envs; '{recipe.env.name}' is a "
            "PettingZoo multi-agent env, whose frames are not recorded — leave it out"
        )
    several = several_groups(env)
    if several and not isinstance(agent, GroupAgents):
        env.close()
        raise ConfigurationError(
            f"'{recipe.env.name}' has {len(several)} agent groups with different spaces "
            f"({describe_groups(several)}), one policy each, and one policy cannot act for all "
            "of them — evaluate the run (or checkpoint) that trained every group, not one "
            "group's ONNX file"
        )
    returns: list[float] = []
    lengths: list[int] = []
    team: list[Any] = []  # a multi-agent env's episodes
    try:
        observations = env.reset(seed=seed)
        while len(returns) < episodes:
            observations = env.step(agent(observations))
            if isinstance(env, ParallelEnvWrapper):  # an episode: all agents' lives, summed
                env.drain_completed_episodes()
                team += env.drain_completed_env_episodes()
                finished = [(e.team_return, e.length) for e in team[len(returns) :]]
            else:
                finished = env.drain_completed_episodes()
            for episode_return, length in finished:
                returns.append(float(episode_return))
                lengths.append(int(length))
            if finished and on_episode is not None:
                on_episode(returns[:episodes])
    finally:
        env.close()
    returns, lengths = returns[:episodes], lengths[:episodes]
    report = {
        "env": recipe.env.name,
        "seed": seed,
        "episodes": len(returns),
        "returns": returns,
        "lengths": lengths,
        "mean_return": float(np.mean(returns)),
        "std_return": float(np.std(returns)),
        "lowest_return": float(np.min(returns)),
        "highest_return": float(np.max(returns)),
    }
    if isinstance(env, ParallelEnvWrapper):
        report.update(_team_report(env, team[:episodes]))
    if video_dir is not None:
        report["video_dir"] = str(video_dir)
        report["videos"] = [str(path) for recorder in recorders for path in recorder.files]
    return report


def _team_report(env: ParallelEnvWrapper, played: list[EnvEpisode]) -> dict[str, Any]:
    """A multi-agent evaluation's extra keys: ``mean_team_return`` (the mean of ``returns``,
    each the sum of every agent's return in one env episode) and per group its agents, every
    agent life's return and their mean."""
    groups = {}
    for group in env.groups:
        lives = [r for episode in played for r in episode.group_returns.get(group.name, [])]
        groups[group.name] = {
            "agents": list(group.agents),
            "returns": lives,
            "mean_return": float(np.mean(lives)) if lives else None,
        }
    return {
        "mean_team_return": float(np.mean([e.team_return for e in played])),
        "groups": groups,
    }


def run_reference_returns(run_path: Path) -> tuple[ReferenceReturns | None, str | None]:
    """The reference returns of the stores a run began training on (its ``run.json``).

    Args:
        run_path: The run directory.

    Returns:
        ``(references, None)`` when every store records the same ones; ``(None, None)`` when the
        run trained on no store or none records any; ``(None, why)`` when a store cannot be
        read or the stores disagree (``why`` is one line).

    Raises:
        FormatError: If the run's ``run.json`` is damaged.
    """
    starts = read_run_record(RunDirectory(run_path).run_file).get("starts") or [{}]
    stores = [str(store) for store in starts[0].get("memory") or []]
    began_in = starts[0].get("directory")
    found: dict[str, ReferenceReturns | None] = {}
    for store in stores:
        located = store
        if began_in and "://" not in store and not os.path.isabs(store):
            # A relative path names the store from where training began, if it is still there.
            started_from = os.path.join(began_in, store)
            located = started_from if os.path.exists(started_from) else store
        try:
            found[store] = reference_returns(located)
        except EmoteError as error:
            return None, f"the run's store '{store}' cannot be read ({error})"
    recorded = set(found.values())
    if recorded == {None} or not recorded:
        return None, None
    if len(recorded) > 1:
        described = "; ".join(
            f"'{store}': " + ("none" if r is None else f"random {r.random:g}, expert {r.expert:g}")
            for store, r in found.items()
        )
        return None, f"the run's stores record different reference returns ({described})"
    return recorded.pop(), None


def with_normalised_score(
    report: dict[str, Any], references: ReferenceReturns | None, *, origin: str | None = None
) -> dict[str, Any]:
    """Adds ``normalised_score`` (of ``mean_return``; ``None`` without ``references``) and
    ``reference_returns`` (``{random, expert, source, from}`` or ``None``) to an evaluation
    report, in place; ``origin`` says where the references came from. Returns ``report``."""
    if references is None:
        report.update(normalised_score=None, reference_returns=None)
        return report
    report["normalised_score"] = references.normalised_score(report["mean_return"])
    report["reference_returns"] = {**references.to_attrs(), "from": origin}
    return report


__all__ = [
    "PolicyKind",
    "evaluate",
    "policy_kind",
    "run_reference_returns",
    "with_normalised_score",
]
