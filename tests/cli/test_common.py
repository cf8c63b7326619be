"""The shared CLI plumbing: error handling, exit codes, JSON output and logging."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner, Result

from emote_cli._common import (
    DebugOption,
    ExitCode,
    JsonOption,
    QuietOption,
    abort,
    emit_json,
    emit_json_line,
    handle_errors,
    setup_logging,
    stderr_console,
)
from emote_core.errors import ConfigurationError, EmoteError

# A throwaway app that uses the helpers the way real commands do.
demo = typer.Typer()


@demo.callback()
def _root() -> None:
    pass


def _raise(kind: str) -> None:
    if kind == "emote":
        raise ConfigurationError("rollout_length must be >= 1, got 0; pass --rollout-length 1")
    if kind == "oserror":
        raise FileNotFoundError(2, "No such file or directory", "missing.zarr")
    if kind == "interrupt":
        raise KeyboardInterrupt
    if kind == "bug":
        raise ZeroDivisionError("division by zero")
    if kind == "notes":
        error = EmoteError("store 'runs/a.zarr' is torn")
        error.add_note("while reading column 'rewards'")
        error.add_note("run `emote memory verify runs/a.zarr`")
        raise error
    if kind == "arguments":
        raise ConfigurationError(
            "run directory 'a' exists; pass `resume=True` to continue it, `force=True` to start "
            "over, or choose another `path`; it ran `live=False` on `device='cpu'`; "
            "`emote memory verify` names what is damaged"
        )
    if kind == "lost-worker":  # a library error's text quoted in the command's own message
        abort("worker 2 lost: shard 'w2' is held; write to another shard (`shard`)")
    if kind == "multiline":
        raise EmoteError("first line\n  second line\n")
    if kind == "empty":
        raise EmoteError()
    if kind == "abort":
        abort("mean return -120.5 is below --min-return -100", ExitCode.THRESHOLD_NOT_MET)
    if kind == "bad-parameter":
        raise typer.BadParameter("must be positive", param_hint="'--episodes'")
    if kind == "exit":
        raise typer.Exit(ExitCode.OK)
    if kind == "report-then-threshold":  # eval --min-return: the report, then exit 3
        emit_json({"mean_return": -120.5})
        abort("mean return -120.5 is below --min-return -100", ExitCode.THRESHOLD_NOT_MET)
    if kind == "report-then-interrupt":
        emit_json({"steps": 7})
        raise KeyboardInterrupt
    if kind == "list-then-bug":
        emit_json([1, 2])
        raise ZeroDivisionError("division by zero")
    if kind == "report-twice":
        emit_json({"first": 1})
        emit_json({"second": 2})


@demo.command()
def fail(kind: str, debug: DebugOption = False, json_output: JsonOption = False) -> None:
    with handle_errors(debug=debug, json_output=json_output):
        _raise(kind)


@demo.command()
def train(kind: str, json_output: JsonOption = False) -> None:
    """A command whose run directory (the library's ``path``) is its ``--run-dir``."""
    with handle_errors(json_output=json_output, flags={"path": "--run-dir"}):
        _raise(kind)


@demo.command()
def document(json_output: JsonOption = False) -> None:
    with handle_errors():
        emit_json(
            {
                "name": "Sörmland 🚀",
                "path": Path("runs") / "a.zarr",
                "returns": [1.5, float("nan"), float("inf")],
                "exit": ExitCode.THRESHOLD_NOT_MET,
                "shape": (3, 4),
                7: "int key",
            }
        )


@demo.command()
def stream(count: int = 3) -> None:
    with handle_errors():
        for step in range(count):
            emit_json_line({"step": step, "loss": 1.0 / (step + 1)})


@demo.command()
def log(
    json_output: JsonOption = False, quiet: QuietOption = False, debug: DebugOption = False
) -> None:
    setup_logging(quiet=quiet, debug=debug)
    with handle_errors(debug=debug, json_output=json_output):
        logger = logging.getLogger("emote_core.demo")
        logger.debug("debug detail")
        logger.info("collected 3 episodes")
        logger.warning("store is nearly full")
        emit_json({"ok": True})


def _stderr_lines(result: Result) -> list[str]:
    return result.stderr.splitlines()


def test_exit_codes_follow_the_cli_contract() -> None:
    assert [int(code) for code in ExitCode] == [0, 1, 2, 3, 130]
    assert ExitCode.THRESHOLD_NOT_MET == 3


def test_emote_error_is_one_stderr_line_and_exit_1(runner: CliRunner) -> None:
    result = runner.invoke(demo, ["fail", "emote"])
    assert result.exit_code == ExitCode.ERROR
    assert result.stdout == ""
    assert _stderr_lines(result) == [
        "error: rollout_length must be >= 1, got 0; pass --rollout-length 1"
    ]
    assert "Traceback" not in result.stderr


def test_the_arguments_an_error_names_are_printed_as_the_commands_flags(
    runner: CliRunner,
) -> None:
    """The library names arguments as in a call (`force=True`, `live=False`, `device='cpu'`);
    each command prints its own flags for them, on stderr and in the --json document, and leaves
    other backticked text as it is."""
    with pytest.raises(ConfigurationError, match="pass `resume=True` to continue it"):
        _raise("arguments")
    flags = (
        "run directory 'a' exists; pass --resume to continue it, --force to start over, or choose "
        "another {}; it ran --no-live on --device cpu; `emote memory verify` names what is "
        "damaged"
    )
    result = runner.invoke(demo, ["train", "arguments", "--json"])
    assert result.exit_code == ExitCode.ERROR
    assert _stderr_lines(result) == ["error: " + flags.format("--run-dir")]
    assert json.loads(result.stdout)["error"] == flags.format("--run-dir")
    other = runner.invoke(demo, ["fail", "arguments"])  # a command without --run-dir
    assert _stderr_lines(other) == ["error: " + flags.format("`path`")]


def test_library_text_in_an_abort_message_shows_flags(runner: CliRunner) -> None:
    result = runner.invoke(demo, ["fail", "lost-worker"])
    assert _stderr_lines(result) == [
        "error: worker 2 lost: shard 'w2' is held; write to another shard (--shard)"
    ]


def test_os_error_is_an_expected_error(runner: CliRunner) -> None:
    result = runner.invoke(demo, ["fail", "oserror"])
    assert result.exit_code == ExitCode.ERROR
    assert _stderr_lines(result) == ["error: [Errno 2] No such file or directory: 'missing.zarr'"]


def test_debug_shows_the_traceback_and_still_exits_1(runner: CliRunner) -> None:
    result = runner.invoke(demo, ["fail", "emote", "--debug"])
    assert result.exit_code == ExitCode.ERROR
    assert "Traceback (most recent call last)" in result.stderr
    assert "ConfigurationError" in result.stderr
    # The one-line summary still comes last, so `tail -1` of a log shows what went wrong.
    assert _stderr_lines(result)[-1].startswith("error: rollout_length must be >= 1")


def test_keyboard_interrupt_exits_130_with_one_line(runner: CliRunner) -> None:
    result = runner.invoke(demo, ["fail", "interrupt"])
    assert result.exit_code == ExitCode.INTERRUPTED == 130
    assert _stderr_lines(result) == ["error: interrupted"]


def test_unexpected_exception_is_an_internal_error_line(runner: CliRunner) -> None:
    result = runner.invoke(demo, ["fail", "bug"])
    assert result.exit_code == ExitCode.ERROR
    assert _stderr_lines(result) == [
        "error: internal error: ZeroDivisionError: division by zero "
        "(run with --debug for the traceback)"
    ]


def test_unexpected_exception_with_debug_has_traceback_and_no_hint(runner: CliRunner) -> None:
    result = runner.invoke(demo, ["fail", "bug", "--debug"])
    assert result.exit_code == ExitCode.ERROR
    assert "Traceback (most recent call last)" in result.stderr
    last = _stderr_lines(result)[-1]
    assert last == "error: internal error: ZeroDivisionError: division by zero"


def test_notes_follow_the_message_on_the_same_line(runner: CliRunner) -> None:
    result = runner.invoke(demo, ["fail", "notes"])
    assert result.exit_code == ExitCode.ERROR
    assert _stderr_lines(result) == [
        "error: store 'runs/a.zarr' is torn; while reading column 'rewards'; "
        "run `emote memory verify runs/a.zarr`"
    ]


def test_multiline_and_empty_messages_stay_one_line(runner: CliRunner) -> None:
    result = runner.invoke(demo, ["fail", "multiline"])
    assert _stderr_lines(result) == ["error: first line second line"]
    result = runner.invoke(demo, ["fail", "empty"])
    assert _stderr_lines(result) == ["error: EmoteError"]


def test_abort_prints_one_line_and_uses_the_given_code(runner: CliRunner) -> None:
    result = runner.invoke(demo, ["fail", "abort"])
    assert result.exit_code == ExitCode.THRESHOLD_NOT_MET
    assert _stderr_lines(result) == ["error: mean return -120.5 is below --min-return -100"]


def test_typer_usage_errors_and_exits_pass_through(runner: CliRunner) -> None:
    result = runner.invoke(demo, ["fail", "bad-parameter"])
    assert result.exit_code == ExitCode.USAGE
    assert "must be positive" in result.stderr
    assert "internal error" not in result.stderr

    result = runner.invoke(demo, ["fail", "exit"])
    assert result.exit_code == ExitCode.OK
    assert result.stderr == ""


def test_emit_json_writes_exactly_one_document(runner: CliRunner) -> None:
    result = runner.invoke(demo, ["document", "--json"])
    assert result.exit_code == ExitCode.OK
    document = json.loads(result.stdout)  # fails if there is anything besides one document
    assert document == {
        "name": "Sörmland 🚀",
        "path": str(Path("runs") / "a.zarr"),
        "returns": [1.5, None, None],
        "exit": 3,
        "shape": [3, 4],
        "7": "int key",
    }
    assert "Sörmland 🚀" in result.stdout  # written as is, not \u-escaped
    assert result.stdout.endswith("}\n")
    assert result.stderr == ""


def test_emit_json_rejects_values_json_cannot_hold(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(TypeError, match="cannot write a object as JSON"):
        emit_json({"bad": object()})
    assert capsys.readouterr().out == ""


def test_emit_json_converts_array_likes(capsys: pytest.CaptureFixture[str]) -> None:
    np = pytest.importorskip("numpy", reason="numpy is a dependency of emote")
    emit_json({"obs": np.array([[1.0, np.nan]], dtype=np.float32), "n": np.int64(4)})
    document = json.loads(capsys.readouterr().out)
    assert document == {"obs": [[1.0, None]], "n": 4}


def test_emit_json_line_writes_one_record_per_line(runner: CliRunner) -> None:
    result = runner.invoke(demo, ["stream", "--count", "3"])
    assert result.exit_code == ExitCode.OK
    lines = result.stdout.splitlines()
    assert len(lines) == 3
    records = [json.loads(line) for line in lines]
    assert [record["step"] for record in records] == [0, 1, 2]
    assert math.isclose(records[2]["loss"], 1 / 3)


def test_logs_go_to_stderr_and_quiet_silences_info(runner: CliRunner) -> None:
    result = runner.invoke(demo, ["log", "--json"])
    assert result.exit_code == ExitCode.OK
    assert json.loads(result.stdout) == {"ok": True}
    assert "info: collected 3 episodes" in result.stderr
    assert "warning: store is nearly full" in result.stderr
    assert "debug detail" not in result.stderr

    result = runner.invoke(demo, ["log", "--json", "--quiet"])
    assert json.loads(result.stdout) == {"ok": True}
    assert "collected 3 episodes" not in result.stderr
    assert "store is nearly full" in result.stderr

    result = runner.invoke(demo, ["log", "--json", "--debug"])
    assert json.loads(result.stdout) == {"ok": True}
    assert "debug detail" in result.stderr


def test_setup_logging_twice_does_not_duplicate_lines(runner: CliRunner) -> None:
    runner.invoke(demo, ["log"])
    result = runner.invoke(demo, ["log"])
    assert result.stderr.count("collected 3 episodes") == 1


def test_stderr_console_writes_to_stderr_and_quiet_writes_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    stderr_console().print("collecting episodes")
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "collecting episodes" in captured.err
    assert "\x1b[" not in captured.err  # plain text: stderr is not a terminal here

    stderr_console(quiet=True).print("collecting episodes")
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


@pytest.mark.parametrize(
    ("kind", "code"),
    [
        ("emote", ExitCode.ERROR),
        ("oserror", ExitCode.ERROR),
        ("interrupt", ExitCode.INTERRUPTED),
        ("bug", ExitCode.ERROR),
        ("notes", ExitCode.ERROR),
        ("abort", ExitCode.THRESHOLD_NOT_MET),
    ],
)
def test_under_json_every_failure_is_also_one_json_document(
    runner: CliRunner, kind: str, code: ExitCode
) -> None:
    result = runner.invoke(demo, ["fail", kind, "--json"])
    assert result.exit_code == code
    (line,) = _stderr_lines(result)
    # The document is the whole of stdout (json.loads refuses anything more) and says what the
    # stderr line says, so `| jq` never reads silence as success.
    assert json.loads(result.stdout) == {"error": line.removeprefix("error: "), "exit_code": code}


def test_without_json_a_failure_leaves_stdout_empty(runner: CliRunner) -> None:
    result = runner.invoke(demo, ["fail", "emote"])
    assert result.exit_code == ExitCode.ERROR
    assert result.stdout == ""


def test_a_report_before_a_failure_carries_the_error_in_the_one_document(
    runner: CliRunner,
) -> None:
    result = runner.invoke(demo, ["fail", "report-then-threshold", "--json"])
    assert result.exit_code == ExitCode.THRESHOLD_NOT_MET
    assert json.loads(result.stdout) == {
        "mean_return": -120.5,
        "error": "mean return -120.5 is below --min-return -100",
        "exit_code": 3,
    }

    result = runner.invoke(demo, ["fail", "report-then-interrupt", "--json"])
    assert result.exit_code == ExitCode.INTERRUPTED
    assert json.loads(result.stdout) == {"steps": 7, "error": "interrupted", "exit_code": 130}

    result = runner.invoke(demo, ["fail", "list-then-bug", "--json"])
    document = json.loads(result.stdout)
    assert document["result"] == [1, 2] and document["exit_code"] == 1
    assert document["error"].startswith("internal error: ZeroDivisionError: division by zero")


def test_a_command_that_emits_two_documents_is_a_bug_not_two_documents(
    runner: CliRunner,
) -> None:
    result = runner.invoke(demo, ["fail", "report-twice", "--json"])
    assert result.exit_code == ExitCode.ERROR
    document = json.loads(result.stdout)
    assert document["first"] == 1 and "second" not in document
    assert "exactly one JSON document" in document["error"]


def test_success_under_json_writes_the_document_when_the_command_ends(runner: CliRunner) -> None:
    result = runner.invoke(demo, ["fail", "exit", "--json"])
    assert result.exit_code == ExitCode.OK
    assert result.stdout == ""  # nothing was emitted, and nothing failed
    result = runner.invoke(demo, ["log", "--json"])
    assert json.loads(result.stdout) == {"ok": True}
