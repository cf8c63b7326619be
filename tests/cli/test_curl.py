"""The pixel recipe sac_curl_pixels through the command line: train, resume, export, eval and
collect on the run and its ONNX file; and the bad input it refuses, leaving nothing behind."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

from emote_cli.app import app
from emote_core.callbacks.checkpointing import load_checkpoint
from emote_core.stores.zarr_store import MemoryStore

SMALL = ("--device", "cpu", "--set", "env.kwargs={size = 16, frame_stack = 2}",
         "--set", "memory.batch_size=8", "--set", "memory.warmup_steps=40",
         "--set", "training.checkpoint_interval=6", "--set", "eval.episodes=1",
         "--set", "eval.interval=0", "--set", "sac.hidden_dims=[16]",
         "--set", "sac.conv.channels=[4, 4]", "--set", "sac.conv.kernels=[3, 3]",
         "--set", "sac.conv.strides=[2, 2]", "--set", "sac.conv.feature_dim=8",
         "--set", "env.max_episode_steps=20")  # fmt: skip


def invoke(runner: CliRunner, *args: str):
    return runner.invoke(app, list(args))


def test_sac_curl_pixels_trains_resumes_exports_evaluates_and_collects(
    runner: CliRunner, in_tmp: Path
) -> None:
    (in_tmp / "notes.txt").write_text("mine")
    trained = invoke(runner, "train", "sac_curl_pixels", "--run-dir", "run", "--steps", "6",
                     *SMALL, "-q")  # fmt: skip
    assert trained.exit_code == 0, trained.output
    state = load_checkpoint(in_tmp / "run/checkpoints/checkpoint_6.tar")["callbacks"]
    assert state["curl"]["updates"] == 6 and {"q1", "q2", "policy"} <= set(state)
    # The policy's encoder is the one CURL trains: the same weights in both callbacks' networks.
    policy, curl = state["policy"]["network_state_dict"], state["curl"]["network_state_dict"]
    np.testing.assert_array_equal(
        policy["encoder.linear.weight"].numpy(), curl["encoder.linear.weight"].numpy()
    )
    resumed = invoke(runner, "train", "--resume", "--run-dir", "run", "--steps", "12", "-q")
    assert resumed.exit_code == 0, resumed.output
    state = load_checkpoint(in_tmp / "run/checkpoints/checkpoint_12.tar")["callbacks"]
    assert state["curl"]["updates"] == 12

    exported = invoke(runner, "export", "onnx", "run", "--out", "policy.onnx", "--json")
    assert exported.exit_code == 0, exported.output
    (image,) = [i for i in onnx.load("policy.onnx").graph.input if i.name == "obs"]
    assert [d.dim_value for d in image.type.tensor_type.shape.dim[1:]] == [16, 16, 2]

    by_run = json.loads(invoke(runner, "eval", "run", "--json").stdout)
    by_onnx = json.loads(invoke(runner, "eval", "policy.onnx", "--json").stdout)
    assert by_run["lengths"] == [20] and by_onnx["lengths"] == [20]
    assert by_onnx["mean_return"] == pytest.approx(by_run["mean_return"], rel=1e-4)

    for policy_source, out in (("run", "by_run.zarr"), ("policy.onnx", "by_onnx.zarr")):
        collected = invoke(runner, "collect", "run/recipe.toml", "--policy", policy_source,
                           "--out", out, "--episodes", "1", "-q")  # fmt: skip
        assert collected.exit_code == 0, collected.output
        store = MemoryStore(in_tmp / out)
        assert store.episode_count == 1
    assert (in_tmp / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (("env.id=Pendulum-v1",), "curl add-on learns from (height, width, channels) images"),
        (("env.kwargs={frame_stack = 0}",), "frame_stack"),
        (("sac.encoder=mlp",), "'sac.conv' configures an image encoder"),
        (("sac.conv.kernels=[30, 30, 30]",), "too small"),
    ],
)
def test_what_the_pixel_recipe_refuses_leaves_nothing_behind(
    runner: CliRunner, in_tmp: Path, settings: tuple[str, ...], message: str
) -> None:
    sets = [item for setting in settings for item in ("--set", setting)]
    result = invoke(runner, "train", "sac_curl_pixels", "--run-dir", "run", *sets,
                    "--steps", "2", "--device", "cpu")  # fmt: skip
    assert result.exit_code in (1, 2), result.output
    lines = [line for line in result.stderr.splitlines() if line.lower().startswith("error")]
    assert len(lines) == 1 and message in " ".join(result.stderr.split()), result.stderr
    assert not (in_tmp / "run").exists()


def test_sac_curl_car_racing_trains_exports_and_evaluates_its_onnx_file(
    runner: CliRunner, in_tmp: Path
) -> None:
    small = ("--device", "cpu", "--set", "memory.batch_size=4", "--set", "memory.warmup_steps=12",
             "--set", "eval.episodes=1", "--set", "eval.interval=0", "--set", "sac.hidden_dims=[8]",
             "--set", "sac.conv.channels=[4]", "--set", "sac.conv.kernels=[8]",
             "--set", "sac.conv.strides=[8]", "--set", "sac.conv.feature_dim=4",
             "--set", "env.max_episode_steps=10",
             "--set", "training.checkpoint_interval=2")  # fmt: skip
    trained = invoke(runner, "train", "sac_curl_car_racing", "--run-dir", "run", "--steps", "2",
                     *small, "-q")  # fmt: skip
    assert trained.exit_code == 0, trained.output
    resumed = invoke(runner, "train", "--resume", "--run-dir", "run", "--steps", "4", "-q")
    assert resumed.exit_code == 0, resumed.output
    assert (in_tmp / "run/checkpoints/checkpoint_4.tar").is_file()
    exported = invoke(runner, "export", "onnx", "run", "--out", "car.onnx", "-q")
    assert exported.exit_code == 0, exported.output
    (image,) = [i for i in onnx.load("car.onnx").graph.input if i.name == "obs"]
    assert [d.dim_value for d in image.type.tensor_type.shape.dim[1:]] == [84, 84, 9]
    evaluated = json.loads(invoke(runner, "eval", "car.onnx", "--json", "--min-return", "-1e9",
                                  "--recipe", "run/recipe.toml").stdout)  # fmt: skip
    assert evaluated["lengths"] == [10]
