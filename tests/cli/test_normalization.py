"""Observation normalisation and reward scaling as a user runs them: statistics of what the run
took in, kept across a resume, restored for eval, and baked into the exported graph."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from typer.testing import CliRunner

from emote_cli.app import app
from emote_core.callbacks.checkpointing import load_checkpoint
from emote_core.stores.zarr_store import MemoryStore

PENDULUM = """
algorithm = "sac"
seed = 0

[env]
id = "Pendulum-v1"
max_episode_steps = 50

[memory]
batch_size = 32
warmup_steps = 100

[training]
bp_steps = 40
checkpoint_interval = 20
log_interval = 10

[sac]
hidden_dims = [32, 32]

[eval]
episodes = 2
"""
NORMALIZE = ("--set", "env.normalize_observations=true")


def invoke(runner: CliRunner, *args: str):
    return runner.invoke(app, list(args))


@pytest.fixture
def recipe(in_tmp: Path) -> Path:
    path = in_tmp / "pendulum.toml"
    path.write_text(PENDULUM)
    return path


def statistics(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(checkpoint)["callbacks"]["input_normalization"]


def stored(store: Path, shard: str | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
    """Every observation row of a store (or one shard), and each episode's rewards."""
    reader = MemoryStore(store)
    limits = None if shard is None else {shard: reader.committed()[shard]}
    episodes = list(reader.episodes(limits=limits))
    assert episodes
    rows = np.concatenate([columns["obs"] for _, columns, _ in episodes]).astype(np.float64)
    return rows, [columns["rewards"].astype(np.float64) for _, columns, _ in episodes]


def discounted(rewards: list[np.ndarray], gamma: float) -> np.ndarray:
    returns = []
    for episode in rewards:
        running = 0.0
        for reward in episode.reshape(-1):
            running = gamma * running + reward
            returns.append(running)
    return np.array(returns)


def returns_of(result) -> list[float]:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["returns"]


def test_a_normalised_run_learns_from_each_collected_observation_once_and_exports_it_inside(
    runner: CliRunner, recipe: Path, in_tmp: Path
) -> None:
    trained = invoke(runner, "train", str(recipe), *NORMALIZE, "--set",
                     "env.normalize_rewards=true", "--run-dir", "r", "-q", "--json")  # fmt: skip
    assert trained.exit_code == 0, trained.output
    saved = statistics(in_tmp / "r" / "checkpoints" / "checkpoint_40.tar")
    rows, rewards = stored(in_tmp / "r" / "memory_export")
    observations = saved["observations"]
    assert float(observations["statistics.0.count"]) == len(rows)  # each observation once
    np.testing.assert_allclose(observations["statistics.0.mean"], rows.mean(0), rtol=1e-5)
    np.testing.assert_allclose(observations["statistics.0.var"], rows.var(0), rtol=1e-4)
    returns = discounted(rewards, gamma=0.99)  # sac.gamma
    assert float(saved["returns"]["statistics.count"]) == len(returns)
    np.testing.assert_allclose(saved["returns"]["statistics.var"], [returns.var()], rtol=1e-4)

    exported = invoke(runner, "export", "onnx", "r", "--out", "policy.onnx", "--json")
    assert exported.exit_code == 0, exported.output
    graph = onnx.load(in_tmp / "policy.onnx").graph
    assert [i.name for i in graph.input] == ["obs", "epsilon"]  # raw observations, no extras
    # The statistics are float constants: no count, no double or bool tensors for an engine.
    assert {i.data_type for i in graph.initializer} == {onnx.TensorProto.FLOAT}
    # The same episodes through the ONNX file and through the run's rebuilt torch policy.
    by_run = returns_of(invoke(runner, "eval", "r", "--episodes", "2", "--seed", "3", "--json"))
    by_file = returns_of(
        invoke(runner, "eval", "policy.onnx", "--episodes", "2", "--seed", "3", "--json")
    )
    assert by_file == pytest.approx(by_run, rel=1e-5)

    from emote_core.assembly.builders import load_trained_agent

    _, networks, agent, _, _ = load_trained_agent(in_tmp / "r", device=torch.device("cpu"))
    raw = np.random.default_rng(0).normal([0.5, -0.5, 300.0], [1.0, 1.0, 100.0], (16, 3))
    raw = raw.astype(np.float32)
    session = onnxruntime.InferenceSession(str(in_tmp / "policy.onnx"))
    (onnx_actions,) = session.run(None, {"obs": raw, "epsilon": np.zeros((16, 1), np.float32)})
    torch_actions = agent.act_batch({"obs": raw})
    np.testing.assert_allclose(onnx_actions, torch_actions, atol=1e-5)
    with torch.no_grad():  # the raw observations through the bare policy act otherwise
        bare = networks.acting(torch.from_numpy(raw), torch.zeros(16, 1)).numpy()
    assert not np.allclose(bare, torch_actions, atol=1e-3)
    # Evaluation froze the statistics: a second evaluation sees the same ones.
    again = returns_of(invoke(runner, "eval", "r", "--episodes", "2", "--seed", "3", "--json"))
    assert again == by_run


def test_a_resumed_run_goes_on_from_the_statistics_of_its_checkpoint(
    runner: CliRunner, recipe: Path, in_tmp: Path
) -> None:
    five = ("--set", "training.inference_steps_per_batch=5", "--steps", "20", "-q")
    straight = invoke(runner, "train", str(recipe), *NORMALIZE, *five, "--run-dir", "s")
    assert straight.exit_code == 0, straight.output
    first = invoke(runner, "train", str(recipe), *NORMALIZE, *five, "--run-dir", "p")
    assert first.exit_code == 0, first.output
    at_20 = statistics(in_tmp / "p" / "checkpoints" / "checkpoint_20.tar")["observations"]
    same = statistics(in_tmp / "s" / "checkpoints" / "checkpoint_20.tar")["observations"]
    assert all(torch.equal(at_20[key], same[key]) for key in at_20)
    resumed = invoke(runner, "train", "--resume", "--run-dir", "p", "--steps", "40", "-q")
    assert resumed.exit_code == 0, resumed.output
    at_40 = statistics(in_tmp / "p" / "checkpoints" / "checkpoint_40.tar")["observations"]
    # The checkpoint's statistics, then every observation collected after the resume.
    new, _ = stored(in_tmp / "p" / "memory_export", shard="resume-1")
    count = float(at_20["statistics.0.count"])
    assert float(at_40["statistics.0.count"]) == count + len(new)
    merged_mean = (at_20["statistics.0.mean"].double() * count + new.sum(0)) / (count + len(new))
    np.testing.assert_allclose(at_40["statistics.0.mean"], merged_mean, rtol=1e-5)


def test_offline_training_from_a_store_normalises_by_the_stores_observations_and_resumes_exactly(
    runner: CliRunner, recipe: Path, in_tmp: Path
) -> None:
    collected = invoke(runner, "collect", str(recipe), "--out", "store.zarr", "--episodes", "4",
                       "-q", "--json")  # fmt: skip
    assert collected.exit_code == 0, collected.output
    offline = (str(recipe), *NORMALIZE, "--set", "env.normalize_rewards=true", "--no-live",
               "--memory", "store.zarr", "-q")  # fmt: skip
    straight = invoke(runner, "train", *offline, "--run-dir", "s")
    assert straight.exit_code == 0, straight.output
    first = invoke(runner, "train", *offline, "--steps", "20", "--run-dir", "p")
    assert first.exit_code == 0, first.output
    resumed = invoke(
        runner, "train", "--resume", "--run-dir", "p", "--no-live", "--steps", "40", "-q"
    )
    assert resumed.exit_code == 0, resumed.output

    tail = Path("checkpoints") / "checkpoint_40.tar"
    a, b = statistics(in_tmp / "s" / tail), statistics(in_tmp / "p" / tail)
    rows, _ = stored(in_tmp / "store.zarr")
    assert float(a["observations"]["statistics.0.count"]) == len(rows)
    for part in ("observations", "returns"):
        assert all(torch.equal(a[part][key], b[part][key]) for key in a[part])
    weights = ("policy", "q1")
    for name in weights:  # the same batches, normalised the same way, learned the same
        x = load_checkpoint(in_tmp / "s" / tail)["callbacks"][name]["network_state_dict"]
        y = load_checkpoint(in_tmp / "p" / tail)["callbacks"][name]["network_state_dict"]
        assert all(torch.equal(x[key], y[key]) for key in x)


def test_dqn_acts_and_exports_with_normalised_observations(runner: CliRunner, in_tmp: Path) -> None:
    trained = invoke(runner, "train", "dqn_cartpole", *NORMALIZE, "--steps", "30",
                     "--set", "memory.warmup_steps=64", "--set", "memory.batch_size=16",
                     "--set", "eval.episodes=1", "--run-dir", "d", "-q")  # fmt: skip
    assert trained.exit_code == 0, trained.output
    exported = invoke(runner, "export", "onnx", "d", "--out", "q.onnx", "-q")
    assert exported.exit_code == 0, exported.output
    judge = ("--episodes", "2", "--seed", "1", "--min-return", "0", "--json")
    by_run = returns_of(invoke(runner, "eval", "d", *judge))
    by_file = returns_of(invoke(runner, "eval", "q.onnx", *judge))
    assert by_file == by_run
    saved = statistics(next((in_tmp / "d" / "checkpoints").glob("checkpoint_*.tar")))
    assert float(saved["observations"]["statistics.0.count"]) > 0


@pytest.mark.parametrize("clip", ["0", "-1.5", "inf"])
def test_observation_clip_must_be_finite_and_positive(
    runner: CliRunner, recipe: Path, in_tmp: Path, clip: str
) -> None:
    refused = invoke(runner, "train", str(recipe), *NORMALIZE, "--set",
                     f"env.observation_clip={clip}", "--run-dir", "r")  # fmt: skip
    assert refused.exit_code in (1, 2), refused.output
    assert "'env.observation_clip'" in refused.stderr and "finite number above 0" in refused.stderr
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert not (in_tmp / "r").exists()


def test_a_recipe_that_normalises_refuses_a_checkpoint_without_statistics_in_one_line(
    runner: CliRunner, in_tmp: Path
) -> None:
    trained = invoke(runner, "train", "dqn_cartpole", "--steps", "2", "--set",
                     "memory.warmup_steps=32", "--set", "memory.batch_size=8", "--set",
                     "eval.episodes=1", "--run-dir", "d", "-q")  # fmt: skip
    assert trained.exit_code == 0, trained.output
    recipe = in_tmp / "normalised.toml"
    text = (in_tmp / "d" / "recipe.toml").read_text()
    assert "normalize_observations = false" in text  # the run's resolved recipe
    recipe.write_text(
        text.replace("normalize_observations = false", "normalize_observations = true")
    )
    refused = invoke(runner, "eval", "d", "--recipe", str(recipe), "--episodes", "1")
    assert refused.exit_code == 1, refused.output
    assert "holds no observation statistics" in refused.stderr
    assert refused.stderr.count("\n") == 1, refused.stderr
