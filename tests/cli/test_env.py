"""``emote env``: the environment report, human and JSON."""

from __future__ import annotations

import json
import sys

import numpy
import onnxruntime
import pytest
import torch
from typer.testing import CliRunner

import emote_core
from emote_cli import env as env_command
from emote_cli._common import ExitCode
from emote_cli.app import app


def _env_json(runner: CliRunner, *args: str) -> dict:
    result = runner.invoke(app, ["env", "--json", *args])
    assert result.exit_code == ExitCode.OK, result.stderr
    return json.loads(result.stdout)


def test_json_report_matches_the_running_environment(runner: CliRunner) -> None:
    report = _env_json(runner)
    assert report["emote"] == emote_core.__version__
    assert report["python"]["executable"] == sys.executable
    assert report["python"]["version"] == ".".join(map(str, sys.version_info[:3]))

    torch_report = report["torch"]
    assert torch_report["version"] == torch.__version__
    assert torch_report["cuda_available"] == torch.cuda.is_available()
    assert torch_report["cuda_version"] == torch.version.cuda
    assert torch_report["device_count"] == torch.cuda.device_count()
    assert torch_report["mps_available"] == torch.backends.mps.is_available()
    assert torch_report["error"] is None

    packages = report["packages"]
    for name in ("numpy", "gymnasium", "typer", "rich", "zarr", "onnx", "onnxruntime"):
        assert name in packages
    assert packages["tensorboard"] is not None
    assert packages["numpy"] == numpy.__version__
    assert packages["onnxruntime"] == onnxruntime.__version__
    assert report["onnxruntime_providers"] == onnxruntime.get_available_providers()
    assert "CPUExecutionProvider" in report["onnxruntime_providers"]
    assert {"sac", "dqn"} <= set(report["plugins"]["algorithms"])
    assert report["plugins"]["error"] is None


def test_quiet_and_debug_keep_stdout_one_document(runner: CliRunner) -> None:
    report = _env_json(runner, "--quiet", "--debug")
    assert report["torch"]["version"] == torch.__version__


def test_human_output_is_a_table_naming_torch(runner: CliRunner) -> None:
    result = runner.invoke(app, ["env"])
    assert result.exit_code == ExitCode.OK, result.stderr
    assert "torch" in result.stdout
    assert torch.__version__ in result.stdout
    assert "CUDA available" in result.stdout
    names = "bc, cql, dqn, genrl_sac, genrl_vae, iql, sac"  # every registered family, sorted
    assert "algorithms" in result.stdout and names in result.stdout
    assert "onnxruntime providers" in result.stdout
    with pytest.raises(json.JSONDecodeError):
        json.loads(result.stdout)


def test_missing_package_is_null_not_a_crash(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(
        env_command._PACKAGES,
        "not-a-real-package",
        ("emote_no_such_module", ("emote-no-such-distribution",)),
    )
    report = _env_json(runner)
    assert report["packages"]["not-a-real-package"] is None

    result = runner.invoke(app, ["env"])
    assert result.exit_code == ExitCode.OK
    assert "not installed" in result.stdout


def test_unimportable_torch_and_onnxruntime_are_reported(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A None entry in sys.modules makes `import torch` raise, as a broken install would.
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    report = _env_json(runner)
    assert report["torch"]["version"] is None
    assert report["torch"]["cuda_available"] is False
    assert report["torch"]["error"].startswith("ModuleNotFoundError")
    assert report["onnxruntime_providers"] is None

    result = runner.invoke(app, ["env"])
    assert result.exit_code == ExitCode.OK
    assert "torch error" in result.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_devices_are_listed(runner: CliRunner) -> None:
    report = _env_json(runner)
    devices = report["torch"]["devices"]
    assert len(devices) == torch.cuda.device_count() >= 1
    for index, device in enumerate(devices):
        assert device["index"] == index
        assert device["name"] == torch.cuda.get_device_name(index)
        assert device["memory_gib"] > 0
    assert report["torch"]["cudnn"] == torch.backends.cudnn.version()

    result = runner.invoke(app, ["env"])
    assert devices[0]["name"] in result.stdout


OPTIONAL = ["ray", "minari", "wandb", "s3fs", "zarrs", "mujoco", "skrl", "pettingzoo"]


def _installed_version(name: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def test_optional_packages_are_listed_with_their_versions_without_importing_them(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in OPTIONAL:  # importing any of them now fails: versions must come from metadata
        monkeypatch.setitem(sys.modules, name, None)
    expected = {name: _installed_version(name) for name in OPTIONAL}
    assert any(expected.values())  # the dev extra installs most of them
    optional = _env_json(runner)["optional_packages"]
    assert {name: optional[name] for name in OPTIONAL} == expected

    result = runner.invoke(app, ["env"])
    assert result.exit_code == ExitCode.OK, result.stderr
    for name, version in expected.items():
        row = next(line for line in result.stdout.splitlines() if f" {name} (optional) " in line)
        assert (version or "not installed") in row
