"""SAC's Q target: the soft Bellman backup from twin target networks, and their Polyak averaging."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from emote_core.algorithms.base import (
    NStepTarget,
    TargetFollower,
    TargetNetworkCheckpoints,
    key_list,
    prepare_target,
    sample_policy,
    window_count,
    window_ends,
)
from emote_core.callback import Callback, Order
from emote_core.callbacks.logging_mixin import LoggingMixin
from emote_core.errors import ConfigurationError
from emote_core.nn.inputs import flatten_observation
from emote_core.utils.checks import finite_number


def check_ln_alpha(owner: str, ln_alpha: Any) -> Tensor:
    """``ln_alpha`` if it is a one-element leaf tensor that requires gradients."""
    if (
        not isinstance(ln_alpha, torch.Tensor)
        or ln_alpha.numel() != 1
        or not ln_alpha.is_leaf
        or not ln_alpha.requires_grad
    ):
        raise ConfigurationError(
            f"{owner}: ln_alpha must be one shared one-element leaf tensor with requires_grad, "
            f"such as torch.zeros(1, requires_grad=True); got {ln_alpha!r}"
        )
    return ln_alpha


class TwinQ:
    """SAC's twin Q networks as a callback holds them: two modules, ``q1`` and ``q2``, each
    ``q(observation=..., actions=...) -> (B, 1)``, or one stacked module of two members,
    ``critics(observation=..., actions=...) -> (2, B, 1)``
    (:class:`~emote_core.nn.StackedActionValueMlp`).

    Raises:
        ConfigurationError: If neither or both forms are given, or one of the two is missing.
    """

    def __init__(
        self,
        owner: str,
        q1: nn.Module | None = None,
        q2: nn.Module | None = None,
        critics: nn.Module | None = None,
        *,
        role: str = "",
    ) -> None:
        names = [f"q1{role}", f"q2{role}", f"critics{role}"]
        if critics is not None:
            if q1 is not None or q2 is not None:
                raise ConfigurationError(
                    f"{owner}: give {names[0]} and {names[1]}, or {names[2]} (both networks "
                    "stacked in one module), not both"
                )
            if getattr(critics, "members", None) != 2:
                raise ConfigurationError(
                    f"{owner}: {names[2]} must be a stacked module of two members, such as "
                    "StackedActionValueMlp(members=2)"
                )
        elif q1 is None or q2 is None:
            raise ConfigurationError(
                f"{owner}: give both {names[0]} and {names[1]}, or {names[2]} (both networks "
                "stacked in one module)"
            )
        self.q1, self.q2, self.stacked = q1, q2, critics
        self.modules: dict[str, nn.Module] = (
            {names[2]: critics} if critics is not None else {names[0]: q1, names[1]: q2}  # type: ignore[dict-item]
        )

    def minimum(self, observation: Tensor, actions: Tensor) -> Tensor:
        """``min(Q1(s, a), Q2(s, a))``, ``(B, 1)``."""
        if self.stacked is not None:
            return self.stacked(observation=observation, actions=actions).amin(dim=0)
        assert self.q1 is not None and self.q2 is not None
        return torch.min(
            self.q1(observation=observation, actions=actions),
            self.q2(observation=observation, actions=actions),
        )

    def parameters(self) -> list[Tensor]:
        """Every parameter of the networks."""
        return [p for module in self.modules.values() for p in module.parameters()]


class FollowedTwinQ(TargetNetworkCheckpoints, LoggingMixin, Callback):
    """The base of a callback that computes a Q target per batch from twin Q networks and
    follows them with target copies (SAC's :class:`QTarget`, IQL's).

    Holds the online and target networks as :class:`TwinQ` (``online``, ``target``), twin or
    stacked alike; starts each target as a copy of its online network that never requires
    gradients; ``end_batch`` moves each one ``target_q_tau`` toward it; checkpoints carry the
    targets. Runs at ``Order.TARGET``; a subclass checks ``target_q_tau`` and writes
    ``begin_batch``.

    Raises:
        ConfigurationError: If the Q networks are not given in one form (twin or stacked) for
            both roles, or a target network is not a separate copy of its online network.
    """

    order: ClassVar[int] = Order.TARGET
    graph_safe: ClassVar[bool] = True
    compiled_methods: ClassVar[tuple[str, ...]] = ("begin_batch",)

    def __init__(
        self,
        *,
        name: str,
        data_group: str,
        target_q_tau: float,
        q1: nn.Module | None,
        q2: nn.Module | None,
        critics: nn.Module | None,
        q1_target: nn.Module | None,
        q2_target: nn.Module | None,
        critics_target: nn.Module | None,
    ) -> None:
        super().__init__(name=name, data_group=data_group)
        self.target_q_tau = target_q_tau
        self.online = TwinQ(name, q1, q2, critics)
        self.target = TwinQ(name, q1_target, q2_target, critics_target, role="_target")
        if (self.online.stacked is None) != (self.target.stacked is None):
            raise ConfigurationError(
                f"{name}: the online and target Q networks must both be stacked or both not; "
                "build the targets as copy.deepcopy of the online networks"
            )
        pairs = list(zip(self.target.modules.values(), self.online.modules.values(), strict=True))
        for target, online in pairs:
            prepare_target(name, target, online)
        self._followers = tuple(TargetFollower(target, online) for target, online in pairs)

    def end_batch(self) -> None:
        """Moves both target networks ``target_q_tau`` of the way toward the online ones."""
        for follower in self._followers:
            follower.polyak_(self.target_q_tau)

    def target_networks(self) -> dict[str, nn.Module]:
        """``q1_target`` and ``q2_target``, or ``critics_target``."""
        return self.target.modules


class QTarget(FollowedTwinQ):
    """Computes SAC's ``q_target`` for each batch and Polyak-averages the target networks.

    For a window of ``L`` transitions (``L = 1`` for ordinary one-step batches)::

        q_target = reward_scale * sum_i gamma^i r_i
                   + gamma^L * mask * (min(Q1'(s', a'), Q2'(s', a')) - alpha * log pi(a'|s'))

    with ``a' ~ pi(.|s')``, ``alpha = exp(ln_alpha)`` and ``mask`` the ``masks`` at the window's
    last transition (0 only after TERMINAL, so INTERRUPTED episodes bootstrap). ``begin_batch``
    writes it to the data group without gradients; ``end_batch`` moves each target network
    ``target_q_tau`` toward its online one. Targets start as copies and never require gradients.

    Args:
        policy: The policy being trained (the same module the losses and the agent use).
        ln_alpha: The log entropy temperature, the tensor :class:`AlphaLoss` updates in place.
        q1_target: The target copy of ``q1``.
        q2_target: The target copy of ``q2``.
        q1: The first online Q network, ``q(observation=..., actions=...) -> (B, 1)``, by keyword.
        q2: The second online Q network.
        critics: Instead of ``q1`` and ``q2``: both in one stacked module,
            ``critics(observation=..., actions=...) -> (2, B, 1)``.
        critics_target: The target copy of ``critics``.
        gamma: The discount factor.
        reward_scale: Multiplies the rewards (not the bootstrapped value).
        target_q_tau: The Polyak step, in ``(0, 1]`` (1 copies the online networks each step).
        rollout_length: Transitions per sampled window (n-step returns for ``L > 1``).
        observation_keys: The observation keys the networks read (``None``: all, sorted).
        use_masks: Multiply the bootstrap by ``masks``; ``False`` bootstraps every transition.
        data_group: The data group read and written.
        name: Unique name.

    Raises:
        ConfigurationError: If a number is out of range, ``ln_alpha`` is not a shared leaf
            tensor, or a target network is not a separate copy of its online network.
    """

    def __init__(
        self,
        *,
        policy: nn.Module,
        ln_alpha: Tensor,
        q1_target: nn.Module | None = None,
        q2_target: nn.Module | None = None,
        q1: nn.Module | None = None,
        q2: nn.Module | None = None,
        critics: nn.Module | None = None,
        critics_target: nn.Module | None = None,
        gamma: float = 0.99,
        reward_scale: float = 1.0,
        target_q_tau: float = 0.005,
        rollout_length: int = 1,
        observation_keys: Sequence[str] | None = None,
        use_masks: bool = True,
        data_group: str = "default",
        name: str = "q_target",
    ) -> None:
        tau = finite_number(name, "target_q_tau", target_q_tau, 0.0, 1.0)
        if tau == 0.0:
            raise ConfigurationError(
                f"{name}: target_q_tau=0 would never update the target networks; use a value in "
                "(0, 1]"
            )
        super().__init__(
            name=name, data_group=data_group, target_q_tau=tau, q1=q1, q2=q2, critics=critics,
            q1_target=q1_target, q2_target=q2_target, critics_target=critics_target,
        )  # fmt: skip
        self.ln_alpha = check_ln_alpha(name, ln_alpha)
        self.n_step = NStepTarget(name, gamma, rollout_length, reward_scale)
        self.policy = policy
        self.q1, self.q2 = q1, q2
        self.q1_target, self.q2_target = q1_target, q2_target
        self.observation_keys = key_list(observation_keys)
        self.use_masks = use_masks

    @property
    def gamma(self) -> float:
        """The discount factor."""
        return self.n_step.gamma

    @property
    def rollout_length(self) -> int:
        """Transitions per sampled window."""
        return self.n_step.rollout_length

    @property
    def reward_scale(self) -> float:
        """The factor applied to rewards."""
        return self.n_step.reward_scale

    def begin_batch(
        self,
        next_observation: dict[str, Tensor],
        rewards: Tensor,
        masks: Tensor | None = None,
    ) -> dict[str, Any]:
        """Returns ``{data_group: {"q_target": (count, 1)}}`` for this batch."""
        if self.use_masks and masks is None:
            raise ConfigurationError(
                f"{self.name}: the batch has no 'masks' (needed to stop bootstrapping after "
                "TERMINAL observations); sample from an emote memory table, or pass "
                "use_masks=False"
            )
        with torch.no_grad():
            count = window_count(self.name, rewards, self.rollout_length)
            observation = flatten_observation(next_observation, self.observation_keys)
            observation = window_ends(self.name, observation, count, self.rollout_length)
            actions, log_probs = sample_policy(self.policy, observation)
            q_next = self.target.minimum(observation, actions)
            soft_value = q_next - self.ln_alpha.exp() * log_probs
            q_target = self.n_step(rewards, masks if self.use_masks else None, soft_value)
        self.log_scalar(f"training/{self.name}", q_target.mean())  # "q_target" unless renamed
        return {self.data_group: {"q_target": q_target}}


__all__ = ["FollowedTwinQ", "QTarget", "TwinQ", "check_ln_alpha"]
