"""Plumbing shared by every ``emote`` command: exit codes, standard options, errors, output.

A command calls :func:`setup_logging`, does its work inside :func:`handle_errors` and prints
with :func:`emit_json` or :func:`stdout_console`. Only the standard library and Typer are
imported at module level, so that ``emote --help`` stays fast.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from enum import IntEnum
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from emote_cli._json import emit_json, emit_json_line, held_json_document, record_error
from emote_cli._text import printable
from emote_cli._warnings import route_warnings

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "ARGUMENT_FLAGS",
    "AllowNonfiniteOption",
    "DebugOption",
    "DeviceOption",
    "EnvOption",
    "ExitCode",
    "JsonOption",
    "QuietOption",
    "SkipDamagedOption",
    "abort",
    "describe_exception",
    "emit_json",
    "emit_json_line",
    "handle_errors",
    "setup_logging",
    "stderr_console",
    "stdout_console",
]


class ExitCode(IntEnum):
    """Process exit status of every ``emote`` command (see DESIGN.md, "CLI contract")."""

    OK = 0
    """The command did what it was asked."""
    ERROR = 1
    """A clear error, reported as one ``error: ...`` line on stderr."""
    USAGE = 2
    """The command line itself is wrong: an unknown option or a bad value (Typer reports those),
    a recipe name that names no recipe, a bad ``--set``, an unknown ``--device``."""
    THRESHOLD_NOT_MET = 3
    """The command ran, but a requested threshold (``eval --min-return``) was not reached."""
    INTERRUPTED = 130
    """Interrupted by the user (Ctrl-C); state was saved where possible."""


SkipDamagedOption = Annotated[
    bool,
    typer.Option(
        "--skip-damaged",
        help="Use the intact episodes of a damaged store (it is refused otherwise; "
        "'emote memory verify' names what is damaged).",
    ),
]
AllowNonfiniteOption = Annotated[
    bool,
    typer.Option(
        "--allow-nonfinite",
        help="Keep NaN and infinite values in float columns (observations, actions, rewards); "
        "refused by default, as training on them turns losses into NaN.",
    ),
]
DeviceOption = Annotated[
    str,
    typer.Option(
        "--device",
        metavar="DEVICE",
        help="auto (CUDA when torch sees it, else the CPU), cpu or cuda[:n].",
    ),
]
"""``--device``: where networks run; every command defaults to ``auto``."""

EnvOption = Annotated[
    str | None,
    typer.Option(
        "--env",
        metavar="ENV",
        help="Run on another env than the recipe's: an entry point module:callable (the part "
        "after ':' a Python name: myenv:PointEnv) or a gymnasium id (Pendulum-v1, "
        "myenv:PointEnv-v0); the recipe's env.kwargs still apply. Modules are found on "
        "PYTHONPATH, in the recipe file's directory and in the current directory.",
        show_default=False,
    ),
]
JsonOption = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Write exactly one JSON document to stdout and nothing else; logs go to stderr.",
    ),
]
"""``--json``: machine-readable output on stdout."""

QuietOption = Annotated[
    bool,
    typer.Option(
        "--quiet", "-q", help="Silence logs and progress on stderr (errors are still shown)."
    ),
]
"""``--quiet/-q``: no informational logs or progress on stderr."""

DebugOption = Annotated[
    bool,
    typer.Option("--debug", help="Show the full traceback of an error and debug logs."),
]
"""``--debug``: tracebacks and debug logs."""

_ERROR_PREFIX = "error: "

ARGUMENT_FLAGS: dict[str, str] = {
    "address": "--ray-address",
    "allow_nonfinite": "--allow-nonfinite",
    "device": "--device",
    "env": "--env",
    "follow": "--follow",
    "format": "--from",
    "force": "--force",
    "live": "--live",
    "memory": "--memory",
    "opset": "--opset",
    "out": "--out",
    "overrides": "--set",
    "policy": "--policy",
    "profile": "--profile",
    "recipe": "--recipe",
    "resume": "--resume",
    "shard": "--shard",
    "skip_damaged": "--skip-damaged",
    "stores": "--memory",
    "target_format": "--to",
    "trust": "--trust-pickle",
    "trust_pickle": "--trust-pickle",
    "video_dir": "--video",
    "wait_for_policy": "--wait",  # written --no-wait for wait_for_policy=False
}
"""Each argument that library errors name (in backticks, as in a call; see
:mod:`emote_core.errors`) and the flag every command passes it from. A command whose flag for an
argument differs (``path`` is ``emote train``'s ``--run-dir``) adds it in :func:`handle_errors`."""

_ARGUMENT = re.compile(r"`([a-z_]+)(?:=([^`\n]+))?`")


def in_flags(message: str, flags: Mapping[str, str] = ARGUMENT_FLAGS) -> str:
    """``message`` with each argument it names that ``flags`` maps written as that flag:
    ```force=True``` as ``--force``, ```live=False``` as ``--no-live``, ```device='cpu'``` as
    ``--device cpu``, ```memory``` as ``--memory``. Other backticked text is left as it is."""

    def flag(found: re.Match[str]) -> str:
        name, value = found.groups()
        option = flags.get(name)
        if option is None:
            return found.group()
        if value is None or value == "True":
            return option
        if value == "False":
            return f"--no-{option.removeprefix('--')}"
        return f"{option} {value.strip(chr(39) + chr(34))}"

    return _ARGUMENT.sub(flag, message)


# Typer's own control flow: exit requests, aborts and usage errors (its vendored click exceptions
# derive from TyperException). They must pass through untouched so Typer maps them to exit codes.
_TYPER_CONTROL_FLOW: tuple[type[BaseException], ...] = (
    typer.Exit,
    typer.Abort,
    typer.TyperException,
)


def _one_line(text: str) -> str:
    """Join the non-blank lines of ``text`` with spaces so a message never spans lines."""
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def _write_error_line(message: str) -> None:
    """Write ``error: <message>`` on stderr; under ``--json`` the message is also the document's
    ``"error"``."""
    line = _one_line(message)
    record_error(line)
    sys.stderr.write(f"{_ERROR_PREFIX}{printable(line)}\n")
    sys.stderr.flush()


def abort(message: str, code: ExitCode | int = ExitCode.ERROR) -> NoReturn:
    """Print ``error: <message>`` as one line on stderr and exit with ``code``.

    Under ``handle_errors(json_output=True)`` the message is also written into the command's
    JSON document as ``"error"``, with ``code`` as ``"exit_code"``.

    Args:
        message: What went wrong: the rule, the value received and the fix. Arguments that
            library text in it names are shown as flags (:func:`in_flags`).
        code: The exit status; :attr:`ExitCode.ERROR` unless a more specific one applies.

    Raises:
        typer.Exit: Always, carrying ``code``.
    """
    _write_error_line(in_flags(message))
    raise typer.Exit(int(code))


def describe_exception(exception: BaseException) -> str:
    """Render an exception's message and its PEP 678 notes as one line.

    Args:
        exception: The exception to describe.

    Returns:
        The message (the exception's class name when the message is empty) followed by each note,
        separated by ``"; "``.
    """
    parts = [_one_line(str(exception)) or type(exception).__name__]
    notes = getattr(exception, "__notes__", None)
    if isinstance(notes, list | tuple):
        parts.extend(_one_line(str(note)) for note in notes if str(note).strip())
    return "; ".join(parts)


def _qualified_type_name(exception: BaseException) -> str:
    cls = type(exception)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def _print_traceback(exception: BaseException) -> None:
    traceback.print_exception(exception, file=sys.stderr)
    sys.stderr.flush()


def _silence_broken_stdout() -> None:
    """Point stdout at /dev/null after the reader of a pipe went away (``emote ... | head``).

    Without this the interpreter's final flush of stdout raises a second BrokenPipeError.
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout has no file descriptor (e.g. in CliRunner)
        pass


@contextmanager
def handle_errors(
    *, debug: bool = False, json_output: bool = False, flags: Mapping[str, str] | None = None
) -> Iterator[None]:
    """Run a command body so that every failure ends as one stderr line and an exit code.

    - :class:`~emote_core.errors.UsageError` (a recipe name, ``--set`` or ``--device`` that the
      command line got wrong): ``error: <message>``, exit 2.
    - :class:`~emote_core.errors.EmoteError` and :class:`OSError`: ``error: <message>``, exit 1.
      The arguments an emote error names are shown as the command's flags (:func:`in_flags`).
    - :class:`KeyboardInterrupt`: ``error: interrupted``, exit 130.
    - gymnasium's ``DependencyNotInstalled``, or an ``ImportError`` of an optional package:
      ``error: this command needs the optional dependency <package> ...: <pip command>``, exit 1.
    - Any other exception: ``error: internal error: <Type>: <message> (run with --debug for the
      traceback)``, exit 1.
    - A closed stdout pipe (``emote env --json | head -c1``): silent, exit 1.

    PEP 678 notes of the exception follow its message, separated by ``"; "``. With ``debug``
    the full traceback is printed to stderr before the one-line message. ``typer.Exit``,
    ``typer.Abort`` and usage errors pass through untouched.

    With ``json_output`` the body's :func:`emit_json` document is held and written when the
    body ends, so stdout holds exactly one JSON document however the command ends: as given on
    success; on a failure (any of the above, or :func:`abort` with a non-zero code) with
    ``"error"`` (the stderr line's message) and ``"exit_code"`` added, or as
    ``{"error": ..., "exit_code": ...}`` when the body had not emitted one yet. Usage errors
    are written by the root app (:mod:`emote_cli.app`) instead.

    Args:
        debug: Print the traceback of any error (the value of ``--debug``).
        json_output: The value of ``--json``.
        flags: The command's own flags for arguments, beside :data:`ARGUMENT_FLAGS`
            (``{"path": "--run-dir"}``).

    Yields:
        Nothing; the body runs inside the ``with`` block.

    Raises:
        typer.Exit: With the exit code that matches the failure.
    """
    with held_json_document(json_output) as held:
        try:
            with _one_line_errors(debug, {**ARGUMENT_FLAGS, **(flags or {})}):
                yield
        except (typer.Abort, typer.TyperException):
            raise  # Typer reports these itself (and the root app writes their JSON)
        except BrokenPipeError:
            _silence_broken_stdout()  # stdout is gone: no document can be written
            raise typer.Exit(int(ExitCode.ERROR)) from None
        except typer.Exit as stop:
            if held is not None and stop.exit_code is not None:
                _write_held(held, int(stop.exit_code))
            raise
        if held is not None:
            _write_held(held, int(ExitCode.OK))


def _write_held(held: Any, exit_code: int) -> None:
    try:
        held.write(exit_code)
    except BrokenPipeError:
        _silence_broken_stdout()
        raise typer.Exit(int(ExitCode.ERROR)) from None


@contextmanager
def _one_line_errors(debug: bool, flags: Mapping[str, str]) -> Iterator[None]:
    """Turns every exception of the body into ``error: ...`` on stderr and a ``typer.Exit``."""
    # Imported here, not at module level, so that `emote --help` never imports emote_core.
    from emote_core.errors import EmoteError, UsageError

    try:
        yield
    except (*_TYPER_CONTROL_FLOW, BrokenPipeError):
        raise
    except KeyboardInterrupt as exc:
        if debug:
            _print_traceback(exc)
        _write_error_line("interrupted")
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
    except UsageError as exc:
        if debug:
            _print_traceback(exc)
        _write_error_line(in_flags(describe_exception(exc), flags))
        raise typer.Exit(int(ExitCode.USAGE)) from None
    except (EmoteError, OSError) as exc:
        if debug:
            _print_traceback(exc)
        _write_error_line(in_flags(describe_exception(exc), flags))
        raise typer.Exit(int(ExitCode.ERROR)) from None
    except Exception as exc:  # anything else is a bug; still one line unless --debug
        if debug:
            _print_traceback(exc)
        from emote_core.utils.dependencies import missing_dependency

        missing = missing_dependency(exc, "this command")  # an optional package not installed
        if missing is not None:
            _write_error_line(str(missing))
            raise typer.Exit(int(ExitCode.ERROR)) from None
        hint = "" if debug else " (run with --debug for the traceback)"
        _write_error_line(
            f"internal error: {_qualified_type_name(exc)}: {describe_exception(exc)}{hint}"
        )
        raise typer.Exit(int(ExitCode.ERROR)) from None


def stderr_console(quiet: bool = False) -> Console:
    """A Rich console on stderr for logs, warnings and progress.

    Colour and live rendering are used only when stderr is a terminal; otherwise Rich writes
    plain text and long lines are not wrapped. With ``quiet`` the console prints nothing.

    Args:
        quiet: The value of ``--quiet``.

    Returns:
        The console.
    """
    from rich.console import Console

    console = Console(stderr=True, quiet=quiet)
    console.soft_wrap = not console.is_terminal
    return console


def stdout_console() -> Console:
    """A Rich console on stdout for human-readable results (never used under ``--json``).

    Returns:
        The console.
    """
    from rich.console import Console

    return Console()


_EMOTE_LOGGERS = ("emote_core", "emote_cli")


class _CurrentStderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that always writes to the current ``sys.stderr``.

    A plain ``StreamHandler(sys.stderr)`` keeps the stream of the moment it was made, which is
    wrong once something (pytest, Typer's CliRunner) has swapped ``sys.stderr``.
    """

    def __init__(self) -> None:
        super().__init__()

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        """Ignored: the stream is always the current ``sys.stderr``."""


class _LineFormatter(logging.Formatter):
    """``warning: message`` lines, in the style of the ``error: ...`` lines."""

    def __init__(self, debug: bool) -> None:
        fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s" if debug else None
        super().__init__(fmt)
        self._debug = debug

    def format(self, record: logging.LogRecord) -> str:
        if self._debug:
            return super().format(record)
        message = "\n".join(map(printable, record.getMessage().split("\n")))
        line = f"{record.levelname.lower()}: {message}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup_logging(quiet: bool = False, debug: bool = False) -> None:
    """Send Python logging to stderr for one command run.

    emote's own loggers (``emote_core.*``, ``emote_cli.*``) log at INFO, at WARNING with
    ``quiet`` and at DEBUG with ``debug`` (``quiet`` wins). Other libraries log at WARNING and
    above, and their Python warnings become one ``warning: ...`` line each (see
    :mod:`emote_cli._warnings`). Calling this again replaces the previous setup.

    Args:
        quiet: The value of ``--quiet``.
        debug: The value of ``--debug``.
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, _CurrentStderrHandler):
            root.removeHandler(handler)
    handler = _CurrentStderrHandler()
    handler.setFormatter(_LineFormatter(debug=debug and not quiet))
    root.addHandler(handler)
    root.setLevel(logging.WARNING)

    if quiet:
        level = logging.WARNING
    elif debug:
        level = logging.DEBUG
    else:
        level = logging.INFO
    for name in _EMOTE_LOGGERS:
        logging.getLogger(name).setLevel(level)
    route_warnings(debug=debug and not quiet)
