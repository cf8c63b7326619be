"""What ``emote eval`` is given is recognised before anything is loaded: a run directory, a
checkpoint or an ONNX policy, and anything else is named as none of them."""

from __future__ import annotations

import random
import zipfile
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from emote_cli.app import app
from emote_core.assembly.evaluation import PolicyKind, policy_kind
from emote_core.callbacks.checkpointing import is_torch_file
from emote_core.errors import ConfigurationError
from emote_core.recipes import load_recipe
from emote_core.runs import prepare_run


def test_runs_checkpoints_and_onnx_files_are_recognised(tmp_path: Path) -> None:
    run = prepare_run(tmp_path / "run", recipe=load_recipe("sac_pendulum"), command=["emote"])
    assert policy_kind(run.path) is PolicyKind.RUN
    checkpoints = tmp_path / "copied" / "checkpoints"
    checkpoints.mkdir(parents=True)  # a run copied without its run.json still has checkpoints/
    assert policy_kind(checkpoints.parent) is PolicyKind.RUN
    for legacy in (False, True):
        path = tmp_path / f"checkpoint_{int(legacy)}.tar"
        torch.save({"x": torch.zeros(2)}, path, _use_new_zipfile_serialization=not legacy)
        assert is_torch_file(path) and policy_kind(path) is PolicyKind.CHECKPOINT
    assert policy_kind(tmp_path / "policy.onnx") is PolicyKind.ONNX  # onnxruntime judges it


def _not_a_policy(tmp_path: Path) -> dict[str, Path]:
    text = tmp_path / "notes.txt"
    text.write_text("these are my notes\n", encoding="utf-8")
    noise = tmp_path / "noise.tar"
    noise.write_bytes(b"\x13" + random.Random(0).randbytes(4096))  # neither zip nor pickle
    archive = tmp_path / "other.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("readme.md", "not torch")
    folder = tmp_path / "photos"
    folder.mkdir()
    return {"text": text, "noise": noise, "archive": archive, "folder": folder}


@pytest.mark.parametrize("kind", ["text", "noise", "archive", "folder"])
def test_anything_else_is_named_as_none_of_the_three(tmp_path: Path, kind: str) -> None:
    target = _not_a_policy(tmp_path)[kind]
    with pytest.raises(ConfigurationError) as caught:
        policy_kind(target)
    assert str(caught.value).startswith(
        f"'{target}' is not a run directory, a checkpoint or an ONNX policy ("
    )
    assert not is_torch_file(target)


@pytest.mark.parametrize("kind", ["text", "noise"])
def test_emote_eval_on_a_file_that_is_no_policy_says_exactly_that(
    runner: CliRunner, tmp_path: Path, kind: str
) -> None:
    target = _not_a_policy(tmp_path)[kind]
    result = runner.invoke(app, ["eval", str(target)])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(
        f"error: '{target}' is not a run directory, a checkpoint or an ONNX policy"
    )
    export = runner.invoke(app, ["export", "onnx", str(target), "--out", str(tmp_path / "p.onnx")])
    assert export.exit_code == 1
    assert f"'{target}' is not a checkpoint" in export.stderr
