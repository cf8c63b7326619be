"""LossCallback: one network's loss, backward pass, gradient clipping and optimizer step."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from emote_core.callback import Callback, Order
from emote_core.callbacks.logging_mixin import LoggingMixin
from emote_core.errors import CallbackDefinitionError, ConfigurationError


class LossCallback(LoggingMixin, Callback):
    """Base of every loss: implement :meth:`loss`; this class does the optimisation step.

    A subclass that does not implement :meth:`loss` cannot be built. ``LossCallback`` itself
    can, to hold a network and optimizer for a ``Checkpointer`` or ``CheckpointLoader``; its
    ``loss`` raises ``NotImplementedError`` if it is ever trained.

    Each batch, ``backward`` zeroes the gradients, computes :meth:`loss` with its parameters
    selected by name from the state (data group first), back-propagates, clips the gradient norm,
    steps the optimizer and the learning-rate schedule, and logs ``loss/<name>``,
    ``training/<name>_lr`` and ``training/<name>_gradient_norm``.

    Args:
        name: Unique name; keys logs and checkpoints.
        network: The network this loss trains (saved in checkpoints), or ``None`` when the
            optimizer holds free parameters (an entropy temperature, say).
        optimizer: The optimizer over the trained parameters.
        lr_schedule: A torch learning-rate scheduler stepped after every optimizer step.
        max_grad_norm: Clip the total gradient norm to this; ``None`` measures without clipping.
            ``0`` zeroes every gradient, as torch's clipping does, with a warning.
        data_group: The data group the loss reads first.
        log_per_param_weights: Also log a histogram of every parameter's weights.
        log_per_param_grads: Also log a histogram of every parameter's gradients.
        **kwargs: Passed to :class:`LoggingMixin` (``default_window_length``).
    """

    order: ClassVar[int] = Order.DEFAULT
    extra_hooks: ClassVar[tuple[str, ...]] = ("loss",)
    compiled_methods: ClassVar[tuple[str, ...]] = ("loss",)
    gradient_hook: Callable[[Sequence[torch.Tensor]], None] | None = None
    """Called with :attr:`parameters` after back-propagation and before clipping; under
    ``torchrun`` it averages the gradients across ranks (``callbacks/distributed.py``)."""

    def __init__(
        self,
        *,
        name: str,
        network: nn.Module | None,
        optimizer: torch.optim.Optimizer,
        lr_schedule: torch.optim.lr_scheduler.LRScheduler | None = None,
        max_grad_norm: float | None = 10.0,
        data_group: str | None = "default",
        log_per_param_weights: bool = False,
        log_per_param_grads: bool = False,
        **kwargs: Any,
    ) -> None:
        cls = type(self)
        if cls is not LossCallback and cls.loss is LossCallback.loss:
            raise CallbackDefinitionError(
                f"loss class {cls.__qualname__} does not implement loss(); every loss must — "
                "define loss() returning a scalar tensor"
            )
        super().__init__(name=name, data_group=data_group, **kwargs)
        if max_grad_norm is not None and not max_grad_norm >= 0:
            raise ConfigurationError(
                f"loss '{name}' has max_grad_norm={max_grad_norm}; it must be positive, 0 "
                "(zeroes every gradient) or None (no clipping)"
            )
        if max_grad_norm == 0:
            warnings.warn(
                f"loss '{name}' has max_grad_norm=0, which clips every gradient to zero so the "
                "loss never trains its network; pass a positive value, or None not to clip",
                UserWarning,
                stacklevel=2,
            )
        self.network = network
        self.optimizer = optimizer
        self.lr_schedule = lr_schedule
        self.max_grad_norm = max_grad_norm
        self.log_per_param_weights = log_per_param_weights
        self.log_per_param_grads = log_per_param_grads
        self.parameters = [p for group in optimizer.param_groups for p in group["params"]]

    def loss(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Returns the scalar loss; parameters are filled by name from the training state.

        Raises:
            NotImplementedError: On ``LossCallback`` itself, which holds a network for
                checkpoints and has no loss.
        """
        raise NotImplementedError(
            f"loss '{self.name}' is a plain LossCallback, which has no loss to train; subclass "
            "it and implement loss(), or list it only among a checkpointer's restorees"
        )

    def backward(self, **state: Any) -> None:
        """Runs one optimisation step of this loss."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss(**state)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ConfigurationError(
                f"loss '{self.name}' returned {type(loss).__name__}"
                + (f" of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else "")
                + "; a loss must return a scalar tensor"
            )
        loss.backward()
        if self.gradient_hook is not None:
            self.gradient_hook(self.parameters)
        grad_norm = self.clip_gradients([p.grad for p in self.parameters if p.grad is not None])
        self.optimizer.step()
        if self.lr_schedule is not None:
            self.lr_schedule.step()
        self.log_scalar(f"loss/{self.name}", loss.detach())
        self.log_scalar(f"training/{self.name}_lr", self.optimizer.param_groups[0]["lr"])
        self.log_scalar(f"training/{self.name}_gradient_norm", grad_norm)
        if self.network is not None and (self.log_per_param_weights or self.log_per_param_grads):
            self._log_parameters()

    def clip_gradients(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """Clips the parameters' gradients ``grads`` in place to a total 2-norm of at most
        ``max_grad_norm`` (with ``None``, only measures it) and returns the norm before, which
        is logged as ``training/<name>_gradient_norm``."""
        if self.max_grad_norm is not None:
            return clip_gradients_(self.parameters, grads, self.max_grad_norm)
        # Measure only: clipping to infinity would still rescale every gradient.
        return gradient_norm(grads)

    def capture_blocker(self) -> str | None:
        """As :meth:`Callback.capture_blocker`, and not with a learning-rate schedule, a gradient
        hook (data-parallel averaging) or per-parameter histograms, which act on the host."""
        reason = super().capture_blocker()
        if reason is None and self.lr_schedule is not None:
            reason = "it steps a learning-rate schedule"
        if reason is None and self.gradient_hook is not None:
            reason = "a gradient hook (data-parallel averaging) runs after its backward pass"
        if reason is None and (self.log_per_param_weights or self.log_per_param_grads):
            reason = "it logs per-parameter histograms"
        return reason

    def _log_parameters(self) -> None:
        assert self.network is not None
        for parameter_name, parameter in self.network.named_parameters():
            if self.log_per_param_weights:
                self.log_histogram(f"{self.name}_weights/{parameter_name}", parameter.detach())
            if self.log_per_param_grads and parameter.grad is not None:
                self.log_histogram(f"{self.name}_grads/{parameter_name}", parameter.grad)

    def state_dict(self) -> dict[str, Any]:
        """The network, optimizer and schedule state, and the logs."""
        state = super().state_dict()
        if self.network is not None:
            state["network_state_dict"] = self.network.state_dict()
        state["optimizer_state_dict"] = self.optimizer.state_dict()
        if self.lr_schedule is not None:
            state["lr_schedule_state_dict"] = self.lr_schedule.state_dict()
        return state

    def load_state_dict(
        self,
        state_dict: dict[str, Any],
        load_network: bool = True,
        load_optimizer: bool = True,
        load_hparams: bool = True,
    ) -> None:
        """Restores what :meth:`state_dict` saved, as selected by the flags.

        ``load_hparams`` decides whether learning rates come from the checkpoint or stay as
        configured now, whether or not the optimizer's moments are loaded.
        """
        super().load_state_dict(state_dict, load_network, load_optimizer, load_hparams)
        if load_network and self.network is not None and "network_state_dict" in state_dict:
            self.network.load_state_dict(state_dict["network_state_dict"])
        saved = state_dict.get("optimizer_state_dict")
        if saved is None:
            return
        current_lrs = [group["lr"] for group in self.optimizer.param_groups]
        capturable = [group.get("capturable") for group in self.optimizer.param_groups]
        if load_optimizer:
            self.optimizer.load_state_dict(saved)
            _keep_capturable(self.optimizer, capturable)
            if self.lr_schedule is not None and "lr_schedule_state_dict" in state_dict:
                self.lr_schedule.load_state_dict(state_dict["lr_schedule_state_dict"])
        groups = self.optimizer.param_groups
        if load_hparams:
            for group, saved_group in zip(groups, saved["param_groups"], strict=False):
                group["lr"] = saved_group["lr"]
        else:
            for group, lr in zip(groups, current_lrs, strict=True):
                group["lr"] = lr


def _keep_capturable(optimizer: torch.optim.Optimizer, capturable: list[bool | None]) -> None:
    """Keeps the optimizer's own ``capturable`` flags (CUDA-graph training sets them, eager
    training on a CPU cannot step with them) and its step counters where they then belong."""
    if any(
        flag is not None and group.get("capturable") != flag
        for group, flag in zip(optimizer.param_groups, capturable, strict=True)
    ):
        set_capturable(optimizer, capturable)


def set_capturable(optimizer: torch.optim.Optimizer, flags: list[bool | None]) -> None:
    """Sets each param group's ``capturable`` flag (``None`` leaves a group as it is) and
    moves its step counters where the flag wants them: on the parameters' device when
    capturable (or fused), else on the CPU."""
    for group, flag in zip(optimizer.param_groups, flags, strict=True):
        if flag is None:
            continue
        group["capturable"] = flag
        for parameter in group["params"]:
            state = optimizer.state.get(parameter, {})
            step = state.get("step")
            if not isinstance(step, torch.Tensor):
                continue
            device = parameter.device if flag or group.get("fused") else torch.device("cpu")
            if step.device != device:
                state["step"] = step.to(device=device, dtype=torch.float32)


@functools.cache
def _foreach_device(device: torch.device) -> bool:
    """Whether torch's gradient-norm functions use the foreach kernels on ``device``."""
    try:
        from torch.utils._foreach_utils import _device_has_foreach_support
    except ImportError:  # pragma: no cover - a torch without the helper: use torch's functions
        return False
    return bool(_device_has_foreach_support(device))


def _one_group(grads: list[torch.Tensor]) -> bool:
    """Whether ``grads`` are plain tensors on one foreach-capable device, of one dtype, that
    record no autograd history: then torch's functions make one group of them, in order, and
    their ``no_grad`` changes nothing."""
    if not grads:
        return False
    device, dtype = grads[0].device, grads[0].dtype
    if not _foreach_device(device):
        return False
    for grad in grads:
        if (
            type(grad) is not torch.Tensor
            or grad.requires_grad
            or grad.dtype != dtype
            or grad.device != device
        ):
            return False
    return True


def gradient_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The total 2-norm of ``grads``: ``torch.nn.utils.get_total_norm(grads)``, bit for bit.

    When the gradients form one group (the usual case) this runs the same kernels without
    torch's per-call grouping of the tensors by device and dtype, which costs more than the
    arithmetic for small networks.
    """
    if not _one_group(grads):
        return nn.utils.get_total_norm(grads)
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)


def clip_gradients_(
    parameters: list[torch.Tensor], grads: list[torch.Tensor], max_norm: float
) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_(parameters, max_norm)``, bit for bit: scales ``grads``
    (the parameters' gradients) in place to a total 2-norm of at most ``max_norm`` and returns
    the norm before clipping, without the per-call grouping when the gradients form one group."""
    if not _one_group(grads):
        return nn.utils.clip_grad_norm_(parameters, max_norm)
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
    coefficient = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)
    torch._foreach_mul_(grads, coefficient)
    return total


__all__ = ["LossCallback", "clip_gradients_", "gradient_norm", "set_capturable"]
