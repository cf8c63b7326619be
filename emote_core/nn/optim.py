"""ModifiedAdamW: AdamW that decays the weights of chosen layer types only.

The rule (upstream emote's, in :func:`separate_modules_for_weight_decay`): a parameter is decayed
when its name ends in ``weight`` and the module that owns it is of a whitelisted type, unless it
is a bias, the weight of a blacklisted type, or inside a layer named in ``layers_to_exclude``.
Where upstream left every other parameter out of the optimiser (so it was never trained), emote
trains it without decay, and says so in a warning when the lists were given explicitly.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable

import torch
from torch import nn

from emote_core.errors import ConfigurationError

log = logging.getLogger(__name__)

DEFAULT_DECAYED_MODULES: tuple[type[nn.Module], ...] = (nn.Linear, nn.modules.conv._ConvNd)
"""emote's whitelist: linear layers and convolutions (upstream's default is linear layers only)."""
DEFAULT_UNDECAYED_MODULES: tuple[type[nn.Module], ...] = (nn.LayerNorm,)
"""The blacklist, as upstream's default."""

_DECAY, _NO_DECAY, _NEITHER = "decay", "no_decay", "neither"


def _module_types(label: str, types: Iterable[type[nn.Module]]) -> tuple[type[nn.Module], ...]:
    types = tuple(types)
    bad = [t for t in types if not (isinstance(t, type) and issubclass(t, nn.Module))]
    if bad:
        raise ConfigurationError(
            f"{label} must be torch.nn.Module classes such as torch.nn.Linear; got {bad!r}"
        )
    return types


def _classified(
    network: nn.Module,
    whitelist: tuple[type[nn.Module], ...],
    blacklist: tuple[type[nn.Module], ...],
    layers_to_exclude: Collection[str],
) -> list[tuple[str, torch.Tensor, str]]:
    """``(full name, parameter, verdict)`` for each parameter of ``network``, judged by the
    module that owns it."""
    both = sorted(t.__name__ for t in set(whitelist) & set(blacklist))
    if both:
        raise ConfigurationError(
            f"module types {both} are both in whitelist_weight_modules and "
            "blacklist_weight_modules; a type may be in one list only"
        )
    module_names = {name for name, _ in network.named_modules()}
    unknown = sorted(set(layers_to_exclude) - module_names)
    if unknown:
        raise ConfigurationError(
            f"layers_to_exclude names {unknown}, which the network does not have; its layers "
            f"are {sorted(n for n in module_names if n)}"
        )
    verdicts = []
    for module_name, module in network.named_modules():
        excluded = any(
            module_name == layer or module_name.startswith(f"{layer}.")
            for layer in layers_to_exclude
        )
        for name, parameter in module.named_parameters(recurse=False):
            full = f"{module_name}.{name}" if module_name else name
            blacklisted = name.endswith("weight") and isinstance(module, blacklist)
            if excluded or name.endswith("bias") or blacklisted:
                verdict = _NO_DECAY
            elif name.endswith("weight") and isinstance(module, whitelist):
                verdict = _DECAY
            else:
                verdict = _NEITHER
            verdicts.append((full, parameter, verdict))
    return verdicts


def separate_modules_for_weight_decay(
    network: nn.Module,
    whitelist_weight_modules: Iterable[type[nn.Module]],
    blacklist_weight_modules: Iterable[type[nn.Module]],
    layers_to_exclude: Collection[str] | None = None,
) -> tuple[set[str], set[str]]:
    """The names of ``network``'s parameters that get weight decay, and of those that do not.

    Upstream emote's rule, judged by the module that owns each parameter: biases, weights of
    ``blacklist_weight_modules`` types and every parameter inside a layer named in
    ``layers_to_exclude`` are not decayed; other weights (names ending in ``weight``) of
    ``whitelist_weight_modules`` types are. Parameters matching none of these (the weight of a
    type in neither list, a parameter registered on a container) are in neither set.

    Args:
        network: The network; names are its ``named_parameters()`` names.
        whitelist_weight_modules: Module types whose weights are decayed.
        blacklist_weight_modules: Module types whose weights are not.
        layers_to_exclude: Names of layers (``named_modules()`` names, say the Q network's last
            layer) none of whose parameters are decayed.

    Returns:
        ``(decayed, not_decayed)`` parameter names.

    Raises:
        ConfigurationError: If a type is in both lists, or an excluded layer does not exist.
    """
    verdicts = _classified(
        network,
        _module_types("whitelist_weight_modules", whitelist_weight_modules),
        _module_types("blacklist_weight_modules", blacklist_weight_modules),
        set(layers_to_exclude or ()),
    )
    decayed = {name for name, _, verdict in verdicts if verdict == _DECAY}
    not_decayed = {name for name, _, verdict in verdicts if verdict == _NO_DECAY}
    return decayed, not_decayed


def split_decay_parameters(
    params_or_module: nn.Module | Iterable[nn.Module | torch.Tensor],
    *,
    whitelist_weight_modules: Iterable[type[nn.Module]] = DEFAULT_DECAYED_MODULES,
    blacklist_weight_modules: Iterable[type[nn.Module]] = DEFAULT_UNDECAYED_MODULES,
    layers_to_exclude: Collection[str] | None = None,
    warn_untrained_upstream: bool = False,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Splits parameters into those :class:`ModifiedAdamW` decays and those it does not.

    Modules are judged by :func:`separate_modules_for_weight_decay`; everything it does not decay
    is in the second list, as are tensors passed on their own (such as SAC's ``ln_alpha``). A
    parameter reachable several times (an encoder shared by two networks) is listed once; one
    that is some layer's decayed weight is decayed even if also passed on its own.

    Args:
        params_or_module: A module, or an iterable of modules and tensors.
        whitelist_weight_modules: Module types whose weights are decayed.
        blacklist_weight_modules: Module types whose weights are not.
        layers_to_exclude: Layer names (of a single module) whose parameters are not decayed.
        warn_untrained_upstream: Warn about parameters in neither list, which upstream emote's
            ModifiedAdamW left out of the optimiser.

    Returns:
        ``(decayed, not_decayed)``, each in the order first met.

    Raises:
        ConfigurationError: If an entry is neither a module nor a tensor, a tensor does not
            require gradients, or ``layers_to_exclude`` is given for several entries.
    """
    whitelist = _module_types("whitelist_weight_modules", whitelist_weight_modules)
    blacklist = _module_types("blacklist_weight_modules", blacklist_weight_modules)
    is_module = isinstance(params_or_module, nn.Module)
    entries = [params_or_module] if is_module else list(params_or_module)
    if layers_to_exclude and not is_module:
        raise ConfigurationError(
            "layers_to_exclude names layers of one network; pass that network as a single "
            "module, not a list of modules and tensors"
        )
    decayed: dict[int, torch.Tensor] = {}
    candidates: dict[int, torch.Tensor] = {}
    outside_both_lists: list[str] = []
    for entry in entries:
        if isinstance(entry, nn.Module):
            for name, parameter, verdict in _classified(
                entry, whitelist, blacklist, set(layers_to_exclude or ())
            ):
                if verdict == _DECAY:
                    decayed.setdefault(id(parameter), parameter)
                    continue
                candidates.setdefault(id(parameter), parameter)
                if verdict == _NEITHER:
                    outside_both_lists.append(name)
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
    if warn_untrained_upstream and outside_both_lists:
        log.warning(
            "ModifiedAdamW: parameters %s are in neither whitelist_weight_modules nor "
            "blacklist_weight_modules; upstream emote left such parameters out of the optimiser "
            "(never trained), emote trains them without weight decay",
            outside_both_lists,
        )
    not_decayed = [p for key, p in candidates.items() if key not in decayed]
    return list(decayed.values()), not_decayed


class ModifiedAdamW(torch.optim.AdamW):
    """AdamW whose weight decay applies only to the weights of chosen layer types.

    Parameter group 0 holds the decayed parameters, group 1 the rest (weight decay 0); both
    exist even when empty. The first five arguments are upstream emote's, in its order.

    Args:
        params_or_module: A module (upstream's ``network``), or an iterable of modules and
            tensors.
        lr: The learning rate.
        weight_decay: The decoupled weight decay of group 0.
        whitelist_weight_modules: Module types whose weights are decayed; left out, linear
            layers and convolutions (upstream: linear layers only).
        blacklist_weight_modules: Module types whose weights are not decayed; left out,
            ``LayerNorm``.
        layers_to_exclude: Names of layers none of whose parameters are decayed.
        betas: Adam's moment coefficients.
        eps: Adam's denominator epsilon.
        **kwargs: Further :class:`torch.optim.AdamW` options (``amsgrad``, ``foreach``, ...).

    Raises:
        ConfigurationError: If there is nothing to optimise, ``lr``/``weight_decay`` is
            negative, or the lists or excluded layers are malformed.
    """

    def __init__(
        self,
        params_or_module: nn.Module | Iterable[nn.Module | torch.Tensor],
        lr: float = 1e-3,
        weight_decay: float = 1e-2,
        whitelist_weight_modules: Iterable[type[nn.Module]] | None = None,
        blacklist_weight_modules: Iterable[type[nn.Module]] | None = None,
        layers_to_exclude: Collection[str] | None = None,
        *,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        **kwargs: object,
    ) -> None:
        if lr < 0 or weight_decay < 0:
            raise ConfigurationError(
                f"ModifiedAdamW needs lr >= 0 and weight_decay >= 0; got lr={lr}, "
                f"weight_decay={weight_decay}"
            )
        explicit_lists = whitelist_weight_modules is not None or (
            blacklist_weight_modules is not None
        )
        decayed, not_decayed = split_decay_parameters(
            params_or_module,
            whitelist_weight_modules=(
                DEFAULT_DECAYED_MODULES
                if whitelist_weight_modules is None
                else whitelist_weight_modules
            ),
            blacklist_weight_modules=(
                DEFAULT_UNDECAYED_MODULES
                if blacklist_weight_modules is None
                else blacklist_weight_modules
            ),
            layers_to_exclude=layers_to_exclude,
            warn_untrained_upstream=explicit_lists,
        )
        if not decayed and not not_decayed:
            raise ConfigurationError("ModifiedAdamW got no parameters to optimise")
        groups = [
            {"params": decayed, "weight_decay": weight_decay},
            {"params": not_decayed, "weight_decay": 0.0},
        ]
        super().__init__(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **kwargs)


__all__ = [
    "DEFAULT_DECAYED_MODULES",
    "DEFAULT_UNDECAYED_MODULES",
    "ModifiedAdamW",
    "separate_modules_for_weight_decay",
    "split_decay_parameters",
]
