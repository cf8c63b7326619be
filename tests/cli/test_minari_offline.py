"""A Minari dataset converted into a store trains an offline family the way an emote store does,
and its reference scores (``ref_min_score``/``ref_max_score``) become the store's reference
returns, which ``emote memory inspect`` shows and ``emote eval`` scores the run by."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emote_cli._common import ExitCode
from emote_cli.app import app

pytest.importorskip("minari", reason="Minari comes with the dev and minari extras")
DATA = Path(__file__).parents[1] / "integrations" / "minari" / "data"


def test_a_converted_minari_dataset_trains_bc_and_is_scored_by_its_reference_scores(
    runner: CliRunner, in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = in_tmp / "datasets"
    shutil.copytree(DATA / "pendulum", root / "pendulum")  # Pendulum-v1, 3 episodes, 43 steps
    metadata = root / "pendulum" / "random-v0" / "data" / "metadata.json"
    document = json.loads(metadata.read_text())
    document.update(ref_min_score=-1400.0, ref_max_score=-150.0, num_episodes_average_score=100)
    metadata.write_text(json.dumps(document))
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))

    converted = runner.invoke(app, ["memory", "convert", "pendulum/random-v0", "store.zarr"])
    assert converted.exit_code == ExitCode.OK, converted.output
    report = json.loads(runner.invoke(app, ["memory", "inspect", "store.zarr", "--json"]).stdout)
    assert (report["episodes"], report["transitions"]) == (3, 43)
    assert report["reference_returns"] == {
        "random": -1400.0, "expert": -150.0,
        "source": "ref_min_score and ref_max_score of Minari dataset 'pendulum/random-v0', "
        "means over 100 episodes",
    }  # fmt: skip

    trained = runner.invoke(app, ["train", "bc_pendulum", "--memory", "store.zarr", "--no-live",
                                  "--steps", "5", "--run-dir", "run", "--device", "cpu",
                                  "--set", "memory.batch_size=32", "--set", "bc.hidden_dims=[16]",
                                  "--set", "eval.episodes=1", "-q"])  # fmt: skip
    assert trained.exit_code == ExitCode.OK, trained.output
    assert (in_tmp / "run" / "checkpoints" / "checkpoint_5.tar").is_file()
    evaluated = json.loads(runner.invoke(app, ["eval", "run", "--episodes", "1", "--json"]).stdout)
    expected = 100 * (evaluated["mean_return"] + 1400.0) / (-150.0 + 1400.0)
    assert evaluated["normalised_score"] == pytest.approx(expected)
