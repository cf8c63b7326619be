"""Choosing the torch device explicitly: ``auto``, ``cpu`` or ``cuda[:n]``."""

from __future__ import annotations

import torch

from emote_core.errors import ConfigurationError, UsageError


def resolve_device(choice: str) -> torch.device:
    """The device named ``choice``: ``auto`` picks CUDA when torch sees it, else the CPU.

    Raises:
        UsageError: For a name that is not a device, or a device emote does not run on.
        ConfigurationError: For ``cuda`` without CUDA, or a CUDA index that is not visible.
    """
    text = choice.strip().lower()
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except RuntimeError as error:
        raise UsageError(
            f"`device={choice!r}`: '{choice}' is not a device; use auto, cpu or cuda[:index]"
        ) from error
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigurationError(
                "`device='cuda'` was asked for, but torch sees no CUDA device (torch "
                f"{torch.__version__}); use `device='cpu'` or auto"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigurationError(
                f"`device={choice!r}`: only {torch.cuda.device_count()} CUDA devices are visible"
            )
    elif device.type != "cpu":
        raise UsageError(
            f"`device={choice!r}`: emote runs on cpu or cuda; use auto, cpu or cuda[:index]"
        )
    return device


__all__ = ["resolve_device"]
