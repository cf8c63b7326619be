"""``emote export onnx``: a checkpoint's policy as one checked, parity-tested ONNX file."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from emote_cli._common import (
    DebugOption,
    ExitCode,
    JsonOption,
    QuietOption,
    abort,
    emit_json,
    handle_errors,
    setup_logging,
    stdout_console,
)
from emote_cli._text import printable

__all__ = ["Profile", "onnx"]


class Profile(StrEnum):
    """The tensor contracts ``--profile`` writes (the library's ``ExportProfile``)."""

    EMOTE = "emote"
    ML_AGENTS = "ml-agents"


def onnx(
    target: Annotated[
        Path,
        typer.Argument(
            metavar="CHECKPOINT_OR_RUN",
            help="A checkpoint file, or a run directory (its latest checkpoint).",
            show_default=False,
        ),
    ],
    out: Annotated[
        Path, typer.Option("--out", help="The .onnx file to write.", show_default=False)
    ],
    opset: Annotated[
        int | None,
        typer.Option(
            "--opset",
            help="ONNX opset, 9 to 23; 9 to 15 with --profile ml-agents (default 15: loads in "
            "onnxruntime and Unity's engine).",
            show_default=False,
        ),
    ] = None,
    recipe: Annotated[
        str | None, typer.Option("--recipe", help="The recipe (default: the run's recipe.toml).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --out.")] = False,
    profile: Annotated[
        Profile,
        typer.Option(
            "--profile",
            help="The tensor contract: emote's own, or ml-agents (what Unity's ML-Agents "
            "runtime, Sentis, loads: obs_0.., action_masks -> version_number, memory_size, "
            "continuous_actions/discrete_actions, ...; see docs/unity.md).",
        ),
    ] = Profile.EMOTE,
    json_output: JsonOption = False,
    quiet: QuietOption = False,
    debug: DebugOption = False,
) -> None:
    """Export a trained policy to one self-contained ONNX file that behaves exactly like it.

    Inputs: one per observation key (plus epsilon for SAC); outputs: actions (SAC: in [-1, 1]).
    --profile ml-agents writes the same policy as Unity's ML-Agents runtime loads it.

    Checked with onnx.checker and against torch in onnxruntime, or not written.
    A run of a multi-agent env with several agent groups has one policy per group: each goes to
    its own file beside --out (policy.onnx -> policy.<group>.onnx).
    """
    setup_logging(quiet=quiet, debug=debug)
    with handle_errors(debug=debug, json_output=json_output):
        from emote_core.onnx.writer import DEFAULT_OPSET, SUPPORTED_OPSETS

        chosen = DEFAULT_OPSET if opset is None else opset
        if chosen not in SUPPORTED_OPSETS:
            abort(
                f"--opset {chosen} is not supported; choose {SUPPORTED_OPSETS.start} to "
                f"{SUPPORTED_OPSETS.stop - 1} (default {DEFAULT_OPSET})",
                ExitCode.USAGE,
            )
        from emote_core.onnx.format import ExportProfile

        chosen_profile = ExportProfile(profile.value)
        if chosen_profile is ExportProfile.ML_AGENTS:
            from emote_core.onnx.ml_agents import ML_AGENTS_OPSETS

            if chosen not in ML_AGENTS_OPSETS:
                abort(
                    f"--opset {chosen} is not one Unity's inference engine (Sentis) loads; with "
                    f"--profile ml-agents choose {ML_AGENTS_OPSETS.start} to "
                    f"{ML_AGENTS_OPSETS.stop - 1} (default {DEFAULT_OPSET})",
                    ExitCode.USAGE,
                )
        from emote_core.assembly.export import export_checkpoint
        from emote_core.recipes import load_recipe

        report = export_checkpoint(
            target, out, opset=chosen, recipe=load_recipe(recipe) if recipe else None,
            force=force, profile=chosen_profile,
        )  # fmt: skip
        if isinstance(report, dict):  # a run of several agent groups: one file per group
            groups = {g: _summary(r, chosen_profile) for g, r in report.items()}
            if json_output:
                emit_json({"groups": groups})
                return
            for group, summary in groups.items():
                _print(summary, f"agent group {group}'s policy of ")
            return
        summary = _summary(report, chosen_profile)
        if json_output:
            emit_json(summary)
        else:
            _print(summary, "")


def _summary(report: Any, profile: Any) -> dict[str, Any]:
    """What ``--json`` prints of one export."""
    from emote_core.onnx.format import ExportProfile

    summary = report.to_json()
    metadata = summary.pop("metadata")
    summary["profile"] = str(profile)
    if profile is ExportProfile.ML_AGENTS:  # the key behind each obs_i
        summary["observation_keys"] = json.loads(metadata["observation_keys"])
    summary["checkpoint"] = metadata["source_checkpoint"]
    summary["checkpoint_sha256"] = metadata["source_checkpoint_sha256"]
    summary["training_step"] = int(metadata["training_step"])
    return summary


def _print(summary: dict[str, Any], whose: str) -> None:
    """The line a text run prints of one export (``whose``: which policy, or empty)."""
    stdout_console().print(  # names from the checkpoint's run and recipe, escaped
        printable(
            f"exported {whose}{summary['checkpoint']} (update {summary['training_step']}) to "
            f"{summary['out']}: opset {summary['opset']}, "
            f"{', '.join(summary['inputs'])} -> {', '.join(summary['outputs'])}; "
            "max abs diff vs torch "
            f"{summary['max_abs_diff']:.2g} at batch 1, 7 and 256"
        ),
        markup=False, highlight=False, soft_wrap=True,
    )  # fmt: skip
