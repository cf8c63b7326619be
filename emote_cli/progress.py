"""Progress of long commands on stderr: a live Rich display on a terminal, plain lines otherwise.

``train``, ``collect``, ``eval`` and ``memory convert`` show done / total, rates, an ETA and a
few metrics through one :class:`ProgressDisplay`: two live lines on a terminal, a plain
``key=value`` line every ``plain_interval`` seconds (at most :data:`LINE_WIDTH` characters) on a
file or pipe, nothing with ``--quiet``. Rich and emote_core are imported when a display starts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from emote_cli._text import printable

if TYPE_CHECKING:
    from rich.console import Console

    from emote_core.callbacks.progress import ProgressSnapshot

__all__ = [
    "LINE_WIDTH",
    "PLAIN_INTERVAL_S",
    "ProgressDisplay",
    "episode_progress",
    "fit_line",
    "format_duration",
    "training_sink",
]

LINE_WIDTH = 120
"""The widest plain progress line, in characters."""
PLAIN_INTERVAL_S = 10.0
"""Seconds between two plain progress lines (the first and the last are always written)."""
_LIVE_INTERVAL_S = 0.1  # a live line is redrawn ten times a second; faster updates are skipped
_DETAILS_SEPARATOR = "  "  # between the parts of a live line

Metrics = Mapping[str, float | int | None]


def format_duration(seconds: float | None) -> str:
    """``m:ss`` or ``h:mm:ss``; ``?`` when unknown."""
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "?"
    whole = max(round(seconds), 0)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _number(value: float | int) -> str:
    if isinstance(value, int) or abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"


def _rate(value: float) -> str:
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def fit_line(tokens: list[str], width: int = LINE_WIDTH) -> str:
    """Joins ``tokens`` with spaces up to the first that would make the line wider than ``width``.

    Tokens come most important first, so what is cut is always the tail; a first token wider
    than ``width`` is cut to it.
    """
    if not tokens:
        return ""
    line = tokens[0][:width]
    for token in tokens[1:]:
        if len(line) + 1 + len(token) > width:
            break
        line = f"{line} {token}"
    return line


class ProgressDisplay:
    """The progress of one command; use it as a context manager around the work.

    On a terminal the display is two lines: the spinner, title, bar, count, elapsed time, ETA and
    rates, then the metrics, each cut to the terminal's width. Print anything else on stderr
    through :attr:`console` (or logging) while it shows, so it lands above the display.

    Args:
        title: The command, first on every line (``train``, ``collect``).
        unit: What is counted, singular (``update``, ``env step``, ``episode``).
        quiet: The value of ``--quiet``: show nothing.
        console: The stderr console (:func:`emote_cli._common.stderr_console` by default).
        plain_interval: Seconds between plain lines when stderr is not a terminal.
    """

    def __init__(
        self,
        title: str,
        unit: str,
        *,
        quiet: bool = False,
        console: Console | None = None,
        plain_interval: float = PLAIN_INTERVAL_S,
    ) -> None:
        from emote_cli._common import stderr_console

        self.title = title
        self.unit = unit
        self.quiet = quiet
        self.plain_interval = plain_interval
        self.console = console if console is not None else stderr_console(quiet)
        """Where the display and the command's other stderr lines go."""
        self._progress: Any = None
        self._task: Any = None
        self._meter: Any = None
        self._last_shown: float | None = None
        self._entered = False

    @property
    def live(self) -> bool:
        """Whether a live Rich display is showing (stderr is a terminal and not ``--quiet``)."""
        return self._progress is not None

    def __enter__(self) -> Self:
        self._entered = True
        return self

    def _start(self) -> None:
        """Starts the live display at the first thing to show (a usage error shows none)."""
        if self._entered and self._progress is None and self.console.is_terminal:
            self._progress = _two_line_progress(self.console)
            self._progress.start()
            self._task = self._progress.add_task(self.title, total=None, details="")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stops the live display, leaving its last state on screen; nothing is shown after."""
        self._entered = False
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def status(self, text: str) -> None:
        """Shows on a terminal what the command is doing before counting starts (``loading``).

        The live display starts here, so a command shows life from its first moment. Plain
        output has no status line: a log read later gains nothing from it, and a command that
        fails at once still writes only its ``error: ...`` line.
        """
        if self.quiet:
            return
        self._start()
        if self._progress is not None:
            description = printable(f"{self.title}: {text}")  # a path or a name from a file
            self._progress.update(self._task, description=description, refresh=True)

    def update(
        self,
        done: int,
        total: int | None = None,
        *,
        rates: Metrics | None = None,
        eta: float | None = None,
        metrics: Metrics | None = None,
        note: str | None = None,
        force: bool = False,
    ) -> None:
        """Shows that ``done`` of ``total`` are done.

        Calls closer together than a redraw (on a terminal) or than ``plain_interval`` (plain
        lines) are skipped, except the first and a forced one. Without ``rates`` the display
        measures the rate of ``done`` itself (``<unit>s/s``) and derives the ETA from it.

        Args:
            done: How many are done.
            total: How many there will be, if known.
            rates: Named rates per second, shown in order (``{"updates/s": 41.3}``).
            eta: Seconds left, when the caller knows better than the display.
            metrics: Named values, most important first; ``None`` values are left out.
            note: A word on the phase (``starting``), shown after the count.
            force: Show this update even if the last one was a moment ago (the first and the
                last of a command).
        """
        if self.quiet:
            return
        self._start()
        now = time.monotonic()
        interval = _LIVE_INTERVAL_S if self.live else self.plain_interval
        if not (force or self._last_shown is None or now - self._last_shown >= interval):
            return
        self._last_shown = now
        if rates is None:
            rate = self._measure(done)
            rates = {f"{self.unit}s/s": rate}
            if eta is None and total is not None and rate:
                eta = max(total - done, 0) / rate
        if self._progress is None:
            self._print(
                self.plain_line(done, total, rates=rates, eta=eta, metrics=metrics, note=note)
            )
            return
        details = [note] if note else []
        if eta is not None:
            details.append(f"eta {format_duration(eta)}")
        details += [f"{_rate(v)} {k}" for k, v in rates.items() if v is not None]
        shown = [f"{k} {_number(v)}" for k, v in (metrics or {}).items() if v is not None]
        self._progress.metrics_line = printable(_DETAILS_SEPARATOR.join(shown))
        self._progress.update(
            self._task,
            description=self.title,
            completed=done,
            total=total,
            details=printable(_DETAILS_SEPARATOR.join(details)),
        )

    def plain_line(
        self,
        done: int,
        total: int | None,
        *,
        rates: Metrics,
        eta: float | None,
        metrics: Metrics | None,
        note: str | None = None,
    ) -> str:
        """The ``key=value`` line that :meth:`update` writes when stderr is not a terminal."""
        unit = self.unit.replace(" ", "_")
        count = f"{unit}={done}/{total}" if total is not None else f"{unit}={done}"
        if total:
            count += f" ({min(done / total, 1.0):.0%})"
        tokens = [self.title, count]
        if note:
            tokens.append(note)
        if eta is not None:
            tokens.append(f"eta={format_duration(eta)}")
        tokens += [f"{_key(k)}={_rate(v)}" for k, v in rates.items() if v is not None]
        tokens += [f"{_key(k)}={_number(v)}" for k, v in (metrics or {}).items() if v is not None]
        return fit_line(tokens)

    def _measure(self, done: int) -> float | None:
        if self._meter is None:
            from emote_core.callbacks.progress import ThroughputMeter

            self._meter = ThroughputMeter()
        return self._meter.add(done)

    def _print(self, line: str) -> None:
        self.console.print(printable(line), markup=False, highlight=False, soft_wrap=True)


def _key(name: str) -> str:
    return name.replace(" ", "_")


def _two_line_progress(console: Console) -> Any:
    """A Rich ``Progress`` that shows its task, then a line of metrics, both cut to the width."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.table import Column
    from rich.text import Text

    class TwoLineProgress(Progress):
        metrics_line = ""

        def get_renderables(self) -> Iterator[Any]:
            yield self.make_tasks_table(self.tasks)
            if self.metrics_line:
                yield Text(f"  {self.metrics_line}", no_wrap=True, overflow="ellipsis")

    return TwoLineProgress(
        SpinnerColumn(),
        TextColumn("{task.description}", markup=False),
        BarColumn(bar_width=24),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn(
            "{task.fields[details]}",
            markup=False,
            table_column=Column(no_wrap=True, overflow="ellipsis", ratio=1),
        ),
        console=console,
        expand=True,
        # Logs on stderr print above the display; stdout is left alone (it may be --json).
        redirect_stdout=False,
    )


def training_sink(display: ProgressDisplay) -> Callable[[ProgressSnapshot], None]:
    """A :class:`~emote_core.callbacks.progress.ProgressReporter` sink that shows snapshots."""

    def show(snapshot: ProgressSnapshot) -> None:
        rates: dict[str, float | None] = {"updates/s": snapshot.updates_per_second}
        metrics: dict[str, float | int | None] = {}
        if snapshot.env_steps is not None:
            metrics["env steps"] = snapshot.env_steps
            rates["env steps/s"] = snapshot.env_steps_per_second
        metrics["return"] = snapshot.episode_return
        metrics.update(snapshot.losses)
        starting = snapshot.phase.value == "starting"
        display.update(
            snapshot.bp_step,
            snapshot.total,
            rates=rates,
            eta=snapshot.eta_seconds,
            metrics=metrics,
            note="starting" if starting else None,
            force=starting or snapshot.phase.value == "finished",
        )

    return show


def episode_progress(display: ProgressDisplay, total: int) -> Callable[[list[float]], None]:
    """A callback for episode returns so far that shows them as done / total and mean return."""

    def show(returns: list[float]) -> None:
        mean = sum(returns) / len(returns) if returns else None
        display.update(
            len(returns), total, metrics={"mean return": mean}, force=len(returns) >= total
        )

    return show
