"""Stores say who made them (`emote memory inspect` shows it), and `collect` and `train --memory`
check the store's environment and spaces, and the policy's, before any env steps: a refusal is
one line naming both sides, and nothing is written."""

from __future__ import annotations

import hashlib
import json
import re
import sys
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emote_cli.app import app
from emote_core import __version__
from emote_core.recipes.loading import find_recipe

RAW_SHAPE = re.compile(r"\(\d+,?\)|\[\d+\]|Proxy")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny HitTheMiddle run (its live episodes exported to a store) and its ONNX export."""
    root = tmp_path_factory.mktemp("trained")
    runner = CliRunner(env={"COLUMNS": "200"})
    train = ["train", "sac_hit_the_middle", "--steps", "2", "--run-dir", str(root / "r"),
             "--set", "memory.warmup_steps=64", "-q"]  # fmt: skip
    result = runner.invoke(app, train)
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["export", "onnx", str(root / "r"), "--out", str(root / "p.onnx")])
    assert result.exit_code == 0, result.output
    return root


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(runner: CliRunner, *args: str):
    return runner.invoke(app, list(args))


def snapshot(path: Path) -> dict[str, str]:
    """Every file under ``path`` with the sha256 of its bytes."""
    return {
        str(f.relative_to(path)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(path.rglob("*"))
        if f.is_file()
    }


def one_line_error(result) -> str:
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    # gymnasium's deprecation of CartPole-v0 may come first, as one `warning:` line
    lines = [line for line in result.stderr.splitlines() if not line.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert not RAW_SHAPE.search(lines[0]), lines[0]
    return lines[0]


def inspect_json(runner: CliRunner, store: str | Path) -> dict:
    result = run(runner, "memory", "inspect", str(store), "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_collect_records_the_command_env_recipe_seeds_and_policy(
    runner: CliRunner, in_tmp: Path, trained: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    onnx = trained / "p.onnx"
    command = ["emote", "collect", "sac_hit_the_middle", "--out", "h.zarr", "--policy", str(onnx)]
    monkeypatch.setattr(sys, "argv", command)
    result = run(runner, "collect", "sac_hit_the_middle", "--out", "h.zarr", "--episodes", "2",
                 "--envs", "2", "--seed", "5", "--policy", str(onnx), "-q")  # fmt: skip
    assert result.exit_code == 0, result.output

    provenance = inspect_json(runner, "h.zarr")["provenance"]
    assert provenance["env_id"] == "emote/HitTheMiddle-v0"
    (session,) = provenance["shards"]["main"]
    assert session["command"] == command
    assert session["emote_version"] == __version__
    assert session["env_id"] == "emote/HitTheMiddle-v0"
    assert session["recipe_name"] == "sac_hit_the_middle"
    assert tomllib.loads(session["recipe_toml"])["seed"] == 5
    assert (session["seed"], session["env_seeds"]) == (5, [5, 6])
    assert session["policy"] == {
        "kind": "onnx",
        "path": str(onnx),
        "sha256": hashlib.sha256(onnx.read_bytes()).hexdigest(),
    }
    assert (session["first_episode"], session["episodes"]) == (0, 2)

    result = run(runner, "collect", "sac_hit_the_middle", "--out", "h.zarr", "--episodes", "1",
                 "--policy", str(trained / "r"), "-q")  # fmt: skip
    assert result.exit_code == 0, result.output
    sessions = inspect_json(runner, "h.zarr")["provenance"]["shards"]["main"]
    checkpoint = trained / "r" / "checkpoints" / "checkpoint_2.tar"
    assert sessions[1]["policy"] == {
        "kind": "checkpoint",
        "path": str(checkpoint),
        "sha256": hashlib.sha256(checkpoint.read_bytes()).hexdigest(),
    }
    assert (sessions[1]["first_episode"], sessions[1]["episodes"]) == (2, 1)


def test_inspect_shows_who_wrote_each_shard_and_the_spaces_in_words(
    runner: CliRunner, in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["emote", "collect", "dqn_cartpole", "--out", "c.zarr"])
    result = run(runner, "collect", "dqn_cartpole", "--out", "c.zarr", "--episodes", "2", "-q")
    assert result.exit_code == 0, result.output
    result = run(runner, "memory", "inspect", "c.zarr")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "shard 'main': who wrote it" in out
    for text in ("command: emote collect dqn_cartpole --out c.zarr", "env: CartPole-v1",
                 "recipe: dqn_cartpole", "seed: 0 (env resets 0)", "policy: random",
                 f"emote {__version__}", "made on: CartPole-v1"):  # fmt: skip
        assert text in out, text
    spaces = out[out.index("spaces") :]
    assert re.search(r"observation 'obs'\s*│\s*float32\s*│\s*4 numbers\s*│\s*-4\.8 to 4\.8", spaces)
    assert re.search(r"actions\s*│\s*int64\s*│\s*one of 2 choices\s*│\s*0 to 1", spaces)
    assert '"type": "box"' not in out  # the spaces are no longer one JSON line


def test_a_training_runs_export_records_the_run(runner: CliRunner, trained: Path) -> None:
    provenance = inspect_json(runner, trained / "r" / "memory_export")["provenance"]
    (session,) = provenance["shards"]["main"]
    assert provenance["env_id"] == session["env_id"] == "emote/HitTheMiddle-v0"
    assert session["policy"] == {"kind": "training", "path": str(trained / "r"), "sha256": None}
    assert session["episodes"] >= 1 and session["recipe_name"] == "sac_hit_the_middle"


def test_convert_records_its_command_and_source(
    runner: CliRunner, in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert (
        run(runner, "collect", "dqn_cartpole", "--out", "c.zarr", "--episodes", "1").exit_code == 0
    )
    command = ["emote", "memory", "convert", "c.zarr", "d.zarr"]
    monkeypatch.setattr(sys, "argv", command)
    assert run(runner, "memory", "convert", "c.zarr", "d.zarr", "-q").exit_code == 0
    (session,) = inspect_json(runner, "d.zarr")["provenance"]["shards"]["main"]
    assert session["command"] == command
    assert session["source"]["path"] == str(in_tmp / "c.zarr")
    assert len(session["source"]["sha256"]) == 64


def test_collect_into_a_store_of_another_env_is_refused_before_anything_runs(
    runner: CliRunner, in_tmp: Path
) -> None:
    assert (
        run(runner, "collect", "dqn_cartpole", "--out", "c.zarr", "--episodes", "2").exit_code == 0
    )
    before = snapshot(in_tmp / "c.zarr")

    error = one_line_error(
        run(runner, "collect", "sac_pendulum", "--out", "c.zarr", "--episodes", "1")
    )
    assert error == (
        "error: store 'c.zarr' holds observations 'obs' of 4 numbers; Pendulum-v1 gives 3 "
        "numbers — the store was collected on CartPole-v1; collect into a new store (another "
        "--out), or use a recipe for CartPole-v1"
    )
    Path("v0.toml").write_text(
        find_recipe("dqn_cartpole").read_text().replace("CartPole-v1", "CartPole-v0")
    )
    error = one_line_error(run(runner, "collect", "v0.toml", "--out", "c.zarr", "--episodes", "1"))
    assert "store 'c.zarr' was collected on CartPole-v1; this recipe runs CartPole-v0" in error
    assert snapshot(in_tmp / "c.zarr") == before


@pytest.mark.parametrize("policy", ["r", "p.onnx"])
def test_collect_with_a_policy_of_another_env_is_refused_and_writes_nothing(
    runner: CliRunner, in_tmp: Path, trained: Path, policy: str
) -> None:
    path = trained / policy
    result = run(runner, "collect", "sac_pendulum", "--out", "p.zarr", "--episodes", "1",
                 "--policy", str(path))  # fmt: skip
    assert one_line_error(result) == (
        f"error: policy '{path}' reads observations 'obs' of 2 numbers; Pendulum-v1 gives 3 "
        "numbers — it was trained on emote/HitTheMiddle-v0; collect with a policy trained on "
        "Pendulum-v1, or with a recipe for emote/HitTheMiddle-v0"
    )
    assert list(in_tmp.iterdir()) == []


def test_train_from_a_store_of_another_env_is_refused_before_the_run_is_written(
    runner: CliRunner, in_tmp: Path, trained: Path
) -> None:
    assert (
        run(runner, "collect", "dqn_cartpole", "--out", "c.zarr", "--episodes", "2").exit_code == 0
    )
    store = snapshot(in_tmp / "c.zarr")
    result = run(
        runner, "train", "sac_pendulum", "--memory", "c.zarr", "--no-live", "--run-dir", "w"
    )
    assert one_line_error(result) == (
        "error: store 'c.zarr' holds observations 'obs' of 4 numbers; Pendulum-v1 gives 3 "
        "numbers — the store was collected on CartPole-v1; train from stores collected on "
        "Pendulum-v1, or use a recipe for CartPole-v1"
    )
    assert not (in_tmp / "w").exists()
    run_dir = trained / "r"
    before = snapshot(run_dir)
    result = run(runner, "train", "sac_hit_the_middle", "--memory", "c.zarr", "--resume",
                 "--run-dir", str(run_dir), "--steps", "4")  # fmt: skip
    # The run began without stores: a resume may not bring one (its checkpoints count episodes).
    assert "trains from --memory [], not ['c.zarr']" in one_line_error(result)
    assert snapshot(run_dir) == before  # run.json records no start that never happened
    assert snapshot(in_tmp / "c.zarr") == store
