"""GenRL through the command line: the VAE trained offline on a store of demonstrations
(genrl_vae), SAC in its latent action space (genrl_sac_pendulum): train, resume, export, eval and
collect on the runs and their ONNX files; and what they refuse, leaving nothing behind."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from typer.testing import CliRunner

from emote_cli.app import app
from emote_core.algorithms.genrl import read_vae_run
from emote_core.assembly.builders import make_env
from emote_core.recipes import load_recipe
from emote_core.stores.zarr_store import MemoryStore

VAE_SMALL = ("--device", "cpu", "--set", "memory.batch_size=32", "--set", "eval.episodes=1",
             "--set", "eval.interval=0", "--set", "genrl_vae.hidden_dims=[16]",
             "--set", "genrl_vae.latent_dim=2",
             "--set", "training.checkpoint_interval=10")  # fmt: skip
SAC_SMALL = ("--device", "cpu", "--set", "memory.batch_size=16",
             "--set", "memory.warmup_steps=30", "--set", "eval.episodes=1",
             "--set", "eval.interval=0", "--set", "sac.hidden_dims=[16]",
             "--set", "training.checkpoint_interval=10",
             "--set", "env.max_episode_steps=20")  # fmt: skip


@pytest.fixture(scope="module")
def vae_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A genrl_vae run trained for 20 updates on 4 random Pendulum episodes."""
    root = tmp_path_factory.mktemp("genrl")
    runner = CliRunner()
    demos = root / "demos.zarr"
    collected = runner.invoke(app, ["collect", "sac_pendulum", "--out", str(demos),
                                    "--episodes", "4", "--seed", "3", "-q"])  # fmt: skip
    assert collected.exit_code == 0, collected.output
    run = root / "vae"
    trained = runner.invoke(app, ["train", "genrl_vae", "--memory", str(demos), "--no-live",
                                  "--run-dir", str(run), "--steps", "20", *VAE_SMALL,
                                  "-q"])  # fmt: skip
    assert trained.exit_code == 0, trained.output
    return run


def invoke(runner: CliRunner, *args: str):
    return runner.invoke(app, list(args))


def test_the_vae_run_resumes_from_its_store_of_demonstrations(
    runner: CliRunner, vae_run: Path, in_tmp: Path
) -> None:
    import shutil

    run = in_tmp / "vae"
    shutil.copytree(vae_run, run)
    resumed = invoke(runner, "train", "--resume", "--run-dir", str(run), "--no-live", "--steps",
                     "30", "-q")  # fmt: skip
    assert resumed.exit_code == 0, resumed.output
    assert (run / "checkpoints/checkpoint_30.tar").is_file()


def test_the_vae_run_acts_by_decoding_the_prior_and_exports_with_latent_noise(
    runner: CliRunner, vae_run: Path, in_tmp: Path
) -> None:
    by_run = json.loads(invoke(runner, "eval", str(vae_run), "--json",
                               "--min-return", "-1e9").stdout)  # fmt: skip
    assert by_run["lengths"] == [200]
    exported = invoke(runner, "export", "onnx", str(vae_run), "--out", "vae.onnx", "--json")
    assert exported.exit_code == 0, exported.output
    inputs = {i.name: i for i in onnx.load("vae.onnx").graph.input}
    assert inputs["epsilon"].type.tensor_type.shape.dim[1].dim_value == 2  # the latent's width
    by_onnx = json.loads(invoke(runner, "eval", "vae.onnx", "--json",
                                "--min-return", "-1e9").stdout)  # fmt: skip
    assert by_onnx["mean_return"] == pytest.approx(by_run["mean_return"], rel=1e-4)
    # Deterministic acting is the decoder at the prior's mean, latent 0.
    env = make_env(load_recipe(vae_run / "recipe.toml"), num_envs=1)
    vae = read_vae_run(str(vae_run), env.spaces, torch.device("cpu"))
    env.close()
    observation = torch.tensor([[1.0, 0.0, 0.5]])
    expected = vae.decode(torch.zeros(1, 2), observation)
    session = __import__("onnxruntime").InferenceSession("vae.onnx")
    (actions,) = session.run(None, {"obs": observation.numpy(), "epsilon": np.zeros((1, 2), "f")})
    np.testing.assert_allclose(actions, expected.detach().numpy(), atol=1e-5)


def test_latent_sac_trains_resumes_exports_evaluates_and_collects(
    runner: CliRunner, vae_run: Path, in_tmp: Path
) -> None:
    (in_tmp / "notes.txt").write_text("mine")
    sets = ("--set", f"genrl_sac.vae_run='{vae_run}'")
    trained = invoke(runner, "train", "genrl_sac_pendulum", "--run-dir", "run", "--steps", "10",
                     *sets, *SAC_SMALL, "-q")  # fmt: skip
    assert trained.exit_code == 0, trained.output
    # The memory holds latent actions (2 wide; the env's are 1 wide), as the encoder labels them.
    _, columns, _ = next(iter(MemoryStore(in_tmp / "run/memory_export").episodes()))
    assert columns["actions"].shape[1:] == (2,) and np.abs(columns["actions"]).max() <= 1.0
    resumed = invoke(runner, "train", "--resume", "--run-dir", "run", "--steps", "20", "-q")
    assert resumed.exit_code == 0, resumed.output

    exported = invoke(runner, "export", "onnx", "run", "--out", "policy.onnx", "--json")
    assert exported.exit_code == 0, exported.output
    inputs = {i.name: i for i in onnx.load("policy.onnx").graph.input}
    assert inputs["epsilon"].type.tensor_type.shape.dim[1].dim_value == 2
    outputs = {o.name: o for o in onnx.load("policy.onnx").graph.output}
    assert outputs["actions"].type.tensor_type.shape.dim[1].dim_value == 1
    by_run = json.loads(invoke(runner, "eval", "run", "--json", "--min-return", "-1e9").stdout)
    by_onnx = json.loads(invoke(runner, "eval", "policy.onnx", "--json",
                                "--min-return", "-1e9").stdout)  # fmt: skip
    assert by_run["lengths"] == [20] == by_onnx["lengths"]
    assert by_onnx["mean_return"] == pytest.approx(by_run["mean_return"], rel=1e-4)
    for policy, out in (("run", "by_run.zarr"), ("policy.onnx", "by_onnx.zarr")):
        collected = invoke(runner, "collect", "run/recipe.toml", "--policy", policy, "--out", out,
                           "--episodes", "1", "-q")  # fmt: skip
        assert collected.exit_code == 0, collected.output
        held = MemoryStore(in_tmp / out)
        assert held.episode_count == 1
        _, columns, _ = next(iter(held.episodes()))
        assert columns["actions"].shape[1:] == (1,)  # environment actions
    assert (in_tmp / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("genrl_sac_pendulum", "--set", "genrl_sac.vae_run='nowhere'"),
         "'nowhere' is not an emote run directory"),
        (("genrl_sac_pendulum", "--set", "genrl_sac.vae_run=''"), "must name a genrl_vae run"),
        (("genrl_sac_pendulum", "--set", "genrl_sac.latent_scale=0"), "latent_scale must be"),
        (("genrl_vae",), "learns from stored episodes only"),
    ],
)  # fmt: skip
def test_what_genrl_refuses_leaves_nothing_behind(
    runner: CliRunner, in_tmp: Path, args: tuple[str, ...], message: str
) -> None:
    result = invoke(runner, "train", *args, "--run-dir", "run", "--steps", "2", "--device", "cpu")
    assert result.exit_code in (1, 2), result.output
    errors = [line for line in result.stderr.splitlines() if line.lower().startswith("error")]
    assert len(errors) == 1 and message in " ".join(result.stderr.split()), result.stderr
    assert not (in_tmp / "run").exists()


def test_latent_sac_refuses_a_run_that_is_not_a_vae_run_and_stores_of_env_actions(
    runner: CliRunner, vae_run: Path, in_tmp: Path
) -> None:
    other = invoke(runner, "train", "sac_pendulum", "--run-dir", "sac", "--steps", "2",
                   "--set", "memory.warmup_steps=10", "--set", "memory.batch_size=4",
                   "--set", "eval.interval=0", "--device", "cpu", "-q")  # fmt: skip
    assert other.exit_code == 0, other.output
    refused = invoke(runner, "train", "genrl_sac_pendulum", "--run-dir", "run", "--steps", "2",
                     "--set", "genrl_sac.vae_run='sac'", "--device", "cpu")  # fmt: skip
    assert refused.exit_code == 1
    assert "'sac' is a run of 'sac', not of genrl_vae" in " ".join(refused.stderr.split())
    assert not (in_tmp / "run").exists()
    stored = invoke(runner, "train", "genrl_sac_pendulum", "--run-dir", "run", "--steps", "2",
                    "--set", f"genrl_sac.vae_run='{vae_run}'", "--device", "cpu",
                    "--memory", str(vae_run.parent / "demos.zarr"))  # fmt: skip
    assert stored.exit_code == 1
    assert "leave out --memory" in stored.stderr and not (in_tmp / "run").exists()
