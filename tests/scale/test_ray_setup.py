"""Reaching Ray without its raw output: what Ray prints on the driver's stdout becomes log lines."""

from __future__ import annotations

import contextlib
import io
import logging

from emote_core.scale.ray_setup import RayOutput


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_what_ray_prints_on_the_drivers_stdout_is_logged_a_line_at_a_time() -> None:
    """As Ray's error listener prints a raylet's report of a dead worker: coloured, in pieces."""
    logger = logging.getLogger("ray.driver_output")
    caught = Records()
    logger.addHandler(caught)  # the "ray" logger may not propagate to the root
    printed = io.StringIO()
    try:
        output = RayOutput()
        with contextlib.redirect_stdout(output), contextlib.closing(output):
            print("\x1b[33m(raylet)\x1b[0m A worker died or was killed while executing a task.")
            print("(raylet) Worker exit type: SYSTEM_ERROR", end="")
            print(" Worker PID: 3065", end="")
            print(file=printed)  # what is not stdout is left alone
    finally:
        logger.removeHandler(caught)
    assert [(r.levelno, r.getMessage()) for r in caught.records] == [
        (logging.WARNING, "(raylet) A worker died or was killed while executing a task."),
        (logging.WARNING, "(raylet) Worker exit type: SYSTEM_ERROR Worker PID: 3065"),
    ]
    assert printed.getvalue() == "\n"
