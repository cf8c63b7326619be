"""`emote export onnx`, then `emote eval` and `emote collect` on the file, as a user runs them."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import onnx
import onnxruntime
import pytest
import torch
from typer.testing import CliRunner

import emote_core.assembly.builders
from emote_cli.app import app
from emote_core.onnx.graph import PolicyGraph


def run(runner: CliRunner, *args: str):
    return runner.invoke(app, list(args))


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny sac_hit_the_middle run (60 updates), checkpointed and exported every 30."""
    run_dir = tmp_path_factory.mktemp("runs") / "htm"
    result = CliRunner(env={"COLUMNS": "200"}).invoke(
        app,
        ["train", "sac_hit_the_middle", "--steps", "60", "--run-dir", str(run_dir),
         "--set", "training.export_interval=30", "--set", "training.checkpoint_interval=30",
         "--json", "-q"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return run_dir


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_export_writes_one_checked_file_with_its_metadata(
    runner: CliRunner, trained: Path, in_tmp: Path
) -> None:
    result = run(runner, "export", "onnx", str(trained), "--out", "policy.onnx", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["out"] == "policy.onnx" and summary["opset"] == 15
    assert summary["inputs"] == ["obs", "epsilon"] and summary["outputs"] == ["actions"]
    assert 0.0 <= summary["max_abs_diff"] < 1e-5
    assert summary["training_step"] == 60
    assert sorted(p.name for p in in_tmp.iterdir()) == ["policy.onnx"]  # no sidecar, no temp

    model = onnx.load("policy.onnx", load_external_data=False)
    onnx.checker.check_model(model, full_check=True)
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [15]
    session = onnxruntime.InferenceSession("policy.onnx")
    assert [(i.name, i.shape) for i in session.get_inputs()] == [
        ("obs", ["batch", 2]), ("epsilon", ["batch", 1])
    ]  # fmt: skip
    props = session.get_modelmeta().custom_metadata_map
    checkpoint = trained / "checkpoints" / "checkpoint_60.tar"
    assert props["source_checkpoint_sha256"] == hashlib.sha256(checkpoint.read_bytes()).hexdigest()
    assert props["recipe"] == "sac_hit_the_middle" and "[sac]" in props["recipe_toml"]
    assert props["training_step"] == "60" and props["opset"] == "15"
    assert props["emote_version"] and props["algorithm"] == "sac"
    assert json.loads(props["observation_space"])["spaces"]["obs"]["shape"] == [2]
    assert json.loads(props["action_space"])["shape"] == [1]
    bounds = json.loads(props["action_bounds"])
    assert bounds["low"] == [-1.0] and bounds["high"] == [1.0] and "rescale" in bounds
    assert json.loads(props["input_names"]) == ["obs", "epsilon"]
    assert json.loads(props["output_names"]) == ["actions"]


@pytest.mark.parametrize("opset", ["13", "18"])
def test_opset_is_chosen_and_checked(
    runner: CliRunner, trained: Path, in_tmp: Path, opset: str
) -> None:
    checkpoint = trained / "checkpoints" / "checkpoint_30.tar"
    result = run(runner, "export", "onnx", str(checkpoint), "--out", "p.onnx", "--opset", opset,
                 "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["training_step"] == 30
    model = onnx.load("p.onnx", load_external_data=False)
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [int(opset)]
    assert sorted(p.name for p in in_tmp.iterdir()) == ["p.onnx"]


def test_eval_of_the_export_matches_the_checkpoint_without_torch_models(
    runner: CliRunner, trained: Path, in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run(runner, "export", "onnx", str(trained), "--out", "policy.onnx").exit_code == 0
    args = ("--episodes", "4", "--seed", "11", "--json")
    from_checkpoint = run(runner, "eval", str(trained), *args)
    expected = json.loads(from_checkpoint.stdout)
    # Both judge by the recipe's [eval] min_return: the run's, and the copy inside the export.
    assert expected["threshold"] == -5.0 and "recipe.toml" in expected["threshold_from"]
    assert from_checkpoint.exit_code == (0 if expected["passed"] else 3), from_checkpoint.output
    written = (trained / "eval.json").read_text()

    def no_networks(*args, **kwargs):
        raise AssertionError("evaluating an .onnx file must not build torch networks")

    monkeypatch.setattr(emote_core.assembly.builders, "make_networks", no_networks)
    monkeypatch.setattr(torch.nn.Module, "__init__", no_networks)
    from_onnx = run(runner, "eval", "policy.onnx", *args)
    report = json.loads(from_onnx.stdout)
    assert report["threshold"] == -5.0 and "stored in 'policy.onnx'" in report["threshold_from"]
    assert from_onnx.exit_code == (0 if report["passed"] else 3), from_onnx.output
    assert report["mean_return"] == pytest.approx(expected["mean_return"], rel=1e-4)
    assert report["returns"] == pytest.approx(expected["returns"], rel=1e-4)
    assert report["episodes"] == 4 and report["lengths"] == expected["lengths"]
    assert report["policy"] == "policy.onnx"
    assert report["checkpoint"] == expected["checkpoint"]
    assert set(expected) <= set(report)
    assert sorted(p.name for p in in_tmp.iterdir()) == ["policy.onnx"]  # no eval.json here
    assert (trained / "eval.json").read_text() == written

    below = run(runner, "eval", "policy.onnx", "--episodes", "2", "--min-return", "1000")
    assert below.exit_code == 3 and "below --min-return" in below.stderr
    other = run(runner, "eval", "policy.onnx", "--episodes", "2", "--env", "Pendulum-v1")
    assert other.exit_code == 1 and "run it on the environment it was trained on" in other.stderr


def test_periodic_exports_during_training_evaluate_alone(
    runner: CliRunner, trained: Path, in_tmp: Path
) -> None:
    exports = sorted(p.name for p in (trained / "exports").iterdir())
    assert exports == ["policy_0.onnx", "policy_1.onnx"]
    steps = [
        onnxruntime.InferenceSession(str(trained / "exports" / name))
        .get_modelmeta()
        .custom_metadata_map["training_step"]
        for name in exports
    ]
    assert steps == ["30", "60"]
    shutil.copy(trained / "exports" / "policy_1.onnx", "latest.onnx")
    result = run(runner, "eval", "latest.onnx", "--recipe", "sac_hit_the_middle",
                 "--episodes", "2", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["episodes"] == 2


def test_collect_with_an_onnx_policy(runner: CliRunner, trained: Path, in_tmp: Path) -> None:
    assert run(runner, "export", "onnx", str(trained), "--out", "policy.onnx").exit_code == 0
    result = run(runner, "collect", "sac_hit_the_middle", "--out", "m.zarr", "--episodes", "3",
                 "--policy", "policy.onnx", "--json", "-q")  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["episodes"] >= 3 and summary["policy"] == "policy.onnx"
    inspected = json.loads(run(runner, "memory", "inspect", "m.zarr", "--json").stdout)
    assert inspected["episodes"] == summary["episodes"]
    wrong_env = run(runner, "collect", "sac_pendulum", "--out", "p.zarr", "--episodes", "1",
                    "--policy", "policy.onnx")  # fmt: skip
    assert wrong_env.exit_code == 1 and "trained on" in wrong_env.stderr


def test_a_parity_failure_exits_1_and_writes_nothing(
    runner: CliRunner, trained: Path, in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = PolicyGraph.run
    monkeypatch.setattr(
        PolicyGraph,
        "run",
        lambda self, inputs: {k: v + 0.1 for k, v in original(self, inputs).items()},
    )
    result = run(runner, "export", "onnx", str(trained), "--out", "policy.onnx")
    assert result.exit_code == 1
    assert "differs from the torch policy" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert list(in_tmp.iterdir()) == []


def test_bad_input_is_one_line_and_nothing_is_written(
    runner: CliRunner, trained: Path, in_tmp: Path
) -> None:
    empty_run = in_tmp / "empty_run"
    empty_run.mkdir()
    shutil.copy(trained / "recipe.toml", empty_run / "recipe.toml")
    no_policy = in_tmp / "no_policy" / "checkpoints"
    no_policy.mkdir(parents=True)
    shutil.copy(trained / "recipe.toml", no_policy.parent / "recipe.toml")
    data = torch.load(trained / "checkpoints" / "checkpoint_60.tar", weights_only=True)
    data["callbacks"].pop("policy")
    torch.save(data, no_policy / "checkpoint_5.tar")
    (in_tmp / "a_file").write_text("x")
    (in_tmp / "taken.onnx").write_bytes(b"keep")
    before = sorted(str(p) for p in in_tmp.rglob("*"))

    cases = [
        ((str(no_policy / "checkpoint_5.tar"), "--out", "p.onnx"), 1, "holds no 'policy' network"),
        ((str(empty_run), "--out", "p.onnx"), 1, "holds no checkpoints"),
        ((str(trained), "--out", "a_file/p.onnx"), 1, "is not an existing directory"),
        ((str(trained), "--out", "missing/p.onnx"), 1, "is not an existing directory"),
        ((str(trained), "--out", "taken.onnx"), 1, "already exists; pass --force"),
        ((str(trained), "--out", "p.onnx", "--opset", "8"), 2, "choose 9 to 23"),
        ((str(trained), "--out", "p.onnx", "--opset", "99"), 2, "choose 9 to 23"),
    ]
    for args, code, message in cases:
        result = run(runner, "export", "onnx", *args)
        assert result.exit_code == code, (args, result.output)
        assert message in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert sorted(str(p) for p in in_tmp.rglob("*")) == before
    assert (in_tmp / "taken.onnx").read_bytes() == b"keep"

    forced = run(runner, "export", "onnx", str(trained), "--out", "taken.onnx", "--force")
    assert forced.exit_code == 1 and "is not an ONNX model" in forced.stderr  # a user's file
    assert (in_tmp / "taken.onnx").read_bytes() == b"keep"
    (in_tmp / "taken.onnx").unlink()
    assert run(runner, "export", "onnx", str(trained), "--out", "taken.onnx").exit_code == 0
    forced = run(runner, "export", "onnx", str(trained), "--out", "taken.onnx", "--force")
    assert forced.exit_code == 0, forced.output  # an ONNX model is replaced
    assert onnx.load("taken.onnx").graph.output[0].name == "actions"
