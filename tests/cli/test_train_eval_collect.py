"""`emote collect`, `emote train` and `emote eval` as a user runs them: real envs, real runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emote_cli.app import app


def run(runner: CliRunner, *args: str):
    return runner.invoke(app, list(args))


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_sac_hit_the_middle_learns_within_2000_updates(runner: CliRunner, in_tmp: Path) -> None:
    result = run(runner, "train", "sac_hit_the_middle", "--run-dir", "runs/htm", "--json", "-q")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["steps"] == 2_000
    assert Path(summary["checkpoint"]).name == "checkpoint_2000.tar"
    run_dir = in_tmp / "runs" / "htm"
    assert (run_dir / "recipe.toml").is_file() and (run_dir / "run.json").is_file()
    assert list((run_dir / "tensorboard").iterdir())

    result = run(runner, "eval", "runs/htm", "--episodes", "10", "--min-return", "-5", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["episodes"] == 10 and len(report["returns"]) == 10
    assert report["mean_return"] >= -5.0
    assert json.loads((run_dir / "eval.json").read_text())["mean_return"] == report["mean_return"]


def test_eval_exits_3_below_the_threshold_and_resume_continues(
    runner: CliRunner, in_tmp: Path
) -> None:
    args = ("train", "sac_hit_the_middle", "--steps", "60", "--run-dir", "r", "-q", "--json")
    assert run(runner, *args).exit_code == 0
    result = run(runner, "eval", "r", "--episodes", "2", "--min-return", "1000")
    assert result.exit_code == 3
    assert "below --min-return" in result.stderr

    again = run(runner, *args)
    assert again.exit_code == 1 and "already exists; pass --resume" in again.stderr
    resumed = run(runner, "train", "sac_hit_the_middle", "--steps", "90", "--run-dir", "r",
                  "--resume", "-q", "--json")  # fmt: skip
    assert resumed.exit_code == 0, resumed.output
    assert json.loads(resumed.stdout)["steps"] == 90
    starts = json.loads((in_tmp / "r" / "run.json").read_text())["starts"]
    assert [s["resume"] for s in starts] == [False, True]


def test_collect_then_train_offline_from_the_store(runner: CliRunner, in_tmp: Path) -> None:
    result = run(runner, "collect", "sac_pendulum", "--out", "p.zarr", "--steps", "2000",
                 "--envs", "2", "--json", "-q")  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["episodes"] == 10 and summary["transitions"] == 2000
    inspected = json.loads(run(runner, "memory", "inspect", "p.zarr", "--json").stdout)
    assert inspected["end_states"]["INTERRUPTED"] == 10  # Pendulum's time limit
    result = run(runner, "train", "sac_pendulum", "--memory", "p.zarr", "--no-live",
                 "--steps", "50", "--run-dir", "off", "--json", "-q")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["steps"] == 50
    both = run(runner, "train", "sac_pendulum", "--memory", "p.zarr", "--steps", "20",
               "--run-dir", "both", "--set", "memory.warmup_steps=0", "--json", "-q")  # fmt: skip
    assert both.exit_code == 0, both.output  # starts from the store and keeps collecting
    assert json.loads(both.stdout)["steps"] == 20


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("train", "sac_pendulm"), "did you mean sac_pendulum"),
        (
            ("train", "sac_pendulum", "--set", "training.bp_step=3"),
            "did you mean 'training.bp_steps'",
        ),
        (("train", "sac_pendulum", "--set", "env.id=Pendulum-v9"), "did you mean"),
        (("train", "sac_pendulum", "--resume", "--run-dir", "nowhere"), "holds no run"),
        (("train", "sac_pendulum", "--no-live"), "pass --memory STORE"),
        (("eval", "missing-run"), "neither a checkpoint file nor a run directory"),
        (("collect", "sac_pendulum", "--out", "x.zarr"), "exactly one of --episodes"),
    ],
)
def test_bad_input_is_one_line_and_nothing_is_written(
    runner: CliRunner, in_tmp: Path, args: tuple[str, ...], message: str
) -> None:
    result = run(runner, *args)
    assert result.exit_code in (1, 2)
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not (in_tmp / "runs").exists()


def test_a_store_from_another_env_is_refused(runner: CliRunner, in_tmp: Path) -> None:
    assert (
        run(runner, "collect", "dqn_cartpole", "--out", "c.zarr", "--episodes", "2").exit_code == 0
    )
    result = run(
        runner, "train", "sac_pendulum", "--memory", "c.zarr", "--no-live", "--run-dir", "w"
    )
    assert result.exit_code == 1
    assert "the store was collected on CartPole-v1" in result.stderr


def test_ctrl_c_checkpoints_and_exits_130(in_tmp: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "emote_cli", "train", "sac_hit_the_middle", "--steps", "100000",
         "--run-dir", "interrupted", "--set", "training.checkpoint_interval=20", "-q"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    checkpoints = in_tmp / "interrupted" / "checkpoints"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(checkpoints.glob("checkpoint_*.tar")):
        time.sleep(0.2)  # it has trained a little: its first interval's checkpoint is there
    process.send_signal(signal.SIGINT)
    _, errors = process.communicate(timeout=120)
    assert process.returncode == 130, errors.decode()
    # The checkpoint written where it stopped is the newest.
    written = checkpoints.glob("checkpoint_*.tar")
    update = max(int(path.stem.removeprefix("checkpoint_")) for path in written)
    assert update >= 20
    assert f"interrupted at update {update};" in errors.decode()


def test_a_dqn_run_acts_with_exploration_when_asked_to_sample(
    runner: CliRunner, in_tmp: Path
) -> None:
    trained = run(runner, "train", "dqn_cartpole", "--steps", "20", "--run-dir", "d", "-q",
                  "--set", "memory.warmup_steps=64", "--set", "memory.batch_size=32")  # fmt: skip
    assert trained.exit_code == 0, trained.output
    sampled = run(runner, "eval", "d", "--stochastic", "--episodes", "2", "--min-return", "0",
                  "--json", "-q")  # fmt: skip
    assert sampled.exit_code == 0, sampled.output
    assert json.loads(sampled.stdout)["deterministic"] is False
    collected = run(runner, "collect", "dqn_cartpole", "--policy", "d", "--out", "d.zarr",
                    "--episodes", "2", "--json", "-q")  # fmt: skip
    assert collected.exit_code == 0, collected.output
    assert json.loads(collected.stdout)["episodes"] >= 2


def test_threads_sets_torchs_cpu_threads(
    runner: CliRunner, in_tmp: Path, restore_torch_threads: None
) -> None:
    args = ("--threads", "1", "--run-dir", "t", "--set", "memory.warmup_steps=64")
    result = run(runner, "train", "sac_hit_the_middle", "--steps", "5", *args, "--json", "-q")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["threads"] == 1
    bad = run(runner, "train", "sac_hit_the_middle", "--threads", "0", "--run-dir", "t0")
    assert bad.exit_code == 2 and not (in_tmp / "t0").exists()


@pytest.mark.parametrize("recipe", ["sac_hit_the_middle", "sac_pendulum", "dqn_cartpole",
                                    "sac_lunar_lander"])  # fmt: skip
def test_every_shipped_recipe_trains_evaluates_and_exports(
    runner: CliRunner, in_tmp: Path, recipe: str, restore_torch_threads: None
) -> None:
    from emote_core.recipes import available_recipes

    assert recipe in available_recipes()
    tiny = ("--set", "memory.warmup_steps=300", "--set", "memory.batch_size=16", "--threads", "1")
    trained = run(runner, "train", recipe, "--steps", "3", "--run-dir", "r", *tiny, "-q")
    assert trained.exit_code == 0, trained.output
    # Three updates do not reach the recipe's eval.min_return; this checks that eval runs.
    evaluated = run(runner, "eval", "r", "--episodes", "1", "--min-return", "-1e6", "--json", "-q")
    assert evaluated.exit_code == 0, evaluated.output
    assert json.loads(evaluated.stdout)["episodes"] == 1
    exported = run(runner, "export", "onnx", "r", "--out", "p.onnx", "--json", "-q")
    assert exported.exit_code == 0, exported.output
    assert json.loads(exported.stdout)["max_abs_diff"] <= 1e-5
    for policy in ("r", "p.onnx"):  # the trained checkpoint, then its export
        collected = run(runner, "collect", recipe, "--policy", policy, "--out", "c.zarr",
                        "--episodes", "1", "--json", "-q")  # fmt: skip
        assert collected.exit_code == 0, collected.output
    stored = run(runner, "memory", "inspect", "c.zarr", "--json")
    assert stored.exit_code == 0, stored.output
    assert json.loads(stored.stdout)["episodes"] >= 2


def test_resume_and_eval_fall_back_past_a_truncated_checkpoint(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train = ["train", "sac_hit_the_middle", "--run-dir", "run", "--set", "memory.warmup_steps=64",
             "--set", "training.checkpoint_interval=10"]  # fmt: skip
    assert runner.invoke(app, [*train, "--steps", "20"]).exit_code == 0
    latest = tmp_path / "run" / "checkpoints" / "checkpoint_20.tar"
    latest.write_bytes(latest.read_bytes()[:1000])  # a full disk cut the last write short
    leftover = tmp_path / "run" / "checkpoints" / ".checkpoint_30.abc.tmp"
    leftover.write_bytes(b"half a checkpoint")
    mine = tmp_path / "run" / "checkpoints" / "my_notes.tmp"  # a user's file beside them
    mine.write_text("keep me")

    evaluated = runner.invoke(app, ["eval", "run", "--episodes", "1", "--min-return", "-100",
                                    "--json"])  # fmt: skip
    assert evaluated.exit_code == 0, evaluated.stderr
    assert json.loads(evaluated.stdout)["checkpoint"].endswith("checkpoint_10.tar")
    assert "skipping checkpoint" in evaluated.stderr and "checkpoint_20.tar" in evaluated.stderr

    resumed = runner.invoke(app, [*train, "--resume", "--steps", "30"])
    assert resumed.exit_code == 0, resumed.stderr
    names = {p.name for p in (tmp_path / "run" / "checkpoints").iterdir()}
    aside = [name for name in names if name.startswith("checkpoint_20.tar.damaged-")]
    assert len(aside) == 1  # the unreadable one is kept, out of the way
    assert names - set(aside) == {
        "checkpoint_10.tar", "checkpoint_20.tar", "checkpoint_30.tar", "best.tar", "my_notes.tmp",
    }  # fmt: skip
    assert not leftover.exists() and mine.read_text() == "keep me"


def test_force_replaces_a_run_and_never_a_user_folder_the_cwd_or_a_folder_of_runs(
    runner: CliRunner, in_tmp: Path
) -> None:
    train = ["train", "sac_hit_the_middle", "--steps", "2", "--set", "memory.warmup_steps=64",
             "-q", "--force"]  # fmt: skip
    (in_tmp / "notes.txt").write_text("mine")
    Path("mine").mkdir()
    (in_tmp / "mine" / "data.csv").write_text("1,2,3")
    assert run(runner, "train", "sac_hit_the_middle", "--steps", "2", "--run-dir", "runs/a",
               "--set", "memory.warmup_steps=64", "-q").exit_code == 0  # fmt: skip
    Path("runs/a/my_plot.png").write_bytes(b"a user's file inside a run stays theirs")
    Path("linked").symlink_to("mine")
    refusals = {
        ".": "is the working directory or holds it",
        "..": "is the working directory or holds it",
        "mine": "is not an emote run",
        "runs": "is not an emote run",
        "linked": "is a symbolic link",
    }
    for target, message in refusals.items():
        result = run(runner, *train, "--run-dir", target)
        assert result.exit_code == 1, (target, result.output)
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    # A folder of runs that carries a run.json itself is still refused.
    Path("runs/run.json").write_text(Path("runs/a/run.json").read_text())
    result = run(runner, *train, "--run-dir", "runs")
    assert result.exit_code == 1 and "holds other runs" in result.stderr
    Path("runs/run.json").unlink()
    assert (in_tmp / "notes.txt").read_text() == "mine"
    assert (in_tmp / "mine" / "data.csv").read_text() == "1,2,3"
    assert Path("runs/a/my_plot.png").exists()
    replaced = run(runner, *train, "--run-dir", "runs/a")  # a real run: replaced
    assert replaced.exit_code == 0, replaced.stderr
    assert Path("runs/a/my_plot.png").exists()  # --force deletes only what the run wrote
    assert json.loads(Path("runs/a/run.json").read_text())["format"] == "emote-run"


def test_collect_and_export_never_write_over_a_folder_of_user_files(
    runner: CliRunner, in_tmp: Path
) -> None:
    Path("mine").mkdir()
    (in_tmp / "mine" / "data.csv").write_text("1,2,3")
    collect = run(runner, "collect", "sac_pendulum", "--out", "mine", "--episodes", "1")
    assert collect.exit_code == 1 and "already holds data" in collect.stderr
    assert sorted(p.name for p in (in_tmp / "mine").iterdir()) == ["data.csv"]
    assert run(runner, "train", "sac_hit_the_middle", "--steps", "2", "--run-dir", "r",
               "--set", "memory.warmup_steps=64", "-q").exit_code == 0  # fmt: skip
    for flags in ([], ["--force"]):
        exported = run(runner, "export", "onnx", "r", "--out", "mine", *flags)
        assert exported.exit_code == 1, exported.output
        assert sorted(p.name for p in (in_tmp / "mine").iterdir()) == ["data.csv"]
    (in_tmp / "mine.onnx").write_text("a user's file that happens to end in .onnx")
    exported = run(runner, "export", "onnx", "r", "--out", "mine.onnx", "--force")
    assert exported.exit_code == 1 and "is not an ONNX model" in exported.stderr
    assert (in_tmp / "mine.onnx").read_text().startswith("a user's file")
    assert run(runner, "export", "onnx", "r", "--out", "p.onnx").exit_code == 0
    assert run(runner, "export", "onnx", "r", "--out", "p.onnx", "--force").exit_code == 0


def test_train_show_prints_the_resolved_recipe_and_starts_no_run(
    runner: CliRunner, in_tmp: Path
) -> None:
    import tomllib

    from emote_core.recipes import load_recipe
    from emote_core.recipes.loading import recipe_to_dict

    args = ("train", "sac_pendulum", "--show", "--set", "training.bp_steps=7", "--seed", "5")
    expected = load_recipe("sac_pendulum", ["training.bp_steps=7", "seed=5"])
    shown = run(runner, *args)
    assert shown.exit_code == 0, shown.output
    recipe = tomllib.loads(shown.stdout)
    assert recipe["training"]["bp_steps"] == 7 and recipe["seed"] == 5
    assert recipe["env"]["id"] == "Pendulum-v1"
    assert "learning_rate" in recipe["sac"]  # every key, the defaults included
    (in_tmp / "shown.toml").write_text(shown.stdout)
    assert load_recipe("shown.toml") == expected

    as_json = run(runner, *args, "--json")
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout) == recipe_to_dict(expected)
    assert list(in_tmp.iterdir()) == [in_tmp / "shown.toml"]  # no runs/ directory

    resumed = run(runner, "train", "--resume", "--show")
    assert resumed.exit_code == 2 and "--show prints a recipe" in resumed.stderr


@pytest.fixture(scope="module")
def tiny_pendulum_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of sac_pendulum trained for 2 updates, with 10-step episodes."""
    run_dir = tmp_path_factory.mktemp("runs") / "pendulum"
    result = CliRunner(env={"COLUMNS": "200"}).invoke(
        app,
        ["train", "sac_pendulum", "--steps", "2", "--run-dir", str(run_dir), "--device", "cpu",
         "--set", "env.max_episode_steps=10", "--set", "memory.warmup_steps=10",
         "--set", "memory.batch_size=8", "--set", "sac.hidden_dims=[8]",
         "--set", "eval.episodes=1", "-q", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return run_dir


def test_eval_video_records_each_episode_to_an_mp4_beside_the_users_files(
    runner: CliRunner, in_tmp: Path, tiny_pendulum_run: Path
) -> None:
    import imageio.v2 as imageio

    (in_tmp / "videos").mkdir()
    (in_tmp / "videos" / "episode-000.mp4").write_bytes(b"the user's own video")
    result = run(runner, "eval", str(tiny_pendulum_run), "--episodes", "2", "--video", "videos",
                 "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["video_dir"] == "videos"
    assert report["videos"] == ["videos/episode-001.mp4", "videos/episode-002.mp4"]
    assert (in_tmp / "videos" / "episode-000.mp4").read_bytes() == b"the user's own video"
    assert sorted(p.name for p in (in_tmp / "videos").iterdir()) == [
        "episode-000.mp4", "episode-001.mp4", "episode-002.mp4"
    ]  # fmt: skip
    for path, length in zip(report["videos"], report["lengths"], strict=True):
        with imageio.get_reader(path) as reader:
            frames = [frame for frame in reader]
        assert len(frames) == length + 1  # the first observation, then one frame per step
        assert frames[0].ndim == 3 and frames[0].shape[2] == 3 and frames[0].std() > 0

    text = run(runner, "eval", str(tiny_pendulum_run), "--episodes", "1", "--video", "new/dir")
    assert text.exit_code == 0, text.output
    assert "videos: 1 MP4 file(s) in new/dir" in text.stdout
    assert [p.name for p in (in_tmp / "new" / "dir").iterdir()] == ["episode-000.mp4"]


def test_eval_video_without_the_extra_or_of_an_env_that_does_not_render_is_one_line(
    runner: CliRunner, in_tmp: Path, tiny_pendulum_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from emote_core import install_command

    cannot = run(runner, "eval", str(tiny_pendulum_run), "--env", "emote/HitTheMiddle-v0",
                 "--video", "v")  # fmt: skip
    assert cannot.exit_code == 1, cannot.output
    assert cannot.stderr.strip().splitlines() == [
        "error: env 'emote/HitTheMiddle-v0' renders [], not 'rgb_array' frames, so its episodes "
        "cannot be recorded as video; record an env that renders rgb_array"
    ]
    (in_tmp / "notes.txt").write_text("a user's file")
    a_file = run(runner, "eval", str(tiny_pendulum_run), "--video", "notes.txt")
    assert a_file.exit_code == 1, a_file.output
    assert a_file.stderr.strip().splitlines() == [
        "error: the video folder 'notes.txt' is a file; pass a folder (created when missing)"
    ]
    assert (in_tmp / "notes.txt").read_text() == "a user's file"
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)
    missing = run(runner, "eval", str(tiny_pendulum_run), "--video", "v", "--json")
    assert missing.exit_code == 1, missing.output
    line = (
        "recording video needs the optional dependency imageio-ffmpeg, which is not installed: "
        f"{install_command('video')}"
    )
    assert missing.stderr.strip().splitlines() == [f"error: {line}"]
    assert json.loads(missing.stdout) == {"error": line, "exit_code": 1}
    assert not (in_tmp / "v").exists()
