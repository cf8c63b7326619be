"""SAC's losses: the Q regression, the policy's soft improvement and the temperature."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from emote_core.algorithms.base import (
    TdErrorPublisher,
    frozen,
    importance_weighted_mean,
    key_list,
    sample_policy,
    window_starts,
)
from emote_core.algorithms.sac.targets import TwinQ, check_ln_alpha
from emote_core.callbacks.loss import LossCallback
from emote_core.errors import CheckpointError, ConfigurationError
from emote_core.memory.priorities import td_error_outputs
from emote_core.nn.inputs import flatten_observation
from emote_core.schedules import BPStepScheduler, ConstantSchedule

POLICY_LOG_PROBS_KEY = "policy_log_probs"
"""Where :class:`PolicyLoss` leaves its batch's log-probabilities for :class:`AlphaLoss`."""
POLICY_LOG_PROBS_STEP_KEY = "policy_log_probs_step"
"""The ``bp_step`` those log-probabilities belong to (older ones are not reused)."""


class QLoss(TdErrorPublisher, LossCallback):
    """Regresses one Q network onto the batch's ``q_target`` (mean squared error).

    Reads ``observation``, ``actions`` and ``q_target`` (from :class:`QTarget`). When the target
    has one row per window of ``L`` transitions, each window's first transition is the one
    regressed. Logs the mean prediction as ``training/<name>_prediction``.

    Args:
        name: Unique name (``"q1"``, ``"q2"``); keys logs and checkpoints.
        q: The Q network, ``q(observation=..., actions=...) -> (B, 1)``, by keyword.
        optimizer: The optimizer over ``q``'s parameters.
        lr_schedule: A torch learning-rate scheduler stepped after every update.
        max_grad_norm: Clip the gradient norm to this (``None``: no clipping).
        observation_keys: The observation keys the network reads (``None``: all, sorted).
        data_group: The data group read.
        **kwargs: Passed to :class:`~emote_core.callbacks.loss.LossCallback`.
    """

    graph_safe: ClassVar[bool] = True

    def __init__(
        self,
        *,
        name: str,
        q: nn.Module,
        optimizer: torch.optim.Optimizer,
        lr_schedule: torch.optim.lr_scheduler.LRScheduler | None = None,
        max_grad_norm: float | None = 10.0,
        observation_keys: Sequence[str] | None = None,
        data_group: str = "default",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            name=name, network=q, optimizer=optimizer, lr_schedule=lr_schedule,
            max_grad_norm=max_grad_norm, data_group=data_group, **kwargs,
        )  # fmt: skip
        self.q_network = q
        self.observation_keys = key_list(observation_keys)
        self._td_errors: Tensor | None = None

    def loss(
        self,
        observation: dict[str, Tensor],
        actions: Tensor,
        q_target: Tensor,
        importance_weights: Tensor | None = None,
    ) -> Tensor:
        """``mean(w * (q(s, a) - q_target)^2)``, ``w`` the batch's importance-sampling weights
        (prioritized replay; 1 without them)."""
        inputs = flatten_observation(observation, self.observation_keys)
        inputs, actions = window_starts(self.name, [inputs, actions], q_target.shape[0])
        q_values = self.q_network(observation=inputs, actions=actions)
        errors = self.regression(q_values, q_target)
        return importance_weighted_mean(self.name, errors, importance_weights, q_target.shape[0])

    def regression(self, q_values: Tensor, q_target: Tensor) -> Tensor:
        """The squared error of each window's ``q_values`` to ``q_target``, ``(count, 1)``;
        logs the mean prediction and keeps the TD errors for :meth:`backward` to publish."""
        self.log_scalar(f"training/{self.name}_prediction", q_values.detach().mean())
        errors = q_values - q_target
        self._td_errors = errors.detach()
        return errors.square()


class StackedQLoss(LossCallback):
    """:class:`QLoss` for SAC's Q networks stacked in one module: one forward and backward pass
    and one optimizer step for all, each member trained and clipped as its own :class:`QLoss`
    would train it.

    Logs ``loss/<member>``, ``training/<member>_prediction``,
    ``training/<member>_gradient_norm`` and ``loss/<name>`` (the sum), and publishes each
    member's TD errors as ``<member>_td_error``.

    Args:
        critics: The stacked Q networks, ``critics(observation=..., actions=...) -> (M, B, 1)``
            (:class:`~emote_core.nn.StackedActionValueMlp`).
        optimizer: The optimizer over ``critics``' parameters.
        lr_schedule: A torch learning-rate scheduler stepped after every update.
        max_grad_norm: Clip each member's gradient norm to this (``None``: no clipping).
        member_names: One name per member (``"q1"``, ``"q2"``), for logs and TD errors.
        observation_keys: The observation keys the networks read (``None``: all, sorted).
        name: Unique name; keys logs and checkpoints.
        data_group: The data group read.
        **kwargs: Passed to :class:`~emote_core.callbacks.loss.LossCallback`.

    Raises:
        ConfigurationError: If ``member_names`` does not name every member once.
    """

    graph_safe: ClassVar[bool] = True

    def __init__(
        self,
        *,
        critics: nn.Module,
        optimizer: torch.optim.Optimizer,
        lr_schedule: torch.optim.lr_scheduler.LRScheduler | None = None,
        max_grad_norm: float | None = 10.0,
        member_names: Sequence[str] = ("q1", "q2"),
        observation_keys: Sequence[str] | None = None,
        name: str = "q",
        data_group: str = "default",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            name=name, network=critics, optimizer=optimizer, lr_schedule=lr_schedule,
            max_grad_norm=max_grad_norm, data_group=data_group, **kwargs,
        )  # fmt: skip
        members = getattr(critics, "members", None)
        names = list(member_names)
        if members != len(names) or len(set(names)) != len(names) or name in names:
            raise ConfigurationError(
                f"{name}: member_names must give each of the stacked network's {members} "
                f"members its own name, other than the loss's; got {names!r}"
            )
        self.critics = critics
        self.member_names = names
        self.observation_keys = key_list(observation_keys)
        self._td_errors: Tensor | None = None
        self._member_losses: Tensor | None = None

    def loss(
        self,
        observation: dict[str, Tensor],
        actions: Tensor,
        q_target: Tensor,
        importance_weights: Tensor | None = None,
    ) -> Tensor:
        """``sum_m mean(w * (q_m(s, a) - q_target)^2)``, ``w`` the batch's importance-sampling
        weights (prioritized replay; 1 without them)."""
        inputs = flatten_observation(observation, self.observation_keys)
        count = q_target.shape[0]
        inputs, actions = window_starts(self.name, [inputs, actions], count)
        q_values = self.critics(observation=inputs, actions=actions)
        predictions = q_values.detach().mean(dim=(1, 2))
        for member, name in enumerate(self.member_names):
            self.log_scalar(f"training/{name}_prediction", predictions[member])
        errors = q_values - q_target
        self._td_errors = errors.detach()
        squared = errors.square()
        if importance_weights is not None:
            (weights,) = window_starts(self.name, [importance_weights], count)
            squared = weights * squared
        member_losses = squared.mean(dim=(1, 2))
        self._member_losses = member_losses.detach()
        return member_losses.sum()

    def clip_gradients(self, grads: list[Tensor]) -> Tensor:
        """Clips each member's gradient to ``max_grad_norm`` on its own (``None``: measures
        only), logs each member's norm before, and returns the norm of them all."""
        norms = self._norms(grads)
        if self.max_grad_norm is not None:
            members = len(self.member_names)
            coefficients = torch.clamp(float(self.max_grad_norm) / (norms + 1e-6), max=1.0)
            for grad in grads:
                grad.mul_(coefficients.reshape(members, *([1] * (grad.dim() - 1))))
        for member, name in enumerate(self.member_names):
            self.log_scalar(f"training/{name}_gradient_norm", norms[member])
        return torch.linalg.vector_norm(norms)

    def _norms(self, grads: list[Tensor]) -> Tensor:
        """Each member's gradient norm as its own loss takes it: the norm of its parameters'
        norms (one foreach launch for every member and parameter on a GPU)."""
        members = len(self.member_names)
        views = [grad[member] for member in range(members) for grad in grads]
        per_parameter = torch.stack(torch._foreach_norm(views, 2.0)).reshape(members, -1)
        return torch.linalg.vector_norm(per_parameter, 2.0, dim=1)

    def backward(self, **state: Any) -> dict[str, Any]:
        """One step of both members; then each member's loss logged and its TD errors
        published, ``{data_group: {"<member>_td_error": (count, 1), ...}}``."""
        super().backward(**state)
        td_errors, self._td_errors = self._td_errors, None
        member_losses, self._member_losses = self._member_losses, None
        outputs: dict[str, Any] = {}
        for member, name in enumerate(self.member_names):
            if member_losses is not None:
                self.log_scalar(f"loss/{name}", member_losses[member])
            if td_errors is not None:
                outputs.update(td_error_outputs(name, td_errors[member], state.get("bp_step")))
        return {self.data_group: outputs}


class PolicyLoss(LossCallback):
    """Trains the policy to maximise ``min(Q1, Q2)`` plus entropy: ``alpha * log pi - min Q``.

    Actions are reparameterised samples of the policy on the batch's ``observation``; the Q
    networks are frozen while the loss goes through them, so only the policy gets gradients.
    Logs the policy's entropy estimate ``-mean(log pi)`` as ``training/<name>_entropy``, and puts
    the samples' log-probabilities in the data group as ``policy_log_probs`` (with the step in
    ``policy_log_probs_step``) so that :class:`AlphaLoss` need not sample the policy again.

    Args:
        policy: The policy; ``policy.sample(observation)`` gives ``(actions, log_probs)``.
        ln_alpha: The log temperature shared with :class:`AlphaLoss` (read, not trained here).
        q1: The first Q network.
        q2: The second Q network.
        critics: Instead of ``q1`` and ``q2``: both in one stacked module,
            ``critics(observation=..., actions=...) -> (2, B, 1)``.
        optimizer: The optimizer over the policy's parameters.
        lr_schedule: A torch learning-rate scheduler stepped after every update.
        max_grad_norm: Clip the gradient norm to this (``None``: no clipping).
        observation_keys: The observation keys the networks read (``None``: all, sorted).
        name: Unique name.
        data_group: The data group read.
        **kwargs: Passed to :class:`~emote_core.callbacks.loss.LossCallback`.
    """

    graph_safe: ClassVar[bool] = True

    def __init__(
        self,
        *,
        policy: nn.Module,
        ln_alpha: Tensor,
        q1: nn.Module | None = None,
        q2: nn.Module | None = None,
        critics: nn.Module | None = None,
        optimizer: torch.optim.Optimizer,
        lr_schedule: torch.optim.lr_scheduler.LRScheduler | None = None,
        max_grad_norm: float | None = 10.0,
        observation_keys: Sequence[str] | None = None,
        name: str = "policy",
        data_group: str = "default",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            name=name, network=policy, optimizer=optimizer, lr_schedule=lr_schedule,
            max_grad_norm=max_grad_norm, data_group=data_group, **kwargs,
        )  # fmt: skip
        self.policy = policy
        self.ln_alpha = check_ln_alpha(name, ln_alpha)
        self.critics = TwinQ(name, q1, q2, critics)
        self.q1, self.q2 = q1, q2
        self._q_parameters = self.critics.parameters()
        self.observation_keys = key_list(observation_keys)
        self._log_probs: Tensor | None = None

    def loss(self, observation: dict[str, Tensor]) -> Tensor:
        """``mean(alpha * log pi(a|s) - min(Q1(s, a), Q2(s, a)))`` with ``a ~ pi(.|s)``."""
        inputs = flatten_observation(observation, self.observation_keys)
        actions, log_probs = sample_policy(self.policy, inputs)
        q_values = self.critics.minimum(inputs, actions)
        return (self.entropy_term(log_probs) - q_values).mean()

    def entropy_term(self, log_probs: Tensor) -> Tensor:
        """``alpha * log pi(a|s)`` of the batch's samples (the temperature held fixed); keeps
        their log-probabilities for :class:`AlphaLoss` and logs their entropy."""
        self._log_probs = log_probs.detach()
        self.log_scalar(f"training/{self.name}_entropy", -self._log_probs.mean())
        return self.ln_alpha.detach().exp() * log_probs

    def backward(self, **state: Any) -> dict[str, Any]:
        """One policy step; hands this batch's log-probabilities on to :class:`AlphaLoss`.

        Returns:
            ``{data_group: {"policy_log_probs": (B, 1), "policy_log_probs_step": bp_step}}``.
        """
        with frozen(self._q_parameters):  # here, not in loss: torch.compile breaks at it
            super().backward(**state)
        log_probs, self._log_probs = self._log_probs, None
        return {
            self.data_group: {
                POLICY_LOG_PROBS_KEY: log_probs,
                POLICY_LOG_PROBS_STEP_KEY: state.get("bp_step"),
            }
        }


class AlphaLoss(LossCallback):
    """Tunes SAC's entropy temperature toward a target entropy.

    The loss is ``-mean(ln_alpha * (log pi(a|s) + target_entropy))``; ``ln_alpha`` is then
    clamped to ``log(max_alpha)``. It is updated in place, so every holder of the same tensor
    (:class:`QTarget`, :class:`PolicyLoss`) sees the new value and a restored checkpoint. Logs
    ``training/<name>`` (alpha) and ``training/<name>_target_entropy``. The target entropy is
    always a schedule (:attr:`target_entropy`; a number becomes a ``ConstantSchedule``), stepped
    in ``end_batch``.

    Args:
        policy: The policy; ``policy.sample(observation)`` gives ``(actions, log_probs)``.
        ln_alpha: The shared log temperature: a one-element leaf tensor with requires_grad.
        optimizer: An optimizer over ``[ln_alpha]``.
        action_dim: The number of action dimensions.
        target_entropy: A number, a schedule stepped once per batch, or ``None`` for
            ``-action_dim``.
        max_alpha: The largest temperature; ``None`` does not clamp.
        lr_schedule: A torch learning-rate scheduler stepped after every update.
        max_grad_norm: Clip the gradient norm to this (``None``: no clipping).
        observation_keys: The observation keys the policy reads (``None``: all, sorted).
        name: Unique name.
        data_group: The data group read.
        reuse_policy_log_probs: Use the log-probabilities :class:`PolicyLoss` computed on this
            batch instead of sampling again (put the policy loss first for this to apply).
        **kwargs: Passed to :class:`~emote_core.callbacks.loss.LossCallback`.

    Raises:
        ConfigurationError: If ``ln_alpha`` is not a shared leaf tensor in ``optimizer``, or
            ``action_dim``/``max_alpha`` is not positive.
        TypeError: If ``target_entropy`` is not a number, a schedule or ``None``.
    """

    graph_safe: ClassVar[bool] = True
    target_entropy: BPStepScheduler
    """The target entropy's schedule; a number given is held as a ``ConstantSchedule``."""

    def __init__(
        self,
        *,
        policy: nn.Module,
        ln_alpha: Tensor,
        optimizer: torch.optim.Optimizer,
        action_dim: int,
        target_entropy: float | BPStepScheduler | None = None,
        max_alpha: float | None = 10.0,
        lr_schedule: torch.optim.lr_scheduler.LRScheduler | None = None,
        max_grad_norm: float | None = 10.0,
        observation_keys: Sequence[str] | None = None,
        name: str = "alpha",
        data_group: str = "default",
        reuse_policy_log_probs: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            name=name, network=None, optimizer=optimizer, lr_schedule=lr_schedule,
            max_grad_norm=max_grad_norm, data_group=data_group, **kwargs,
        )  # fmt: skip
        self.ln_alpha = check_ln_alpha(name, ln_alpha)
        if not any(parameter is ln_alpha for parameter in self.parameters):
            raise ConfigurationError(
                f"{name}: the optimizer does not hold ln_alpha; build it over [ln_alpha], e.g. "
                "torch.optim.Adam([ln_alpha], lr=3e-4)"
            )
        if isinstance(action_dim, bool) or not isinstance(action_dim, int) or action_dim < 1:
            raise ConfigurationError(
                f"{name}: action_dim must be a positive integer; got {action_dim!r}"
            )
        if max_alpha is not None and not (math.isfinite(max_alpha) and max_alpha > 0):
            raise ConfigurationError(
                f"{name}: max_alpha must be positive or None; got {max_alpha!r}"
            )
        if target_entropy is None:
            target_entropy = -float(action_dim)
        if not isinstance(target_entropy, BPStepScheduler):
            if isinstance(target_entropy, bool) or not isinstance(target_entropy, int | float):
                raise TypeError(
                    f"{name}: target_entropy must be a number, an emote_core.schedules schedule "
                    f"or None; got {target_entropy!r} ({type(target_entropy).__name__})"
                )
            target_entropy = ConstantSchedule(target_entropy)
        self.policy = policy
        self.action_dim = action_dim
        self.target_entropy = target_entropy
        self.max_ln_alpha = math.log(max_alpha) if max_alpha is not None else None
        self.observation_keys = key_list(observation_keys)
        self.reuse_policy_log_probs = reuse_policy_log_probs

    def capture_blocker(self) -> str | None:
        """As :meth:`LossCallback.capture_blocker`, and not with a target entropy that changes."""
        reason = super().capture_blocker()
        if reason is None and not isinstance(self.target_entropy, ConstantSchedule):
            reason = "its target entropy follows a schedule"
        return reason

    @property
    def target_entropy_value(self) -> float:
        """The target entropy at the current step."""
        return float(self.target_entropy.value)

    def loss(
        self, observation: dict[str, Tensor], policy_log_probs: Tensor | None = None
    ) -> Tensor:
        """``-mean(ln_alpha * (log pi(a|s) + target_entropy))``, with ``log pi(a|s)`` the
        ``policy_log_probs`` given (:meth:`backward` passes them only when :class:`PolicyLoss`
        made them on this batch) or else of actions sampled now."""
        log_probs = policy_log_probs
        if log_probs is None:
            inputs = flatten_observation(observation, self.observation_keys)
            with torch.no_grad():
                _, log_probs = sample_policy(self.policy, inputs)
        error = log_probs.detach() + self.target_entropy_value
        return -(self.ln_alpha * error).mean()

    def backward(self, **state: Any) -> None:
        """One temperature step, then the clamp and the logs.

        The policy loss's log-probabilities are reused only when they are this step's
        (decided here, not in :meth:`loss`, so that a compiled loss sees no step numbers).
        """
        step = state.get("bp_step")
        if not (
            self.reuse_policy_log_probs
            and step is not None
            and state.get(POLICY_LOG_PROBS_STEP_KEY) == step
        ):
            state = {**state, POLICY_LOG_PROBS_KEY: None}
        super().backward(**state)
        if self.max_ln_alpha is not None:
            with torch.no_grad():
                self.ln_alpha.clamp_(max=self.max_ln_alpha)
        self.log_scalar(f"training/{self.name}", self.ln_alpha.detach().exp())
        self.log_scalar(f"training/{self.name}_target_entropy", self.target_entropy_value)

    def end_batch(self) -> None:
        """Steps the target-entropy schedule once per batch."""
        self.target_entropy.step()

    def state_dict(self) -> dict[str, Any]:
        """The optimizer, ``ln_alpha``, the target-entropy schedule and the logs."""
        state = super().state_dict()
        state["ln_alpha"] = self.ln_alpha.detach().cpu().clone()
        state["target_entropy_schedule"] = self.target_entropy.state_dict()
        return state

    def load_state_dict(
        self,
        state_dict: dict[str, Any],
        load_network: bool = True,
        load_optimizer: bool = True,
        load_hparams: bool = True,
    ) -> None:
        """Restores ``ln_alpha`` in place (with ``load_network``), the optimizer and the
        target-entropy schedule (with ``load_hparams``).

        ``ln_alpha`` is read from emote's ``"ln_alpha"`` entry or, in upstream emote's layout,
        from ``"network_state_dict"``.

        Raises:
            CheckpointError: With ``load_network``, if neither entry holds a tensor of
                ``ln_alpha``'s size.
        """
        super().load_state_dict(state_dict, load_network, load_optimizer, load_hparams)
        if load_network:
            key = "ln_alpha" if "ln_alpha" in state_dict else "network_state_dict"
            saved = state_dict.get(key)
            if not isinstance(saved, Tensor) or saved.numel() != self.ln_alpha.numel():
                raise CheckpointError(
                    f"{self.name}: the state has no ln_alpha to load (an 'ln_alpha' or upstream "
                    f"emote's 'network_state_dict' tensor of {self.ln_alpha.numel()} element); "
                    f"it holds {sorted(state_dict)} — pass AlphaLoss's state_dict(), or "
                    "load_network=False to keep the current temperature"
                )
            with torch.no_grad():
                self.ln_alpha.copy_(saved.detach().reshape(self.ln_alpha.shape))
        schedule = state_dict.get("target_entropy_schedule")
        if load_hparams and schedule is not None:
            self.target_entropy.load_state_dict(schedule)


__all__ = [
    "POLICY_LOG_PROBS_KEY",
    "POLICY_LOG_PROBS_STEP_KEY",
    "AlphaLoss",
    "PolicyLoss",
    "QLoss",
    "StackedQLoss",
]
