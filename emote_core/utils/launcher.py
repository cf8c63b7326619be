"""Data-parallel ranks on this machine, started by torch's elastic launcher inside this process.

:func:`launch_local_ranks` does what ``torchrun --standalone --nproc-per-node K -m MODULE ...``
does, but the launcher's own end is an exit status instead of an exception: a Ctrl-C that
reaches the launcher is passed on to the ranks (which stop and save), and the launch then
returns 130 where ``torchrun`` prints its traceback and exits 1.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from emote_core.utils.distributed import DistributedError

__all__ = ["LAUNCHER_LOGGERS", "launch_local_ranks"]

LAUNCHER_LOGGERS = ("torch.distributed.run", "torch.distributed.launcher",
                    "torch.distributed.elastic")  # fmt: skip
"""The loggers of torch's launcher, silenced by :func:`launch_local_ranks` unless asked not to."""

_HANDLED_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
"""The signals the launcher passes on to the ranks (pinned: the ranks stop gracefully on them)."""


def launch_local_ranks(
    module: str, arguments: Sequence[str], *, ranks: int, launcher_logs: bool = False
) -> int:
    """Run ``python -m module *arguments`` as ``ranks`` data-parallel processes on this machine
    (standalone rendezvous, no restarts) and wait for them.

    Args:
        module: The module each rank runs, e.g. ``"emote_cli"``.
        arguments: Its arguments, the same for every rank (each learns its rank from ``RANK``).
        ranks: How many processes to start (at least 1).
        launcher_logs: Let the launcher's own log lines through (else they are dropped).

    Returns:
        0 when every rank succeeded; ``128 + N`` when this process got signal ``N`` (130 for
        Ctrl-C), after the ranks were passed that signal and stopped; otherwise the exit status
        of the lowest rank that failed on its own, else ``128 + N`` for the lowest rank killed
        by signal ``N``.

    Raises:
        DistributedError: If ``ranks`` is below 1 or the ranks cannot rendezvous.
    """
    if ranks < 1:
        raise DistributedError(f"ranks={ranks}: a launch starts at least 1 rank — pass 1 or more")
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.run import get_args_parser, run

    launcher = [
        "--standalone", "--nnodes", "1", "--nproc-per-node", str(ranks), "--max-restarts", "0",
        "--signals-to-handle", _HANDLED_SIGNALS, "--module", module, *arguments,
    ]  # fmt: skip
    with contextlib.ExitStack() as logs:
        if not launcher_logs:
            logs.enter_context(_silenced(LAUNCHER_LOGGERS))
        try:
            run(get_args_parser().parse_args(launcher))
        except SignalException as stop:
            return 128 + int(stop.sigval)
        except ChildFailedError as failed:
            return _failed_status(failed.failures)
        except RendezvousError as error:
            raise DistributedError(
                f"the {ranks} ranks could not meet on this machine ({error}); check that "
                "localhost resolves and accepts TCP connections"
            ) from error
    return 0


def _failed_status(failures: Mapping[int, Any]) -> int:
    """The launch's exit status from its failed ranks (rank -> failure with ``exitcode``): the
    lowest rank that exited on its own (rank 0 reports for the run), else the lowest rank's
    signal as ``128 + N`` (ranks the launcher stopped after another failed end by its SIGTERM)."""
    exited = sorted(rank for rank, failure in failures.items() if failure.exitcode > 0)
    if exited:
        return int(failures[exited[0]].exitcode)
    return 128 - int(failures[min(failures)].exitcode)


@contextlib.contextmanager
def _silenced(names: Sequence[str]) -> Iterator[None]:
    """Drops every record of the loggers ``names`` and their children for the block (their
    levels are set per module by torch, so a level on a parent would not reach them)."""
    loggers = [logging.getLogger(name) for name in names]
    saved = [logger.propagate for logger in loggers]
    sink = logging.NullHandler()
    for logger in loggers:
        logger.addHandler(sink)  # a handler, so Python's last-resort handler does not print
        logger.propagate = False
    try:
        yield
    finally:
        for logger, propagate in zip(loggers, saved, strict=True):
            logger.removeHandler(sink)
            logger.propagate = propagate
