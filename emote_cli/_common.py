"""Plumbing shared by every ``emote`` command: exit codes, standard options, errors, output.

A command body looks like this::

    def command(json_output: JsonOption = False, quiet: QuietOption = False,
                debug: DebugOption = False) -> None:
        setup_logging(quiet=quiet, debug=debug)
        with handle_errors(debug=debug):
            result = do_the_work()
            if json_output:
                emit_json(result)
            else:
                stdout_console().print(...)

Only the standard library and Typer are imported here at module level (Rich and emote_core are
imported when first needed) so that ``emote --help`` stays fast.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from enum import Enum, IntEnum
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from emote_cli._warnings import route_warnings

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "DebugOption",
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
        "`emote memory verify` names what is damaged).",
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
    sys.stderr.write(f"{_ERROR_PREFIX}{_one_line(message)}\n")
    sys.stderr.flush()


def abort(message: str, code: ExitCode | int = ExitCode.ERROR) -> NoReturn:
    """Print ``error: <message>`` as one line on stderr and exit with ``code``.

    Args:
        message: What went wrong: the rule, the value received and the fix.
        code: The exit status; :attr:`ExitCode.ERROR` unless a more specific one applies.

    Raises:
        typer.Exit: Always, carrying ``code``.
    """
    _write_error_line(message)
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
def handle_errors(*, debug: bool = False) -> Iterator[None]:
    """Run a command body so that every failure ends as one stderr line and an exit code.

    - :class:`~emote_core.errors.UsageError` (a recipe name, ``--set`` or ``--device`` that the
      command line got wrong): ``error: <message>``, exit 2.
    - :class:`~emote_core.errors.EmoteError` and :class:`OSError`: ``error: <message>``, exit 1.
    - :class:`KeyboardInterrupt`: ``error: interrupted``, exit 130.
    - Any other exception: ``error: internal error: <Type>: <message> (run with --debug for the
      traceback)``, exit 1.
    - A closed stdout pipe (``emote env --json | head -c1``): silent, exit 1.

    PEP 678 notes of the exception follow its message, separated by ``"; "``. With ``debug``
    the full traceback is printed to stderr before the one-line message. ``typer.Exit``,
    ``typer.Abort`` and usage errors pass through untouched.

    Args:
        debug: Print the traceback of any error (the value of ``--debug``).

    Yields:
        Nothing; the body runs inside the ``with`` block.

    Raises:
        typer.Exit: With the exit code that matches the failure.
    """
    # Imported here, not at module level, so that `emote --help` never imports emote_core.
    from emote_core.errors import EmoteError, UsageError

    try:
        yield
    except _TYPER_CONTROL_FLOW:
        raise
    except KeyboardInterrupt as exc:
        if debug:
            _print_traceback(exc)
        _write_error_line("interrupted")
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
    except BrokenPipeError:
        _silence_broken_stdout()
        raise typer.Exit(int(ExitCode.ERROR)) from None
    except UsageError as exc:
        if debug:
            _print_traceback(exc)
        _write_error_line(describe_exception(exc))
        raise typer.Exit(int(ExitCode.USAGE)) from None
    except (EmoteError, OSError) as exc:
        if debug:
            _print_traceback(exc)
        _write_error_line(describe_exception(exc))
        raise typer.Exit(int(ExitCode.ERROR)) from None
    except Exception as exc:  # anything else is a bug; still one line unless --debug
        if debug:
            _print_traceback(exc)
            hint = ""
        else:
            hint = " (run with --debug for the traceback)"
        _write_error_line(
            f"internal error: {_qualified_type_name(exc)}: {describe_exception(exc)}{hint}"
        )
        raise typer.Exit(int(ExitCode.ERROR)) from None


def _to_json_compatible(value: Any) -> Any:
    """Convert ``value`` into plain JSON types.

    Mappings become objects with string keys, sequences and sets become arrays, enums their
    value, paths strings, array-likes (numpy arrays and scalars, torch tensors) their ``tolist()``,
    and non-finite floats ``null`` (JSON has no NaN or infinity).
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Enum):
        return _to_json_compatible(value.value)
    if isinstance(value, Mapping):
        return {_json_key(key): _to_json_compatible(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_to_json_compatible(item) for item in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return _to_json_compatible(tolist())
    raise TypeError(f"cannot write a {type(value).__name__} as JSON: {value!r}")


def _json_key(key: Any) -> str:
    """An object key as ``json`` writes it (``null``, ``true``, ``1``); enums and paths too."""
    if isinstance(key, Enum):
        key = key.value
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, bool):
        return json.dumps(key)
    if isinstance(key, os.PathLike):
        return os.fspath(key)
    return str(key)


def emit_json(document: Any) -> None:
    """Write ``document`` to stdout as exactly one JSON document followed by a newline.

    The document is indented for people; non-ASCII text is written as is. Non-finite floats
    become ``null``.

    Args:
        document: A JSON-compatible value (see :func:`_to_json_compatible` for what is converted).

    Raises:
        TypeError: If a value cannot be represented in JSON.
    """
    text = json.dumps(_to_json_compatible(document), ensure_ascii=False, indent=2, allow_nan=False)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def emit_json_line(record: Any) -> None:
    """Write ``record`` to stdout as one compact JSON Lines record and flush it.

    Long commands stream progress this way under ``--json``; each call is one line.

    Args:
        record: A JSON-compatible value.

    Raises:
        TypeError: If a value cannot be represented in JSON.
    """
    text = json.dumps(
        _to_json_compatible(record),
        ensure_ascii=False,
        separators=(",", ":"),
        allow_nan=False,
    )
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


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
        line = f"{record.levelname.lower()}: {record.getMessage()}"
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
