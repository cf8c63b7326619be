"""ModifiedAdamW: AdamW that decays only the weight matrices of linear and convolutional layers."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from emote_core.errors import ConfigurationError

_DECAYED_LAYERS = (nn.Linear, nn.modules.conv._ConvNd)


def split_decay_parameters(
    params_or_module: nn.Module | Iterable[nn.Module | torch.Tensor],
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Splits parameters into those :class:`ModifiedAdamW` decays and those it does not.

    The rule, exactly: a parameter is decayed if and only if it is the ``weight`` of an
    :class:`torch.nn.Linear` or of a convolution (``Conv1d/2d/3d`` and their transposes) found in
    a given module. Everything else is not decayed: biases, normalisation weights and biases,
    embeddings, parameters registered directly on a container module, and tensors passed on their
    own (such as SAC's ``ln_alpha``), whatever their shape. A parameter reachable several times
    (an encoder shared by two networks) is listed once; a parameter that is some layer's decayed
    weight is decayed even if also passed on its own.

    Args:
        params_or_module: A module, or an iterable of modules and tensors.

    Returns:
        ``(decayed, not_decayed)``, each in the order first met.

    Raises:
        ConfigurationError: If an entry is neither a module nor a tensor, or a tensor does not
            require gradients.
    """
    entries = [params_or_module] if isinstance(params_or_module, nn.Module) else params_or_module
    decayed: dict[int, torch.Tensor] = {}
    candidates: dict[int, torch.Tensor] = {}
    for entry in entries:
        if isinstance(entry, nn.Module):
            for module in entry.modules():
                for name, parameter in module.named_parameters(recurse=False):
                    if name == "weight" and isinstance(module, _DECAYED_LAYERS):
                        decayed.setdefault(id(parameter), parameter)
                    else:
                        candidates.setdefault(id(parameter), parameter)
        elif isinstance(entry, torch.Tensor):
            if not entry.requires_grad:
                raise ConfigurationError(
                    "ModifiedAdamW got a tensor that does not require gradients; pass trainable "
                    "parameters (torch.nn.Parameter or a leaf tensor with requires_grad=True)"
                )
            candidates.setdefault(id(entry), entry)
        else:
            raise ConfigurationError(
                f"ModifiedAdamW takes a module or an iterable of modules and tensors; got an "
                f"entry of type {type(entry).__name__}"
            )
    not_decayed = [p for key, p in candidates.items() if key not in decayed]
    return list(decayed.values()), not_decayed


class ModifiedAdamW(torch.optim.AdamW):
    """AdamW whose weight decay applies only to linear and convolutional weight matrices.

    Parameter group 0 holds the decayed parameters with ``weight_decay``, group 1 the rest with a
    weight decay of 0 (see :func:`split_decay_parameters` for the exact rule). Both groups exist
    even when one is empty, so checkpoints always have the same layout.

    Args:
        params_or_module: A module, or an iterable of modules and tensors.
        lr: The learning rate.
        weight_decay: The decoupled weight decay of group 0.
        betas: Adam's moment coefficients.
        eps: Adam's denominator epsilon.
        **kwargs: Further :class:`torch.optim.AdamW` options (``amsgrad``, ``foreach``, ...).

    Raises:
        ConfigurationError: If there is nothing to optimise, or ``lr``/``weight_decay`` is
            negative.
    """

    def __init__(
        self,
        params_or_module: nn.Module | Iterable[nn.Module | torch.Tensor],
        lr: float = 1e-3,
        weight_decay: float = 1e-2,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        **kwargs: object,
    ) -> None:
        if lr < 0 or weight_decay < 0:
            raise ConfigurationError(
                f"ModifiedAdamW needs lr >= 0 and weight_decay >= 0; got lr={lr}, "
                f"weight_decay={weight_decay}"
            )
        decayed, not_decayed = split_decay_parameters(params_or_module)
        if not decayed and not not_decayed:
            raise ConfigurationError("ModifiedAdamW got no parameters to optimise")
        groups = [
            {"params": decayed, "weight_decay": weight_decay},
            {"params": not_decayed, "weight_decay": 0.0},
        ]
        super().__init__(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **kwargs)


__all__ = ["ModifiedAdamW", "split_decay_parameters"]
