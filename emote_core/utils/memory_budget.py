"""What a new allocation may take, and the one refusal of what would not fit in it.

Sizes that a recipe sets (a table's ``maxlen``, networks' widths) are checked against the memory
of the device before anything is allocated: on the CPU, arrays are committed only as they are
written, so without a check a run too large for the machine fails, or is killed, long after it
started.
"""

from __future__ import annotations

from collections.abc import Callable

import psutil
import torch

from emote_core.errors import ConfigurationError

GIB = 1 << 30
"""Bytes in a GiB, the unit of the messages."""


def available_bytes(device: torch.device) -> int:
    """Memory a new allocation can take: the RAM available without swapping on the CPU, the
    free memory of the device on CUDA."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    return int(psutil.virtual_memory().available)


def check_memory_fits(
    needed: int,
    device: torch.device,
    *,
    what: str,
    fix: str | Callable[[int], str],
    detail: str = "",
) -> None:
    """Refuses, in one line, an allocation of ``needed`` bytes that ``device`` cannot hold.

    Args:
        needed: The estimated bytes.
        device: Where they would live.
        what: What needs them, as the message's subject (``"a memory table of maxlen 10"``).
        fix: What to change, or a function of the bytes available that says it.
        detail: How the estimate was reached, shown in brackets after it.

    Raises:
        ConfigurationError: ``"<what> needs about N GiB (<detail>), more than the M GiB of RAM
            available; <fix>"`` (MiB where both are under a GiB).
    """
    available = available_bytes(device)
    if needed <= available:
        return
    where = "RAM" if device.type == "cpu" else f"free memory on {device}"
    advice = fix(available) if callable(fix) else fix
    how = f" ({detail})" if detail else ""
    unit, name = (GIB, "GiB") if max(needed, available) >= GIB else (1 << 20, "MiB")
    raise ConfigurationError(
        f"{what} needs about {needed / unit:,.1f} {name}{how}, more than the "
        f"{available / unit:,.1f} {name} of {where} available; {advice}"
    )


__all__ = ["GIB", "available_bytes", "check_memory_fits"]
