"""One policy per agent group: mpe2's simple_adversary (an adversary and two good agents with
different observation sizes) trained, resumed, evaluated, exported and collected with."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from emote_cli.app import app

GROUPS = {"adversary": ["adversary_0"], "agent": ["agent_0", "agent_1"]}
OBSERVATION_SIZES = {"adversary": 8, "agent": 10}


def _recipe(folder: Path, algorithm: str, *, continuous: bool) -> Path:
    recipe = folder / f"{algorithm}_adversary.toml"
    recipe.write_text(
        f'algorithm = "{algorithm}"\nseed = 0\n\n[env]\n'
        'entry_point = "mpe2.simple_adversary_v3:parallel_env"\n'
        f"kwargs = {{ N = 2, max_cycles = 25, continuous_actions = {str(continuous).lower()} }}\n\n"
        "[memory]\nbatch_size = 8\nwarmup_steps = 60\n\n"
        "[training]\nbp_steps = 20\ncheckpoint_interval = 10\nlog_interval = 10\n\n"
        f"[{algorithm}]\nhidden_dims = [8, 8]\n\n[eval]\nepisodes = 1\n"
    )
    return recipe


def _train(runner: CliRunner, *arguments: str) -> dict:
    trained = runner.invoke(app, ["train", *arguments, "--quiet", "--json"])
    assert trained.exit_code == 0, trained.output
    return json.loads(trained.stdout)


def _checkpoint(path: str | Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


def test_sac_trains_one_policy_per_group_then_eval_export_and_collect(
    runner: CliRunner, in_tmp: Path
) -> None:
    recipe = "sac_simple_adversary"  # the shipped recipe, at a tiny budget
    tiny = ["--set", "memory.batch_size=8", "--set", "memory.warmup_steps=60",
            "--set", "sac.hidden_dims=[8, 8]", "--set", "eval.episodes=1",
            "--set", "training.checkpoint_interval=10"]  # fmt: skip
    summary = _train(runner, recipe, "--run-dir", "runs/adv", "--steps", "20", *tiny)
    assert summary["steps"] == 20
    names = set(_checkpoint(summary["checkpoint"])["callbacks"])
    for group in GROUPS:  # every group's losses and memory, under the group's name
        assert {f"{group}/policy", f"{group}/q1", f"{group}/alpha"} <= names
    assert "gym_collector" in names and "policy" not in names
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logs = EventAccumulator(str(in_tmp / "runs/adv/tensorboard"))
    logs.Reload()
    tags = set(logs.Tags()["scalars"])
    for group in GROUPS:  # each group's losses and targets under its own name
        assert {f"loss_bp_step/{group}/q1", f"training_bp_step/{group}/q_target"} <= tags
    assert "training_bp_step/q_target" not in tags

    evaluated = runner.invoke(app, ["eval", "runs/adv", "--episodes", "2", "--json"])
    assert evaluated.exit_code == 0, evaluated.output
    report = json.loads(evaluated.stdout)
    assert report["episodes"] == 2 and report["lengths"] == [25, 25]
    assert {name: group["agents"] for name, group in report["groups"].items()} == GROUPS
    assert len(report["groups"]["adversary"]["returns"]) == 2
    assert len(report["groups"]["agent"]["returns"]) == 4
    lives = [r for group in report["groups"].values() for r in group["returns"]]
    assert sum(report["returns"]) == pytest.approx(sum(lives))
    assert report["mean_team_return"] == pytest.approx(np.mean(report["returns"]))
    text = runner.invoke(app, ["eval", "runs/adv", "--episodes", "1"])
    assert text.exit_code == 0, text.output
    assert "group adversary (adversary_0): mean return per agent" in text.stdout
    assert "group agent (agent_0, agent_1): mean return per agent" in text.stdout

    exported = runner.invoke(app, ["export", "onnx", "runs/adv", "--out", "p.onnx", "--json"])
    assert exported.exit_code == 0, exported.output
    groups = json.loads(exported.stdout)["groups"]
    assert not Path("p.onnx").exists()
    _check_parity(groups, summary["checkpoint"])

    collected = runner.invoke(
        app,
        ["collect", recipe, "--policy", "runs/adv", "--out", "c.zarr", "--episodes", "3",
         "--json", "--quiet"],
    )  # fmt: skip
    assert collected.exit_code == 0, collected.output
    stores = json.loads(collected.stdout)["stores"]
    assert stores == {"adversary": "c.adversary.zarr", "agent": "c.agent.zarr"}
    for group, store in stores.items():
        inspected = runner.invoke(app, ["memory", "inspect", store, "--json"])
        assert inspected.exit_code == 0, inspected.output
        shown = json.loads(inspected.stdout)
        (shard,) = shown["agents"].values()
        episodes = {g["name"]: g["episodes"] for g in shard["groups"]}
        assert episodes[group] > 0 and sum(episodes.values()) == episodes[group]
        assert shown["spaces"]["state"]["spaces"]["obs"]["shape"] == [OBSERVATION_SIZES[group]]

    one_group = runner.invoke(app, ["eval", "p.agent.onnx", "--episodes", "1"])
    assert one_group.exit_code == 1
    assert "one policy cannot act for all of them" in one_group.output
    assert len(one_group.output.strip().splitlines()) == 1

    refused = runner.invoke(
        app,
        ["collect", recipe, "--policy", "p.agent.onnx", "--out", "o.zarr", "--episodes", "1"],
    )
    assert refused.exit_code == 1
    assert "an ONNX file holds one group's policy" in refused.output
    assert not list(in_tmp.glob("o*.zarr"))


def _check_parity(groups: dict, checkpoint: str) -> None:
    """Each group's file loads in onnxruntime and answers as its torch policy does."""
    import onnxruntime

    from emote_core.assembly.builders import load_trained_agent, policy_graph

    loaded, networks, _, spaces, _ = load_trained_agent(
        Path(checkpoint), device=torch.device("cpu")
    )
    assert set(groups) == set(GROUPS) == set(networks)
    for group, export in groups.items():
        assert export["out"] == f"p.{group}.onnx"
        assert export["input_shapes"]["obs"] == ["batch", OBSERVATION_SIZES[group]]
        graph = policy_graph(loaded, networks[group], spaces[group])
        inputs = graph.sample_inputs(5, np.random.default_rng(0))
        session = onnxruntime.InferenceSession(export["out"])
        (actions, *_) = session.run(None, inputs)
        with torch.no_grad():
            expected = graph.module(*(torch.from_numpy(inputs[n]) for n in graph.input_names))
        expected = expected[0] if isinstance(expected, tuple | list) else expected
        np.testing.assert_allclose(actions, expected.numpy(), atol=1e-5)


def test_dqn_groups_train_evaluate_and_export_for_ml_agents(
    runner: CliRunner, in_tmp: Path
) -> None:
    recipe = _recipe(in_tmp, "dqn", continuous=False)
    trained = _train(
        runner, str(recipe), "--run-dir", "runs/dqn", "--set", "training.export_interval=10",
        "--set", "env.normalize_observations=true",
    )  # fmt: skip
    names = set(_checkpoint(trained["checkpoint"])["callbacks"])
    assert {f"{group}/input_normalization" for group in GROUPS} <= names  # each its own
    for group in GROUPS:  # exports while training: each group's policy in its own folder
        assert len(list((in_tmp / "runs/dqn/exports" / group).glob("*.onnx"))) >= 2
    evaluated = runner.invoke(app, ["eval", "runs/dqn", "--episodes", "1", "--json"])
    assert evaluated.exit_code == 0, evaluated.output
    assert set(json.loads(evaluated.stdout)["groups"]) == set(GROUPS)

    exported = runner.invoke(
        app,
        ["export", "onnx", "runs/dqn", "--out", "m.onnx", "--profile", "ml-agents", "--json"],
    )
    assert exported.exit_code == 0, exported.output
    groups = json.loads(exported.stdout)["groups"]
    for group, export in groups.items():
        assert export["out"] == f"m.{group}.onnx" and Path(export["out"]).is_file()
        assert export["input_shapes"]["obs_0"] == ["batch", OBSERVATION_SIZES[group]]
        assert "discrete_actions" in export["outputs"]


def test_resume_restores_every_group(runner: CliRunner, in_tmp: Path) -> None:
    from emote_core.assembly.training import build_training
    from emote_core.recipes import load_recipe
    from emote_core.runs import RunDirectory

    recipe = _recipe(in_tmp, "sac", continuous=True)
    first = _train(runner, str(recipe), "--run-dir", "runs/r", "--steps", "10")
    saved = _checkpoint(first["checkpoint"])["callbacks"]

    # Built for a resume and run to the step it was saved at: every group's networks are the
    # checkpoint's, not the fresh ones the same seed makes.
    setup = build_training(
        load_recipe(str(recipe)), run=RunDirectory(in_tmp / "runs/r"), device=torch.device("cpu"),
        resume=True, bp_steps=10, terminal_log=False,
    )  # fmt: skip
    fresh = {g: {k: v.clone() for k, v in n.acting.state_dict().items()}
             for g, n in setup.networks.items()}  # fmt: skip
    try:
        setup.trainer.train()
    finally:
        setup.env.close()
    for group, networks in setup.networks.items():
        restored = networks.acting.state_dict()
        for key, value in saved[f"{group}/policy"]["network_state_dict"].items():
            assert torch.equal(restored[key], value), (group, key)
        assert any(not torch.equal(fresh[group][k], restored[k]) for k in restored)

    resumed_text = runner.invoke(
        app, ["train", "--resume", "--run-dir", "runs/r", "--steps", "20", "--json"]
    )
    assert resumed_text.exit_code == 0, resumed_text.output
    assert "warning" not in resumed_text.stderr  # every group's memory comes back
    resumed = json.loads(resumed_text.stdout)
    assert (resumed["steps"], resumed["updates"]) == (20, 10)
    later = _checkpoint(resumed["checkpoint"])["callbacks"]
    assert later["gym_collector"]["env_steps"] > saved["gym_collector"]["env_steps"]
    assert {f"{g}/policy" for g in GROUPS} <= set(later)


def _stored_episodes(store: Path, limits: dict[str, int]) -> dict[int, float]:
    """Episode id -> the sum of its rewards, for the first ``limits[shard]`` episodes."""
    from emote_core.stores.zarr_store import MemoryStore

    episodes = MemoryStore(store).episodes(limits=limits)
    return {int(k): float(np.sum(data["rewards"], dtype=np.float64)) for k, data, _ in episodes}


def _group_tables(setup) -> dict[str, dict[int, float]]:
    """Each group's replay table of a built run: episode id -> the sum of its rewards."""
    from emote_core.stores.memory_checkpoint import ReplayMemoryCheckpoint

    tables = {}
    for callback in setup.trainer.callbacks:
        if isinstance(callback, ReplayMemoryCheckpoint):
            group = callback.name.removesuffix("/replay_memory")
            tables[group] = {
                int(k): float(np.sum(data["rewards"], dtype=np.float64))
                for k, data, _ in callback.table.episodes()
            }
    return tables


def test_a_resumed_group_run_refills_every_groups_memory_exactly(
    runner: CliRunner, in_tmp: Path
) -> None:
    from emote_core.assembly.training import build_training
    from emote_core.callbacks.checkpoint_loading import CheckpointLoader
    from emote_core.recipes import load_recipe
    from emote_core.runs import RunDirectory
    from emote_core.stores.zarr_store import MemoryStore

    recipe = _recipe(in_tmp, "sac", continuous=True)
    _train(runner, str(recipe), "--run-dir", "runs/k", "--steps", "20")
    run = in_tmp / "runs/k"
    at_10 = _checkpoint(run / "checkpoints/checkpoint_10.tar")["callbacks"]
    (run / "checkpoints/checkpoint_20.tar").unlink()  # as if killed after checkpoint 10
    expected, counted = {}, {}
    for group in GROUPS:
        state = at_10[f"{group}/replay_memory"]
        counted[group] = state["exported"]["main"]
        store = run / f"memory_export.{group}"
        # It went on committing after checkpoint 10; those episodes are not the table's then.
        assert MemoryStore(store).committed()["main"] > counted[group] > 0
        expected[group] = _stored_episodes(store, state["exported"])
        assert len(expected[group]) == state["episodes"]

    setup = build_training(
        load_recipe(str(recipe)), run=RunDirectory(run), device=torch.device("cpu"),
        resume=True, terminal_log=False,
    )  # fmt: skip
    try:
        loader = next(c for c in setup.trainer.callbacks if isinstance(c, CheckpointLoader))
        loader.restore_state()
        assert _group_tables(setup) == expected  # same episodes, same rewards, none twice
    finally:
        setup.env.close()

    resumed = runner.invoke(
        app, ["train", "--resume", "--run-dir", "runs/k", "--steps", "40", "--json"]
    )
    assert resumed.exit_code == 0, resumed.output
    assert "warning" not in resumed.stderr
    assert json.loads(resumed.stdout)["steps"] == 40
    written = json.loads((in_tmp / "runs/k/run.json").read_text())["written"]
    assert {f"memory_export.{g}" for g in GROUPS} <= set(written)  # still the run's, for --force
    at_40 = _checkpoint(run / "checkpoints/checkpoint_40.tar")["callbacks"]
    for group in GROUPS:
        after = MemoryStore(run / f"memory_export.{group}").committed()
        new = after["resume-1"]  # the resumed run's own shard, beside the first one's
        assert new > 0
        state = at_40[f"{group}/replay_memory"]
        assert state["exported"] == {"main": counted[group], "resume-1": new}
        assert state["episodes"] == counted[group] + new


def test_force_replaces_a_group_runs_memory_stores(runner: CliRunner, in_tmp: Path) -> None:
    import shutil

    from emote_core.stores.zarr_store import MemoryStore

    recipe = _recipe(in_tmp, "sac", continuous=True)
    _train(runner, str(recipe), "--run-dir", "runs/f", "--steps", "20")
    run = in_tmp / "runs/f"
    written = json.loads((run / "run.json").read_text())["written"]
    assert {f"memory_export.{g}" for g in GROUPS} <= set(written)
    first = {g: MemoryStore(run / f"memory_export.{g}").committed() for g in GROUPS}
    # A user's folder and a user's copy of a store, named like the groups' stores: not claimed
    (run / "memory_export.mine").mkdir()
    (run / "memory_export.mine/notes.txt").write_text("mine")
    shutil.copytree(run / "memory_export.agent", run / "memory_export.backup")
    (in_tmp / "runs/beside.txt").write_text("mine too")

    _train(runner, str(recipe), "--run-dir", "runs/f", "--steps", "20", "--force")
    for group in GROUPS:  # the new run's episodes alone, not appended to the old ones
        assert MemoryStore(run / f"memory_export.{group}").committed() == first[group]
    assert (run / "memory_export.mine/notes.txt").read_text() == "mine"
    assert MemoryStore(run / "memory_export.backup").committed() == first["agent"]
    assert (in_tmp / "runs/beside.txt").read_text() == "mine too"


def test_collected_group_stores_train_a_run_without_live_experience(
    runner: CliRunner, in_tmp: Path
) -> None:
    from emote_core.stores.zarr_store import MemoryStore

    recipe = "sac_simple_adversary"
    tiny = ["--set", "memory.batch_size=8", "--set", "sac.hidden_dims=[8, 8]",
            "--set", "eval.episodes=1"]  # fmt: skip
    collected = runner.invoke(
        app, ["collect", recipe, "--out", "c.zarr", "--episodes", "3", "--quiet", "--json"]
    )
    assert collected.exit_code == 0, collected.output
    stores = json.loads(collected.stdout)["stores"]
    # Given in either order: each store goes to the group its episodes record.
    memory = ["--memory", stores["agent"], "--memory", stores["adversary"]]
    summary = _train(runner, recipe, *memory, "--no-live", "--steps", "3", "--run-dir", "runs/s",
                     *tiny)  # fmt: skip
    assert summary["steps"] == 3
    saved = _checkpoint(summary["checkpoint"])["callbacks"]
    assert "gym_collector" not in saved
    for group in GROUPS:
        store = MemoryStore(stores[group])
        state = saved[f"{group}/replay_memory"]
        assert [s["url"] for s in state["sources"]] == [stores[group]]
        assert (state["episodes"], state["transitions"]) == (
            store.episode_count,
            store.transition_count,
        )
    assert not list((in_tmp / "runs/s").glob("memory_export*"))

    evaluated = runner.invoke(app, ["eval", "runs/s", "--episodes", "1", "--json"])
    assert evaluated.exit_code == 0, evaluated.output
    assert set(json.loads(evaluated.stdout)["groups"]) == set(GROUPS)

    resumed = runner.invoke(
        app, ["train", "--resume", "--run-dir", "runs/s", "--steps", "6", "--quiet", "--json"]
    )  # the stores and --no-live come from the run
    assert resumed.exit_code == 0, resumed.output
    later = _checkpoint(json.loads(resumed.stdout)["checkpoint"])["callbacks"]
    for group in GROUPS:
        assert (
            later[f"{group}/replay_memory"]["episodes"]
            == saved[f"{group}/replay_memory"]["episodes"]
        )


def test_stores_that_fit_no_group_are_refused_and_leave_no_run(
    runner: CliRunner, in_tmp: Path
) -> None:
    recipe = _recipe(in_tmp, "sac", continuous=True)
    for command in (
        ["collect", str(recipe), "--out", "s.zarr", "--episodes", "1", "--quiet"],
        ["collect", "sac_hit_the_middle", "--out", "one.zarr", "--episodes", "1", "--quiet"],
    ):
        collected = runner.invoke(app, command)
        assert collected.exit_code == 0, collected.output
    groups = "adversary: adversary_0; agent: agent_0, agent_1"
    cases = {
        "one.zarr": f"error: store 'one.zarr' records no agent group for its episodes, and this "
        f"multi-agent env trains one policy per group ({groups})",
        "s.agent.zarr": "error: group 'adversary' of this multi-agent env has stored 0 "
        "transitions in 0 episodes, fewer than the 8 of one batch",
    }
    for store, message in cases.items():
        refused = runner.invoke(
            app, ["train", str(recipe), "--memory", store, "--no-live", "--run-dir", "runs/m"]
        )
        assert refused.exit_code == 1, refused.output
        assert refused.output.startswith(message), refused.output
        assert len(refused.output.splitlines()) == 1
        assert not (in_tmp / "runs").exists()
    followed = runner.invoke(
        app, ["train", str(recipe), "--memory", "s.agent.zarr", "--follow", "--run-dir", "runs/m"]
    )
    assert followed.exit_code == 1
    assert "does not take --follow" in followed.output
    assert not (in_tmp / "runs").exists()


BAD_ENV = """
import gymnasium as gym
import numpy as np


class NanEnv(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Box(-1, 1, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.full(2, np.nan, np.float32), 0.0, False, False, {}
"""


def test_a_refused_run_takes_the_runs_folder_it_made_with_it(
    runner: CliRunner, in_tmp: Path
) -> None:
    (in_tmp / "nan_env.py").write_text(BAD_ENV)
    recipe = in_tmp / "nan.toml"
    recipe.write_text(
        'algorithm = "sac"\n[env]\nentry_point = "nan_env:NanEnv"\n'
        "[memory]\nbatch_size = 4\nwarmup_steps = 10\n[training]\nbp_steps = 2\n"
        "[sac]\nhidden_dims = [4]\n"
    )
    (in_tmp / "kept").mkdir()
    for run_dir in ("runs/deep/nan", "kept/nan"):
        failed = runner.invoke(app, ["train", str(recipe), "--run-dir", run_dir, "--quiet"])
        assert failed.exit_code == 1, failed.output
        assert "NaN" in failed.output
    assert not (in_tmp / "runs").exists()  # made by the command, empty again: gone
    assert (in_tmp / "kept").is_dir() and not list((in_tmp / "kept").iterdir())


def test_a_group_trains_exactly_as_one_shared_policy_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """simple_spread's one group, trained through the path of several groups, ends with the
    very weights the one-policy path gives: each group's parts are built as for one policy."""
    import emote_core.assembly.training as training
    from emote_core.recipes import load_recipe
    from emote_core.runs import prepare_run

    recipe = load_recipe(
        "dqn_simple_spread",
        ["memory.batch_size=8", "memory.warmup_steps=60", "dqn.hidden_dims=[8, 8]",
         "eval.episodes=1", "memory.store_episodes=false"],
    )  # fmt: skip

    def trained(name: str) -> dict[str, torch.Tensor]:
        run = prepare_run(tmp_path / name, recipe=recipe, command=["test"])
        torch.manual_seed(recipe.seed)
        setup = training.build_training(
            recipe, run=run, device=torch.device("cpu"), bp_steps=30, terminal_log=False
        )
        try:
            setup.trainer.train()
        finally:
            setup.env.close()
        networks = setup.networks
        acting = networks["agent"].acting if isinstance(networks, dict) else networks.acting
        return acting.state_dict()

    shared = trained("one_policy")
    monkeypatch.setattr(
        training, "group_spaces", lambda env: {g.name: env.group_spaces(g.name) for g in env.groups}
    )
    grouped = trained("groups")
    assert shared.keys() == grouped.keys()
    for key, value in shared.items():
        assert torch.equal(value, grouped[key]), key
    saved = _checkpoint(tmp_path / "groups/checkpoints/checkpoint_30.tar")["callbacks"]
    assert {"agent/q", "agent/q_target"} <= set(saved) and "q" not in saved
