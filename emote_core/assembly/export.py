"""From a run to ONNX and back: exporting a checkpoint's acting network (``emote export onnx``)
and rebuilding the recipe an export carries (``emote eval policy.onnx``)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from emote_core.assembly.builders import load_trained_agent, make_env, policy_graph
from emote_core.errors import ConfigurationError, ExportError
from emote_core.onnx.format import ExportProfile, PolicyMetadata
from emote_core.onnx.graph import policy_metadata
from emote_core.onnx.writer import (
    DEFAULT_OPSET,
    ExportReport,
    check_destination,
    check_opset,
    export_policy,
)
from emote_core.recipes.loading import recipe_from_dict, recipe_to_toml
from emote_core.recipes.schema import Recipe


def export_checkpoint(
    target: str | Path,
    out: str | Path,
    *,
    opset: int = DEFAULT_OPSET,
    recipe: Recipe | str | Path | None = None,
    force: bool = False,
    profile: ExportProfile = ExportProfile.EMOTE,
) -> ExportReport | dict[str, ExportReport]:
    """Exports the acting network of a checkpoint, or of a run directory's latest checkpoint.

    A run on a multi-agent env whose agents form several groups has one policy per group: each
    is written to its own file beside ``out`` (``policy.onnx`` -> ``policy.<group>.onnx``, as
    ML-Agents has one model per behaviour), and the reports come back by group name.

    Args:
        target: A checkpoint file or a run directory.
        out: The ``.onnx`` file to write.
        opset: The default-domain opset (see :data:`emote_core.onnx.writer.SUPPORTED_OPSETS`).
        recipe: The run's recipe; the run's ``recipe.toml`` when omitted.
        force: Replace an existing ``out``.
        profile: The tensor contract to write: emote's own, or what Unity's ML-Agents runtime
            loads (:mod:`emote_core.onnx.ml_agents`, opsets 9 to 15).

    Raises:
        ConfigurationError: If the opset is not supported (for the profile).
        CheckpointError: If there is no checkpoint, or it holds no acting network that fits.
        ExportError: If ``out`` exists (without ``force``) or cannot be written, the profile
            cannot express the policy, or the export fails its checks.
    """
    import torch

    from emote_core.callbacks.checkpointing import load_checkpoint

    check_opset(opset)
    profile = ExportProfile(profile)
    if profile is ExportProfile.ML_AGENTS:
        from emote_core.onnx.ml_agents import check_ml_agents_opset

        check_ml_agents_opset(opset)
    out = Path(out)
    refused: ExportError | None = None
    try:
        check_destination(out, force=force)  # before loading, for a run of one policy
    except ExportError as error:
        refused = error  # a run of several agent groups does not write `out` itself
    loaded, networks, _, spaces, checkpoint = load_trained_agent(
        Path(target), device=torch.device("cpu"), recipe=recipe
    )
    step = int(load_checkpoint(checkpoint).get("bp_step", 0))
    env = make_env(loaded, num_envs=1)
    env.close()
    if isinstance(networks, dict):  # one policy per agent group, one file each
        from emote_core.env.multi_agent import group_store

        outs = {group: Path(group_store(str(out), group, "onnx")) for group in networks}
        for path in outs.values():
            check_destination(path, force=force)  # all of them before writing any
        actions = {g.name: g.action_space for g in env.groups}
        reports: dict[str, ExportReport] = {}
        try:
            for group, path in outs.items():
                reports[group] = _export(
                    loaded, networks[group], spaces[group], path, opset=opset, force=force,  # type: ignore[index]
                    profile=profile, env_action_space=actions[group], step=step,
                    checkpoint=checkpoint,
                )  # fmt: skip
        except BaseException:
            for group in reports:  # written by this call: a partial set is no export
                outs[group].unlink(missing_ok=True)
            raise
        return reports
    if refused is not None:
        raise refused
    return _export(
        loaded, networks, spaces, out, opset=opset, force=force, profile=profile,
        env_action_space=env.env_action_space, step=step, checkpoint=checkpoint,
    )  # fmt: skip


def _export(
    loaded: Recipe,
    networks: Any,
    spaces: Any,
    out: Path,
    *,
    opset: int,
    force: bool,
    profile: ExportProfile,
    env_action_space: Any,
    step: int,
    checkpoint: Path,
) -> ExportReport:
    """Writes one policy's checked export (see :func:`export_checkpoint`)."""
    graph = policy_graph(loaded, networks, spaces)
    if profile is ExportProfile.ML_AGENTS:
        from emote_core.onnx.ml_agents import ml_agents_graph

        graph = ml_agents_graph(graph)  # the same module, behind ML-Agents' tensors
    metadata = policy_metadata(
        graph, recipe_name=loaded.name, recipe_toml=recipe_to_toml(loaded),
        env_action_space=env_action_space, training_step=step,
        checkpoint=checkpoint,
    )  # fmt: skip
    if profile is ExportProfile.ML_AGENTS:
        from emote_core.onnx.ml_agents import ml_agents_metadata

        metadata = ml_agents_metadata(metadata, graph)
    return export_policy(graph, out, opset=opset, metadata=metadata, force=force)


def recipe_from_policy(metadata: PolicyMetadata, *, source: str) -> Recipe:
    """The recipe a policy export was trained with, from its ``recipe_toml`` metadata; its env's
    modules are looked for where the exporting run found them, then beside the file.

    Raises:
        ConfigurationError: If the export carries no recipe (pass one explicitly) or it does
            not load.
    """
    if not metadata.recipe_toml:
        raise ConfigurationError(
            f"'{source}' carries no recipe in its metadata; pass `recipe` (or `env`) to say "
            "where to run it"
        )
    try:
        data = tomllib.loads(metadata.recipe_toml)
    except tomllib.TOMLDecodeError as error:
        raise ConfigurationError(
            f"the recipe inside '{source}' is not valid TOML: {error}"
        ) from error
    recipe = recipe_from_dict(data, source=f"{source} (recipe_toml)")
    here = str(Path(source).resolve().parent)  # the file's own folder, as a recipe file's
    recipe.env_search_paths = (*_run_env_paths(metadata, Path(source)), here)
    return recipe


def _run_env_paths(metadata: PolicyMetadata, path: Path) -> tuple[str, ...]:
    """Where the run that made an export found its env's modules, by its ``run.json``'s env
    record: the run of the source checkpoint, or the run whose ``exports/`` holds the file
    (none: ``()``)."""
    from emote_core.env.making import recorded_search_paths
    from emote_core.errors import EmoteError
    from emote_core.runs import read_run_record

    runs = [path.resolve().parent.parent]
    if metadata.source_checkpoint:
        runs.insert(0, Path(metadata.source_checkpoint).resolve().parent.parent)
    for run in runs:
        try:
            env = read_run_record(run / "run.json").get("env")
        except (EmoteError, OSError):
            continue
        if isinstance(env, dict):
            return tuple(recorded_search_paths(env))
    return ()


__all__ = ["export_checkpoint", "recipe_from_policy"]
