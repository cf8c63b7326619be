"""What the command line got wrong exits 2 (usage), like Typer's own usage errors: a recipe name
that names no recipe, a ``--set`` the recipe refuses, a ``--device`` that is not a device. What a
recipe file got wrong stays an error of its own (exit 1)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from emote_cli._common import ExitCode, handle_errors
from emote_cli.app import app
from emote_core.errors import ConfigurationError, UsageError


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _one_error_line(result, code: ExitCode) -> str:
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "internal error" not in lines[0]
    return lines[0]


TRAIN = ("train", "sac_hit_the_middle", "--steps", "2", "--run-dir", "r")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("train", "sac_hit_the_midle"), "did you mean sac_hit_the_middle"),
        (("train", "./nowhere.toml"), "no recipe file or recipe named './nowhere.toml'"),
        (("collect", "dqn_cartpol", "--out", "c.zarr", "--episodes", "1"), "did you mean"),
        (
            ("eval", "run", "--recipe", "sac_pendulm"),
            "no recipe file or recipe named 'sac_pendulm'",
        ),
        ((*TRAIN, "--set", "nope=1"), "--set nope=1: unknown key 'nope'"),
        ((*TRAIN, "--set", "sac.learning_rat=1e-3"), "did you mean 'sac.learning_rate'"),
        ((*TRAIN, "--set", "memory.maxlen=abc"), "'memory.maxlen' must be an integer; got 'abc'"),
        ((*TRAIN, "--set", "training.bp_steps=1e"), "--set training.bp_steps=1e:"),
        ((*TRAIN, "--set", "sac.learning_rate=nan"), "'sac.learning_rate' must be a number"),
        ((*TRAIN, "--set", "sac.learning_rate=-1"), "must be a finite number above 0"),
        ((*TRAIN, "--set", "training.bp_steps"), "--set takes KEY=VALUE"),
        ((*TRAIN, "--set", "seed.x=1"), "'seed' is a value, not a table"),
        ((*TRAIN, "--device", "tpu"), "--device tpu: 'tpu' is not a device"),
        ((*TRAIN, "--device", "meta"), "emote runs on cpu or cuda"),
        (
            ("collect", "dqn_cartpole", "--out", "c.zarr", "--episodes", "1", "--device", "gpu"),
            "'gpu' is not a device",
        ),
    ],
)
def test_what_the_command_line_got_wrong_exits_2_with_one_line(
    runner: CliRunner, in_tmp: Path, args: tuple[str, ...], message: str
) -> None:
    (in_tmp / "run" / "checkpoints").mkdir(
        parents=True
    )  # eval's target is a run; its --recipe is wrong
    line = _one_error_line(runner.invoke(app, list(args)), ExitCode.USAGE)
    assert message in line
    assert not (in_tmp / "r").exists() and not (in_tmp / "c.zarr").exists()


def test_the_override_that_breaks_a_recipe_is_the_one_named(
    runner: CliRunner, in_tmp: Path
) -> None:
    args = (*TRAIN, "--set", "memory.batch_size=8", "--set", "memory.batch_size=0")
    line = _one_error_line(runner.invoke(app, list(args)), ExitCode.USAGE)
    assert "--set memory.batch_size=0: 'memory.batch_size' must be at least 1" in line


def test_a_wrong_recipe_file_is_an_error_not_a_usage_error(runner: CliRunner, in_tmp: Path) -> None:
    (in_tmp / "bad.toml").write_text("[sac]\nlearning_rate = -3.0\n", encoding="utf-8")
    result = runner.invoke(app, ["train", "bad.toml", "--set", "training.bp_steps=2"])
    line = _one_error_line(result, ExitCode.ERROR)
    assert "bad.toml: 'sac.learning_rate' is a learning rate" in line
    # an override may repair what the file got wrong
    fixed = runner.invoke(app, ["train", "bad.toml", "--set", "sac.learning_rate=1e-3", "--steps",
                                "2", "--set", "memory.warmup_steps=16", "-q"])  # fmt: skip
    assert fixed.exit_code == ExitCode.OK, fixed.output


def test_handle_errors_maps_usage_errors_to_exit_2_and_other_configuration_errors_to_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import typer

    for error, code in ((UsageError("u"), ExitCode.USAGE), (ConfigurationError("c"), 1)):
        with pytest.raises(typer.Exit) as caught, handle_errors():
            raise error
        assert caught.value.exit_code == code
    assert capsys.readouterr().err == "error: u\nerror: c\n"


def test_a_memory_that_cannot_fit_in_ram_is_one_line_before_the_run_starts(
    runner: CliRunner, in_tmp: Path
) -> None:
    huge = "memory.maxlen=100_000_000_000_000"
    result = runner.invoke(app, [*TRAIN, "--set", huge])
    line = _one_error_line(result, ExitCode.ERROR)
    assert "a memory table of maxlen 100,000,000,000,000 needs about" in line
    assert "GiB of RAM available; lower maxlen (memory.maxlen in a recipe) to at most" in line
    assert not (in_tmp / "r").exists()


@pytest.mark.parametrize("content", [b"\x00\x01\x02binary", "π = 3\n".encode("utf-16")])
def test_a_binary_recipe_file_is_one_line_naming_it(
    runner: CliRunner, in_tmp: Path, content: bytes
) -> None:
    (in_tmp / "model.pt").write_bytes(content)
    line = _one_error_line(runner.invoke(app, ["train", "model.pt"]), ExitCode.ERROR)
    assert line.startswith("error: 'model.pt' is not a TOML recipe file")


@pytest.fixture
def without_mujoco(monkeypatch: pytest.MonkeyPatch) -> None:
    """MuJoCo as a machine without the mujoco extra has it: ``import mujoco`` fails, so gymnasium's
    MuJoCo envs raise its ``DependencyNotInstalled`` when they are made."""
    import sys

    monkeypatch.setitem(sys.modules, "mujoco", None)
    for name in [m for m in sys.modules if m.startswith("gymnasium.envs.mujoco")]:
        monkeypatch.delitem(sys.modules, name)  # imported again, without mujoco


@pytest.mark.parametrize(
    "args",
    [
        ("train", "sac_inverted_pendulum", "--steps", "2", "--run-dir", "r"),
        ("collect", "sac_inverted_pendulum", "--out", "c.zarr", "--episodes", "1"),
    ],
)
def test_a_recipe_whose_env_needs_a_missing_extra_is_one_line_naming_it(
    runner: CliRunner, in_tmp: Path, without_mujoco: None, args: tuple[str, ...]
) -> None:
    from emote_core import install_command

    line = _one_error_line(runner.invoke(app, list(args)), ExitCode.ERROR)
    assert line == (
        "error: env 'InvertedPendulum-v5' needs the optional dependency mujoco, which is not "
        f"installed: {install_command('mujoco')}"
    )
    assert "[mujoco]" in line
    assert not (in_tmp / "r").exists() and not (in_tmp / "c.zarr").exists()


def test_a_missing_optional_package_anywhere_is_one_line_not_an_internal_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import typer

    from emote_core import install_command

    with pytest.raises(typer.Exit) as caught, handle_errors():
        raise ModuleNotFoundError("No module named 'imageio_ffmpeg'", name="imageio_ffmpeg")
    assert caught.value.exit_code == ExitCode.ERROR
    assert capsys.readouterr().err == (
        "error: this command needs the optional dependency imageio-ffmpeg, which is not "
        f"installed: {install_command('video')}\n"
    )
