"""emote on a PettingZoo env (mpe2's simple_spread): collect, inspect, train, eval, export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from emote_cli.app import app

AGENTS = ["agent_0", "agent_1", "agent_2"]
TINY = ["--set", "memory.batch_size=8", "--set", "eval.episodes=1", "--quiet"]


def test_collect_inspect_then_train_from_the_store(runner: CliRunner, in_tmp: Path) -> None:
    collected = runner.invoke(
        app, ["collect", "sac_simple_spread", "--out", "s.zarr", "--episodes", "6", "--json"]
    )
    assert collected.exit_code == 0, collected.output
    summary = json.loads(collected.stdout)
    # Every agent's life is an episode: 2 env episodes of 25 steps, 3 agents each.
    assert (summary["episodes"], summary["transitions"]) == (6, 6 * 25)
    assert summary["env_steps"] == 6 * 25 and summary["dropped_steps"] == 0

    inspected = runner.invoke(app, ["memory", "inspect", "s.zarr", "--json"])
    assert inspected.exit_code == 0, inspected.output
    report = json.loads(inspected.stdout)
    assert report["agents"] == {
        "main": {"agents": AGENTS, "groups": [{"name": "agent", "agents": AGENTS, "episodes": 6}]}
    }
    shown = runner.invoke(app, ["memory", "inspect", "s.zarr"])
    assert "shard 'main': agent groups" in shown.stdout
    assert "agent_0, agent_1, agent_2" in shown.stdout

    trained = runner.invoke(
        app,
        ["train", "sac_simple_spread", "--memory", "s.zarr", "--no-live", "--steps", "3",
         "--run-dir", "runs/offline", "--set", "sac.hidden_dims=[8, 8]", *TINY, "--json"],
    )  # fmt: skip
    assert trained.exit_code == 0, trained.output
    assert json.loads(trained.stdout)["updates"] == 3


def test_train_live_then_eval_reports_team_and_group_returns_then_export(
    runner: CliRunner, in_tmp: Path
) -> None:
    trained = runner.invoke(
        app,
        ["train", "dqn_simple_spread", "--steps", "3", "--run-dir", "runs/live",
         "--set", "memory.warmup_steps=30", "--set", "dqn.hidden_dims=[8, 8]", *TINY, "--json"],
    )  # fmt: skip
    assert trained.exit_code == 0, trained.output

    evaluated = runner.invoke(app, ["eval", "runs/live", "--episodes", "2", "--json"])
    assert evaluated.exit_code == 0, evaluated.output
    report = json.loads(evaluated.stdout)
    assert report["episodes"] == 2 and report["lengths"] == [25, 25]
    group = report["groups"]["agent"]
    assert group["agents"] == AGENTS
    assert len(group["returns"]) == 6  # three agent lives per env episode
    # The team return of an episode is the sum of its agents' returns.
    assert sum(report["returns"]) == pytest.approx(sum(group["returns"]))
    assert report["mean_team_return"] == pytest.approx(np.mean(report["returns"]))
    assert group["mean_return"] == pytest.approx(np.mean(group["returns"]))

    exported = runner.invoke(app, ["export", "onnx", "runs/live", "--out", "p.onnx", "--json"])
    assert exported.exit_code == 0, exported.output
    assert json.loads(exported.stdout)["input_shapes"]["obs"] == ["batch", 18]
    from_onnx = runner.invoke(app, ["eval", "p.onnx", "--episodes", "2", "--json"])
    assert from_onnx.exit_code == 0, from_onnx.output
    onnx_report = json.loads(from_onnx.stdout)
    assert onnx_report["returns"] == pytest.approx(report["returns"], abs=1e-3)
    assert onnx_report["groups"]["agent"]["agents"] == AGENTS

    text = runner.invoke(app, ["eval", "runs/live", "--episodes", "1"])
    assert text.exit_code == 0, text.output
    first, group_line = text.stdout.splitlines()
    assert first.startswith("1 episode of mpe2.simple_spread_v3:parallel_env: mean team return ")
    assert group_line.startswith("group agent (agent_0, agent_1, agent_2): mean return per agent ")


def test_collect_with_a_trained_policy(runner: CliRunner, in_tmp: Path) -> None:
    trained = runner.invoke(
        app,
        ["train", "sac_simple_spread", "--steps", "2", "--run-dir", "runs/p",
         "--set", "memory.warmup_steps=30", "--set", "sac.hidden_dims=[8, 8]", *TINY],
    )  # fmt: skip
    assert trained.exit_code == 0, trained.output
    collected = runner.invoke(
        app,
        ["collect", "sac_simple_spread", "--out", "p.zarr", "--policy", "runs/p",
         "--episodes", "3", "--json"],
    )  # fmt: skip
    assert collected.exit_code == 0, collected.output
    assert json.loads(collected.stdout)["episodes"] == 3


def test_collect_writes_one_store_per_group_of_an_env_with_two(
    runner: CliRunner, in_tmp: Path
) -> None:
    adversary = ["--env", "mpe2.simple_adversary_v3:parallel_env"]
    result = runner.invoke(
        app,
        ["collect", "sac_simple_spread", *adversary, "--out", "adv.zarr", "--episodes", "8",
         "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["stores"] == {"adversary": "adv.adversary.zarr", "agent": "adv.agent.zarr"}
    # 8 agent lives or more: whole env episodes of 1 adversary and 3 agents (N = 3).
    totals = summary["store_totals"]
    assert totals["agent"]["episodes"] == 3 * totals["adversary"]["episodes"]
    assert summary["episodes"] == 4 * totals["adversary"]["episodes"] >= 8
    assert not (in_tmp / "adv.zarr").exists()
    shapes = {}
    for group, store in summary["stores"].items():
        report = json.loads(runner.invoke(app, ["memory", "inspect", store, "--json"]).stdout)
        (record,) = report["agents"].values()
        counts = {g["name"]: g["episodes"] for g in record["groups"]}
        assert counts[group] == totals[group]["episodes"]
        assert sum(counts.values()) == counts[group]  # only its own group's episodes
        shapes[group] = report["columns"]["obs"]["shape"]
    assert shapes["adversary"] != shapes["agent"]  # each store has its group's observations

    text = runner.invoke(
        app, ["collect", "sac_simple_spread", *adversary, "--out", "adv.zarr", "--episodes", "1"]
    )
    assert text.exit_code == 0, text.output
    assert text.stdout.splitlines()[0].endswith(
        "env steps to adv.adversary.zarr (group adversary), adv.agent.zarr (group agent)"
    )

    trained = runner.invoke(
        app, ["collect", "sac_simple_spread", *adversary, "--out", "p.zarr", "--episodes", "2",
              "--policy", "runs/none"],
    )  # fmt: skip
    assert trained.exit_code == 1, trained.output  # each group's policy comes from a run
    assert "'runs/none' is neither a checkpoint file nor a run directory" in trained.stderr
    assert "\n" not in trained.stderr.strip() and not list(in_tmp.glob("p*.zarr"))


def test_a_step_budget_counts_agent_steps(runner: CliRunner, in_tmp: Path) -> None:
    result = runner.invoke(
        app,
        ["collect", "dqn_simple_spread", "--out", "b.zarr", "--steps", "200", "--envs", "2",
         "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    # Each vector step is 2 envs x 3 agents = 6 transitions: the budget is met within one.
    assert 200 <= summary["env_steps"] < 200 + 6
    assert summary["transitions"] + summary["dropped_steps"] == summary["env_steps"]
    assert summary["episodes"] == 6  # one env episode of 25 steps in each env, 3 agents each


def test_eval_video_of_a_multi_agent_env_is_refused_in_one_line(
    runner: CliRunner, in_tmp: Path
) -> None:
    trained = runner.invoke(
        app,
        ["train", "dqn_simple_spread", "--steps", "1", "--run-dir", "runs/v",
         "--set", "memory.warmup_steps=30", "--set", "dqn.hidden_dims=[8, 8]", *TINY],
    )  # fmt: skip
    assert trained.exit_code == 0, trained.output
    result = runner.invoke(app, ["eval", "runs/v", "--episodes", "1", "--video", "videos"])
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: --video records the episodes of gymnasium")
    assert not (in_tmp / "videos").exists()


KNIGHTS_ARCHERS_ZOMBIES = """algorithm = "dqn"
seed = 0
[env]
entry_point = "pettingzoo.butterfly.knights_archers_zombies_v11:parallel_env"
kwargs = { max_cycles = 400, max_zombies = 20, spawn_delay = 5, line_death = true }
[memory]
batch_size = 8
warmup_steps = 50
[dqn]
hidden_dims = [16, 16]
"""


def test_agents_that_die_at_different_steps_of_a_real_game_end_their_own_episodes(
    runner: CliRunner, in_tmp: Path
) -> None:
    """PettingZoo's Knights Archers Zombies: each knight and archer dies on its own step
    (zombies crossing the line end them all later); every life is a TERMINAL episode of its
    own length, and DQN trains and evaluates on the game."""
    Path("kaz.toml").write_text(KNIGHTS_ARCHERS_ZOMBIES, encoding="utf-8")
    collected = runner.invoke(app, ["collect", "kaz.toml", "--out", "k.zarr", "--episodes", "4"])
    assert collected.exit_code == 0, collected.output
    inspected = runner.invoke(app, ["memory", "inspect", "k.zarr", "--returns", "--json"])
    report = json.loads(inspected.stdout)
    assert report["episodes"] == 4 and report["returns"]["end_states"]["TERMINAL"] == 4
    lengths = report["episode_length"]
    assert lengths["min"] < lengths["max"]  # the four lives of one game ended apart
    (group,) = report["agents"]["main"]["groups"]
    assert group["agents"] == ["archer_0", "archer_1", "knight_0", "knight_1"]
    # a copy keeps which agent and group each episode was
    assert runner.invoke(app, ["memory", "convert", "k.zarr", "copy.zarr"]).exit_code == 0
    copied = runner.invoke(app, ["memory", "inspect", "copy.zarr", "--json"])
    assert json.loads(copied.stdout)["agents"] == report["agents"]

    trained = runner.invoke(app, ["train", "kaz.toml", "--steps", "3", "--run-dir", "r", *TINY])
    assert trained.exit_code == 0, trained.output
    evaluated = runner.invoke(app, ["eval", "r", "--episodes", "1", "--json"])
    assert evaluated.exit_code == 0, evaluated.output
    assert len(json.loads(evaluated.stdout)["groups"][group["name"]]["returns"]) == 4
