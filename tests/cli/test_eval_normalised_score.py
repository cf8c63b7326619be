"""``emote eval`` reports the normalised score (0 = random, 100 = expert) beside the raw return:
from --random-return/--expert-return, else from the reference returns of the stores the run
trained on; for a run, a checkpoint and an ONNX file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emote_cli._common import ExitCode
from emote_cli.app import app
from emote_core.stores.provenance import set_reference_returns
from tests.conftest import kept_logging

TINY = ("--device", "cpu", "--set", "memory.batch_size=32", "--set", "eval.episodes=1",
        "--set", "eval.interval=0", "--set", "bc.hidden_dims=[16]", "-q")  # fmt: skip
RANDOM, EXPERT = -1500.0, -150.0


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bc_pendulum run of 4 updates on two one-episode stores carrying the same references,
    and its ONNX export."""
    root = tmp_path_factory.mktemp("score")
    runner = CliRunner(env={"COLUMNS": "200"})
    with kept_logging():
        for name, seed in (("a.zarr", "1"), ("b.zarr", "2")):
            collected = runner.invoke(app, ["collect", "sac_pendulum", "--out",
                                            str(root / name), "--episodes", "1", "--seed", seed,
                                            "-q"])  # fmt: skip
            assert collected.exit_code == 0, collected.output
            set_reference_returns(root / name, random=RANDOM, expert=EXPERT, source="test")
        result = runner.invoke(app, ["train", "bc_pendulum", "--memory", str(root / "a.zarr"),
                                     "--memory", str(root / "b.zarr"), "--no-live", "--steps",
                                     "4", "--run-dir", str(root / "run"), *TINY])  # fmt: skip
        assert result.exit_code == 0, result.output
        exported = runner.invoke(app, ["export", "onnx", str(root / "run"), "--out",
                                       str(root / "bc.onnx"), "-q"])  # fmt: skip
        assert exported.exit_code == 0, exported.output
    return root


def evaluate(runner: CliRunner, *args: str) -> dict:
    result = runner.invoke(app, ["eval", *args, "--episodes", "1", "--json",
                                 "--device", "cpu"])  # fmt: skip
    assert result.exit_code == ExitCode.OK, result.output
    return json.loads(result.stdout)


def expected(mean_return: float, random: float = RANDOM, expert: float = EXPERT) -> float:
    return 100.0 * (mean_return - random) / (expert - random)


@pytest.mark.parametrize("target", ["run", "run/checkpoints/checkpoint_4.tar"])
def test_a_run_is_scored_by_the_reference_returns_of_its_stores(runner, trained, target):
    report = evaluate(runner, str(trained / target))
    assert report["normalised_score"] == pytest.approx(expected(report["mean_return"]))
    assert report["reference_returns"]["random"] == RANDOM
    assert report["reference_returns"]["expert"] == EXPERT
    kept = json.loads((trained / "run" / "eval.json").read_text())
    assert kept["normalised_score"] == report["normalised_score"]

    shown = runner.invoke(app, ["eval", str(trained / target), "--episodes", "1"])
    assert shown.exit_code == ExitCode.OK, shown.output
    score = expected(report["mean_return"])
    assert f"mean return {report['mean_return']:.2f} ± 0.00, normalised score {score:.1f}" in (
        shown.stdout
    )


def test_the_flags_score_an_onnx_file_and_take_precedence_over_the_stores(runner, trained):
    onnx = evaluate(runner, str(trained / "bc.onnx"))
    assert onnx["normalised_score"] is None and onnx["reference_returns"] is None
    flagged = evaluate(runner, str(trained / "bc.onnx"), "--random-return", "-1000",
                       "--expert-return", "0")  # fmt: skip
    assert flagged["normalised_score"] == pytest.approx(expected(flagged["mean_return"], -1000, 0))
    assert flagged["reference_returns"]["from"] == "--random-return/--expert-return"
    run = evaluate(runner, str(trained / "run"), "--random-return", "-1000", "--expert-return", "0")
    assert run["normalised_score"] == pytest.approx(expected(run["mean_return"], -1000, 0))
    # the stores' references are for the env they were made on, not for one --env names
    assert (
        evaluate(runner, str(trained / "run"), "--env", "Pendulum-v1")["normalised_score"] is None
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--random-return", "-1000"), "--random-return scales the normalised score with "
                                        "--expert-return; pass both, or neither"),
        (("--expert-return", "0"), "--expert-return scales the normalised score with "
                                   "--random-return; pass both, or neither"),
        (("--random-return", "5", "--expert-return", "5"), "are both 5.0"),
        (("--random-return", "nan", "--expert-return", "5"), "--random-return must be a finite"),
    ],
)  # fmt: skip
def test_flags_that_cannot_scale_a_score_are_a_usage_error(runner, trained, flags, message):
    result = runner.invoke(app, ["eval", str(trained / "bc.onnx"), *flags])
    assert result.exit_code == ExitCode.USAGE, result.output
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_stores_that_disagree_give_no_score_and_say_so_in_one_line(runner, tmp_path, trained):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    for name in ("recipe.toml", "run.json"):
        (run / name).write_bytes((trained / "run" / name).read_bytes())
    checkpoint = trained / "run" / "checkpoints" / "checkpoint_4.tar"
    (run / "checkpoints" / checkpoint.name).write_bytes(checkpoint.read_bytes())
    record = json.loads((run / "run.json").read_text())
    stores = []
    for name in ("a.zarr", "b.zarr"):  # copies, so the module's stores keep their references
        copy = tmp_path / name
        shutil.copytree(trained / name, copy)
        stores.append(str(copy))
    record["starts"][0]["memory"] = stores
    (run / "run.json").write_text(json.dumps(record))
    set_reference_returns(stores[1], random=-1200.0, expert=-100.0, source="other")

    result = runner.invoke(app, ["eval", str(run), "--episodes", "1", "--json"])
    assert result.exit_code == ExitCode.OK, result.output
    assert json.loads(result.stdout)["normalised_score"] is None
    warnings = [line for line in result.stderr.splitlines() if "normalised score" in line]
    assert len(warnings) == 1, result.stderr
    assert "record different reference returns" in warnings[0]
    assert "random -1500, expert -150" in warnings[0] and "random -1200, expert -100" in warnings[0]

    shutil.rmtree(stores[1])  # a store gone since training: no score, one line why
    result = runner.invoke(app, ["eval", str(run), "--episodes", "1", "--json"])
    assert result.exit_code == ExitCode.OK, result.output
    assert json.loads(result.stdout)["normalised_score"] is None
    assert f"the run's store '{stores[1]}' cannot be read" in result.stderr


def test_training_logs_the_normalised_score_of_its_evaluations(trained):
    from tensorboard.backend.event_processing import event_accumulator as ea

    history = json.loads((trained / "run" / "eval.json").read_text())["history"]
    final = next(entry for entry in history if entry["source"] == "training")
    assert final["normalised_score"] == pytest.approx(expected(final["mean_return"]))
    events = ea.EventAccumulator(str(trained / "run" / "tensorboard"))
    events.Reload()
    logged = events.Scalars("eval_bp_step/normalised_score")
    assert [(e.step, e.value) for e in logged] == [(4, pytest.approx(final["normalised_score"]))]


def test_a_run_trained_on_relative_store_paths_is_scored_from_another_directory(
    runner, trained, tmp_path, monkeypatch
):
    monkeypatch.chdir(trained)
    result = runner.invoke(app, ["train", "bc_pendulum", "--memory", "a.zarr", "--no-live",
                                 "--steps", "2", "--run-dir", "relative", *TINY])  # fmt: skip
    assert result.exit_code == 0, result.output
    monkeypatch.chdir(tmp_path)
    report = evaluate(runner, str(trained / "relative"))
    assert report["normalised_score"] == pytest.approx(expected(report["mean_return"]))
