"""HL-Gauss classification critics (Imani & White 2018; Farebrother et al. 2024, "Stop Regressing").

The critic predicts a histogram over ``num_bins`` equal bins of ``[min_value, max_value]``; its
value is the histogram's mean. It learns by cross-entropy against ``N(q_target, sigma^2)``
integrated over each bin (:class:`HLGaussLoss`, ``sigma`` = ``smoothing_ratio`` bin widths);
targets outside the support are clipped to it. :class:`QNet` gives expected values for SAC's and
DQN's targets and agents; :class:`QLoss` is SAC's Q loss with the cross-entropy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from emote_core.algorithms.base import (
    TdErrorPublisher,
    importance_weighted_mean,
    key_list,
    window_starts,
)
from emote_core.callbacks.loss import LossCallback
from emote_core.errors import ConfigurationError
from emote_core.nn.inputs import flatten_observation
from emote_core.utils.checks import finite_number, int_at_least

DEFAULT_SMOOTHING_RATIO = 0.75
"""``sigma`` over the bin width that Farebrother et al. (2024) found robust."""


def check_support(owner: str, min_value: Any, max_value: Any, num_bins: Any) -> None:
    """Raises a clear error unless ``min_value < max_value`` (finite) and ``num_bins >= 2``."""
    finite_number(owner, "min_value", min_value)
    finite_number(owner, "max_value", max_value)
    if min_value >= max_value:
        raise ConfigurationError(
            f"{owner}: min_value must be below max_value; got min_value={min_value} and "
            f"max_value={max_value} — give the range the returns fall in"
        )
    int_at_least(owner, "num_bins", num_bins, 2)


def bin_edges(min_value: float, max_value: float, num_bins: int) -> Tensor:
    """The ``num_bins + 1`` edges of equal bins over ``[min_value, max_value]`` (float32)."""
    return torch.linspace(min_value, max_value, num_bins + 1, dtype=torch.float32)


class HLGaussLoss(nn.Module):
    """The HL-Gauss cross-entropy between logits and scalar targets.

    Args:
        min_value: The lowest value of the support.
        max_value: The highest value of the support.
        num_bins: The number of equal bins.
        sigma: The standard deviation of the Gaussian that spreads each target.

    Raises:
        ConfigurationError: If the support is empty, there are fewer than 2 bins, or ``sigma``
            is not a positive finite number.
    """

    def __init__(self, min_value: float, max_value: float, num_bins: int, sigma: float) -> None:
        super().__init__()
        check_support("HLGaussLoss", min_value, max_value, num_bins)
        if (
            isinstance(sigma, bool)
            or not isinstance(sigma, int | float)
            or not (math.isfinite(sigma) and sigma > 0)
        ):
            raise ConfigurationError(f"HLGaussLoss: sigma must be above 0; got {sigma!r}")
        self.min_value = float(min_value)
        self.max_value = float(max_value)
        self.num_bins = num_bins
        self.sigma = float(sigma)
        self.register_buffer("support", bin_edges(min_value, max_value, num_bins))

    def transform_to_probs(self, target: Tensor) -> Tensor:
        """Each target's histogram: ``(N,)`` or ``(N, 1)`` targets give ``(N, num_bins)``.

        Bin ``i`` gets ``Phi(e_{i+1}) - Phi(e_i)`` with ``Phi`` the CDF of
        ``N(target, sigma^2)`` and ``e`` the edges, divided by ``Phi(e_last) - Phi(e_0)`` so that
        each histogram sums to 1 over the support.
        """
        target = target.reshape(-1, 1)
        cdf = torch.special.erf((self.support - target) / (math.sqrt(2.0) * self.sigma))
        mass = cdf[:, 1:] - cdf[:, :-1]
        return mass / (cdf[:, -1:] - cdf[:, :1])

    def forward(self, logits: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
        """The cross-entropy of ``logits`` ``(N, num_bins)`` with the targets' histograms.

        Args:
            logits: Unnormalised log-probabilities of the bins.
            target: ``(N,)`` or ``(N, 1)`` targets, inside the support (clip them first).
            reduction: ``"mean"`` for one number, ``"none"`` for ``(N, 1)``.
        """
        if logits.shape[-1] != self.num_bins or logits.shape[0] != target.shape[0]:
            raise ConfigurationError(
                f"HLGaussLoss: logits of shape {tuple(logits.shape)} do not fit "
                f"{target.shape[0]} targets over {self.num_bins} bins"
            )
        losses = F.cross_entropy(logits, self.transform_to_probs(target), reduction="none")
        return losses.mean() if reduction == "mean" else losses.reshape(-1, 1)


@runtime_checkable
class LogitNet(Protocol):
    """A network whose last output dimension holds ``num_bins`` logits: ``(B, num_bins)`` for one
    value per input, ``(B, H, num_bins)`` for ``H`` values (one categorical head per action)."""

    num_bins: int

    def __call__(self, *args: Any, **kwargs: Any) -> Tensor: ...


class QNet(nn.Module):
    """A Q network from a :class:`LogitNet`: calling it gives the expected value over the bin
    centres, so targets, policies and agents use it as any Q network.

    Args:
        logit_net: The network of logits, with a ``num_bins`` attribute.
        min_value: The lowest value of the support.
        max_value: The highest value of the support.

    Raises:
        ConfigurationError: If ``logit_net`` has no integer ``num_bins`` of at least 2 or the
            support is empty.
    """

    def __init__(self, logit_net: nn.Module, min_value: float, max_value: float) -> None:
        super().__init__()
        num_bins = getattr(logit_net, "num_bins", None)
        check_support(f"QNet({type(logit_net).__name__})", min_value, max_value, num_bins)
        self.logit_net = logit_net
        self.min_value = float(min_value)
        self.max_value = float(max_value)
        self.num_bins = int(num_bins)  # type: ignore[arg-type]
        edges = bin_edges(min_value, max_value, self.num_bins)
        self.register_buffer("centers", (edges[:-1] + edges[1:]) / 2)

    @property
    def bin_width(self) -> float:
        """The width of one bin."""
        return (self.max_value - self.min_value) / self.num_bins

    def logits(self, *args: Any, **kwargs: Any) -> Tensor:
        """The logit network's output for these inputs."""
        return self.logit_net(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        """The expected values: ``(B, 1)`` or ``(B, H)`` (see :meth:`q_from_logit`)."""
        return self.q_from_logit(self.logit_net(*args, **kwargs))

    def q_from_logit(self, logits: Tensor) -> Tensor:
        """``sum_i softmax(logits)_i * centre_i`` over the last dimension; ``(B, num_bins)``
        logits give ``(B, 1)``, ``(B, H, num_bins)`` give ``(B, H)``."""
        values = (torch.softmax(logits, dim=-1) * self.centers).sum(dim=-1)
        return values.unsqueeze(-1) if values.dim() == 1 else values


def hl_gauss_loss_for(q: QNet, smoothing_ratio: float) -> HLGaussLoss:
    """The :class:`HLGaussLoss` over ``q``'s support, ``sigma = smoothing_ratio * bin width``."""
    if (
        isinstance(smoothing_ratio, bool)
        or not isinstance(smoothing_ratio, int | float)
        or not (math.isfinite(smoothing_ratio) and smoothing_ratio > 0)
    ):
        raise ConfigurationError(
            f"smoothing_ratio must be a number above 0 (0.75 is usual); got {smoothing_ratio!r}"
        )
    loss = HLGaussLoss(q.min_value, q.max_value, q.num_bins, smoothing_ratio * q.bin_width)
    return loss.to(q.centers.device)


def clip_to_support(loss: HLGaussLoss, target: Tensor) -> tuple[Tensor, Tensor]:
    """``(clipped targets, share of targets that were outside the support)``."""
    outside = (target < loss.min_value) | (target > loss.max_value)
    return target.clamp(loss.min_value, loss.max_value), outside.float().mean()


HL_GAUSS_CRITIC = "hl_gauss"
"""The value of an algorithm's ``critic`` key (each family's own enum) that selects HL-Gauss."""


@dataclass
class HLGaussConfig:
    """The support and smoothing of an HL-Gauss critic (a recipe's ``[<algorithm>.hl_gauss]``)."""

    num_bins: int = 51
    """Equal bins over ``[min_value, max_value]``; at least 2."""
    min_value: float = -100.0
    """The lowest value the critic can predict; lower targets are clipped to it."""
    max_value: float = 100.0
    """The highest value the critic can predict; higher targets are clipped to it."""
    smoothing_ratio: float = DEFAULT_SMOOTHING_RATIO
    """The Gaussian's standard deviation in bin widths."""

    def check(self, critic: str, *, source: str, where: str) -> None:
        """Checks the support, and that a regression critic leaves the table at its defaults
        (where it would change nothing, silently).

        Raises:
            ConfigurationError: Naming the key, its value and the fix.
        """
        if critic != HL_GAUSS_CRITIC:
            if self != HLGaussConfig():
                raise ConfigurationError(
                    f"{source}: '{where}.hl_gauss' sets an HL-Gauss critic but '{where}.critic' "
                    f"is '{critic}'; set {where}.critic = \"hl_gauss\" or remove {where}.hl_gauss"
                )
            return
        try:
            check_support(f"'{where}.hl_gauss'", self.min_value, self.max_value, self.num_bins)
        except ConfigurationError as error:
            raise ConfigurationError(f"{source}: {error}") from error
        if not (math.isfinite(self.smoothing_ratio) and self.smoothing_ratio > 0):
            raise ConfigurationError(
                f"{source}: '{where}.hl_gauss.smoothing_ratio' must be above 0 (0.75 is usual); "
                f"got {self.smoothing_ratio}"
            )


class HLGaussLossCallback(TdErrorPublisher, LossCallback):
    """What the HL-Gauss Q losses share: the :class:`QNet` check, the :class:`HLGaussLoss` over
    its support, and :meth:`categorical_loss` from one head's logits per window.

    Subclasses implement ``loss`` by picking the logits of the batch's state-action pairs.

    Args:
        name: Unique name; keys logs and checkpoints.
        q: The :class:`QNet`.
        optimizer: The optimizer over ``q``'s parameters.
        smoothing_ratio: The Gaussian's standard deviation in bin widths.
        lr_schedule: A torch learning-rate scheduler stepped after every update.
        max_grad_norm: Clip the gradient norm to this (``None``: no clipping).
        observation_keys: The observation keys the network reads (``None``: all, sorted).
        data_group: The data group read.
        **kwargs: Passed to :class:`~emote_core.callbacks.loss.LossCallback`.

    Raises:
        ConfigurationError: If ``q`` is not a :class:`QNet` or ``smoothing_ratio`` is not above 0.
    """

    def __init__(
        self,
        *,
        name: str,
        q: QNet,
        optimizer: torch.optim.Optimizer,
        smoothing_ratio: float = DEFAULT_SMOOTHING_RATIO,
        lr_schedule: torch.optim.lr_scheduler.LRScheduler | None = None,
        max_grad_norm: float | None = 10.0,
        observation_keys: Sequence[str] | None = None,
        data_group: str = "default",
        **kwargs: Any,
    ) -> None:
        if not isinstance(q, QNet):
            raise ConfigurationError(
                f"{name}: an HL-Gauss Q loss needs a QNet(logit_net, min_value, max_value); got "
                f"{type(q).__name__}"
            )
        super().__init__(
            name=name, network=q, optimizer=optimizer, lr_schedule=lr_schedule,
            max_grad_norm=max_grad_norm, data_group=data_group, **kwargs,
        )  # fmt: skip
        self.q_network = q
        self.hl_gauss = hl_gauss_loss_for(q, smoothing_ratio)
        self.observation_keys = key_list(observation_keys)
        self._td_errors: Tensor | None = None

    def categorical_loss(
        self, logits: Tensor, q_target: Tensor, importance_weights: Tensor | None
    ) -> Tensor:
        """``mean(w * CE(logits, histogram(clip(q_target))))`` for ``(count, num_bins)`` logits.

        Logs ``training/<name>_prediction`` (the mean expected value) and
        ``training/<name>_targets_clipped`` (the share of targets outside the support); keeps
        ``expected value - q_target`` as the TD errors to publish.
        """
        q_values = self.q_network.q_from_logit(logits)
        self.log_scalar(f"training/{self.name}_prediction", q_values.detach().mean())
        clipped, outside = clip_to_support(self.hl_gauss, q_target)
        self.log_scalar(f"training/{self.name}_targets_clipped", outside)
        self._td_errors = (q_values - q_target).detach()
        losses = self.hl_gauss(logits, clipped, reduction="none")
        return importance_weighted_mean(self.name, losses, importance_weights, q_target.shape[0])


class QLoss(HLGaussLossCallback):
    """SAC's Q loss for an HL-Gauss :class:`QNet` (``q.logits(observation=..., actions=...) ->
    (B, num_bins)``): the cross-entropy with ``q_target``'s histogram, the target clipped to the
    support.

    Reads what :class:`emote_core.algorithms.sac.QLoss` reads and takes the arguments of
    :class:`HLGaussLossCallback`, ``name`` (``"q1"``, ``"q2"``) required.
    """

    def loss(
        self,
        observation: dict[str, Tensor],
        actions: Tensor,
        q_target: Tensor,
        importance_weights: Tensor | None = None,
    ) -> Tensor:
        """``mean(w * CE(logits(s, a), histogram(clip(q_target))))``."""
        inputs = flatten_observation(observation, self.observation_keys)
        inputs, actions = window_starts(self.name, [inputs, actions], q_target.shape[0])
        logits = self.q_network.logits(observation=inputs, actions=actions)
        return self.categorical_loss(logits, q_target, importance_weights)


__all__ = [
    "DEFAULT_SMOOTHING_RATIO",
    "HL_GAUSS_CRITIC",
    "HLGaussConfig",
    "HLGaussLoss",
    "HLGaussLossCallback",
    "LogitNet",
    "QLoss",
    "QNet",
    "bin_edges",
    "check_support",
    "clip_to_support",
    "hl_gauss_loss_for",
]
