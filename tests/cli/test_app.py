"""The root ``emote`` app: version, help, usage errors, startup cost and the console script."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import emote_core
from emote_cli._common import ExitCode
from emote_cli.app import app

HEAVY_MODULES = ["torch", "numpy", "zarr", "gymnasium", "onnx", "onnxruntime", "tensorboard"]


def _emote_script() -> str:
    """The installed ``emote`` console script of the interpreter running the tests."""
    script = shutil.which("emote", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.fail("the `emote` console script is not installed; run `pip install -e .`")
    return script


def _heavy_modules_after(code: str) -> list[str]:
    probe = (
        f"{code}\n"
        "import json, sys\n"
        f"print(json.dumps([m for m in {HEAVY_MODULES!r} if m in sys.modules]), file=sys.stderr)\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stderr.strip().splitlines()[-1])


def test_version_prints_the_emote_version(runner: CliRunner) -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == ExitCode.OK
    assert result.stdout == f"emote {emote_core.__version__}\n"


def test_no_arguments_shows_help_listing_env(runner: CliRunner) -> None:
    result = runner.invoke(app, [])
    # The vendored click treats "no command" as a usage error (exit 2) but still shows the help.
    assert result.exit_code == ExitCode.USAGE
    assert "Usage: emote" in result.output
    assert "env" in result.output
    assert "Commands" in result.output


def test_help_lists_env_with_its_summary(runner: CliRunner) -> None:
    for flag in ("--help", "-h"):
        result = runner.invoke(app, [flag])
        assert result.exit_code == ExitCode.OK
        assert "env" in result.stdout
        assert "package versions" in result.stdout
        assert "--version" in result.stdout


def test_env_help_shows_the_standard_options(runner: CliRunner) -> None:
    result = runner.invoke(app, ["env", "--help"])
    assert result.exit_code == ExitCode.OK
    for option in ("--json", "--quiet", "-q", "--debug"):
        assert option in result.stdout


@pytest.mark.parametrize("command", ["train", "collect"])
def test_help_of_commands_that_take_a_recipe_lists_the_recipes_found(
    runner: CliRunner, command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from emote_core.recipes import available_recipes

    shipped = available_recipes()
    assert "sac_hit_the_middle" in shipped
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "my_own.toml").write_text('algorithm = "dqn"\n', encoding="utf-8")
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == ExitCode.OK
    text = " ".join(result.stdout.split())  # Rich may wrap the list
    assert f"Recipes (RECIPE by name): {', '.join(sorted([*shipped, 'my_own']))}." in text


def test_rendering_train_help_with_its_recipes_imports_no_heavy_library() -> None:
    code = (
        "import sys\n"
        "sys.argv = ['emote', 'train', '--help']\n"
        "from emote_cli.app import main\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as exit_:\n"
        "    assert exit_.code in (0, None), exit_.code\n"
    )
    assert _heavy_modules_after(code) == []


def test_unknown_command_is_a_usage_error(runner: CliRunner) -> None:
    result = runner.invoke(app, ["no-such-command"])
    assert result.exit_code == ExitCode.USAGE
    assert "No such command" in result.stderr
    assert result.stdout == ""


def test_unknown_option_is_a_usage_error(runner: CliRunner) -> None:
    result = runner.invoke(app, ["env", "--no-such-option"])
    assert result.exit_code == ExitCode.USAGE
    assert "No such option" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "--json", "--no-such-option"], "No such option: --no-such-option"),
        (["train", "--json"], "RECIPE is needed to start a run"),
        (["eval", "run", "--episodes", "0", "--json"], "Invalid value for '--episodes'"),
        (["memory", "inspect", "--json"], "Missing argument 'SOURCE'."),
        (["trian", "x", "--json"], "No such command 'trian'. Did you mean 'train'?"),
    ],
)
def test_a_usage_error_under_json_is_also_one_json_document(
    runner: CliRunner, args: list[str], message: str
) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == ExitCode.USAGE
    assert message in result.stderr  # Typer's own report stays on stderr
    document = json.loads(result.stdout)
    assert document["exit_code"] == ExitCode.USAGE and message in document["error"]
    assert "\n" not in document["error"]


def test_json_after_a_double_dash_is_an_argument_not_the_option(runner: CliRunner) -> None:
    result = runner.invoke(app, ["train", "--no-such-option", "--", "--json"])
    assert result.exit_code == ExitCode.USAGE
    assert result.stdout == ""


def test_the_console_script_writes_a_usage_error_as_json(tmp_path: Path) -> None:
    completed = subprocess.run(
        [_emote_script(), "collect", "sac_pendulum", "--json", "--envs", "zero"],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert completed.returncode == ExitCode.USAGE
    document = json.loads(completed.stdout)
    assert document["exit_code"] == ExitCode.USAGE and "'--envs'" in document["error"]


def test_importing_the_app_imports_no_heavy_library() -> None:
    assert _heavy_modules_after("import emote_cli.app") == []


def test_rendering_help_imports_no_heavy_library() -> None:
    code = (
        "import sys\n"
        "sys.argv = ['emote', '--help']\n"
        "from emote_cli.app import main\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as exit_:\n"
        "    assert exit_.code in (0, None), exit_.code\n"
    )
    assert _heavy_modules_after(code) == []


def test_console_script_env_json_pipes_into_json_tool() -> None:
    producer = subprocess.Popen(
        [_emote_script(), "env", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert producer.stdout is not None
    consumer = subprocess.run(
        [sys.executable, "-m", "json.tool"],
        stdin=producer.stdout,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    producer.stdout.close()
    _, producer_stderr = producer.communicate(timeout=120)
    assert producer.returncode == ExitCode.OK, producer_stderr
    assert consumer.returncode == 0, consumer.stderr
    assert json.loads(consumer.stdout)["emote"] == emote_core.__version__


def test_console_script_reports_version() -> None:
    completed = subprocess.run(
        [_emote_script(), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert completed.returncode == ExitCode.OK
    assert completed.stdout == f"emote {emote_core.__version__}\n"


def test_python_dash_m_emote_cli_runs_the_same_app() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "emote_cli", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == ExitCode.OK, completed.stderr
    assert "Usage: emote" in completed.stdout


def _all_commands(command, path=()):
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():  # groups (typer vendors click)
        yield from _all_commands(sub, (*path, name))


def test_help_texts_escape_brackets_that_rich_would_swallow_as_markup() -> None:
    """Rich reads an unescaped ``[eval]`` in a help text as a style tag and prints nothing: every
    bracketed word in a help text is escaped (``\\[eval]``) unless it is a style of Rich's."""
    import re

    import typer.main

    styles = {"bold", "dim", "italic", "red", "green", "yellow", "cyan", "magenta", "underline"}
    swallowed = []
    for path, command in _all_commands(typer.main.get_command(app)):
        texts = [command.help or ""] + [getattr(p, "help", None) or "" for p in command.params]
        for text in texts:
            for match in re.finditer(r"(?<!\\)\[/?([a-z_ .]+)\]", text):
                if match.group(1).strip("/") not in styles:
                    swallowed.append(f"emote {' '.join(path)}: {match.group(0)!r} in {text!r}")
    assert not swallowed, "\n".join(swallowed)


def test_train_help_shows_the_tables_resume_may_change() -> None:
    result = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == ExitCode.OK
    assert "[eval] and [logging]" in " ".join(result.stdout.replace("│", " ").split())


def _help_of_every_command() -> list[tuple[str, object, str]]:
    """``(command path, command, its --help output)`` for the root, every group and command."""
    import typer.main

    runner = CliRunner(env={"COLUMNS": "200"})
    helps = []
    for path, command in _all_commands(typer.main.get_command(app)):
        result = runner.invoke(app, [*path, "--help"])
        assert result.exit_code == ExitCode.OK, result.output
        helps.append((" ".join(("emote", *path)), command, result.stdout))
    return helps


def _option_row(help_text: str, option: str) -> str:
    """The text of an option's row in Rich's table (continuation lines joined)."""
    rows, current = [], None
    for line in help_text.splitlines():
        cells = line.strip("│ ").split()
        if line.startswith("│") and cells and cells[0].startswith("-"):
            current = [line]
            rows.append(current)
        elif current is not None and line.startswith("│"):
            current.append(line)
        else:
            current = None
    for row in rows:
        if row[0].strip("│ ").split()[0] == option:
            return " ".join(" ".join(part.strip("│ ").split()) for part in row)
    raise AssertionError(f"no row for {option} in:\n{help_text}")


def test_help_shows_no_python_type_placeholders_or_raw_backticks() -> None:
    import re

    found = []
    for name, _, text in _help_of_every_command():
        for wrong in ("<bool>", "<list[", "<int", "<float", "<path>", "<str>", "`"):
            if wrong in text:
                found.append(f"{name} --help shows {wrong!r}")
        usage = next(line for line in text.splitlines() if "Usage:" in line)
        for piece in usage.split("Usage:", 1)[1].split()[len(name.split()) :]:
            # one style for positional metavars: NAME, [NAME] when optional; never {name}
            if not re.fullmatch(r"\[?[A-Z][A-Z_]*\]?(\.\.\.)?", piece) and piece not in (
                "[OPTIONS]",
                "[ARGS]...",
            ):
                found.append(f"{name}: usage piece {piece!r} in {usage.strip()!r}")
    assert not found, "\n".join(found)


def test_every_option_with_a_default_shows_it() -> None:
    missing = []
    for name, command, text in _help_of_every_command():
        for param in command.params:
            if param.param_type_name != "option" or param.hidden or param.expose_value is False:
                continue
            if param.default is None or param.default is False or not param.opts:
                continue
            row = _option_row(text, param.opts[0])
            if "[default: " not in row:
                missing.append(f"{name} {param.opts[0]}: {row!r}")
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize(
    ("command", "option", "shown"),
    [
        ("collect", "--max-restarts", "[default: 3]"),
        ("collect", "--envs", "(default: the recipe's env.num_envs)"),
        ("collect", "--device", "[default: auto]"),
        ("train", "--device", "[default: auto]"),
        ("eval", "--device", "[default: auto]"),
    ],
)
def test_defaults_that_help_used_to_hide_or_disagree_on_are_shown(
    runner: CliRunner, command: str, option: str, shown: str
) -> None:
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == ExitCode.OK
    assert shown in _option_row(result.stdout, option)


def test_the_default_of_max_restarts_is_the_librarys() -> None:
    import inspect

    from emote_cli.collect import collect
    from emote_core.scale.collection import DEFAULT_MAX_RESTARTS

    assert inspect.signature(collect).parameters["max_restarts"].default == DEFAULT_MAX_RESTARTS
