"""The base of every algorithm family's callbacks: batch windows, n-step targets, target
networks, TD errors for prioritized replay."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from emote_core.errors import ConfigurationError
from emote_core.memory.priorities import td_error_outputs
from emote_core.utils.checks import finite_number, positive_int
from emote_core.utils.gamma_matrix import discount, make_gamma_matrix


def priority_feedback(table: Any, losses: Sequence[str]) -> list[Any]:
    """The callback feeding the TD errors of ``losses`` back to ``table`` when the table samples
    by priority (``memory.sampler = "prioritized"``); nothing otherwise."""
    if table is None or not getattr(table, "prioritized", False):
        return []
    from emote_core.memory.priorities import PriorityUpdater

    return [PriorityUpdater(table=table, losses=losses)]


def key_list(observation_keys: Sequence[str] | None) -> list[str] | None:
    """The observation keys a network reads, as a list (``None``: all, sorted)."""
    return list(observation_keys) if observation_keys is not None else None


def target_states(targets: Mapping[str, nn.Module]) -> dict[str, Any]:
    """Checkpoint entries ``<name>_state_dict`` for target networks by name."""
    return {f"{name}_state_dict": network.state_dict() for name, network in targets.items()}


def load_target_states(state_dict: Mapping[str, Any], targets: Mapping[str, nn.Module]) -> None:
    """Restores the target networks whose ``<name>_state_dict`` entries are present."""
    for name, network in targets.items():
        key = f"{name}_state_dict"
        if key in state_dict:
            network.load_state_dict(state_dict[key])


class TargetNetworkCheckpoints:
    """For callbacks that keep target networks: checkpoints carry each one's weights as
    ``<name>_state_dict`` (:func:`target_states`) beside what the callback's other bases save,
    and restore them with ``load_network``.

    Mixed in before the callback's base; :meth:`target_networks` names the networks.
    """

    def target_networks(self) -> Mapping[str, nn.Module]:
        """The target networks by checkpoint name."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """The target networks' weights and the other bases' state (the logs)."""
        return {**super().state_dict(), **target_states(self.target_networks())}  # type: ignore[misc]

    def load_state_dict(
        self,
        state_dict: dict[str, Any],
        load_network: bool = True,
        load_optimizer: bool = True,
        load_hparams: bool = True,
    ) -> None:
        """Restores the target networks (with ``load_network``) and the other bases' state."""
        super().load_state_dict(state_dict, load_network, load_optimizer, load_hparams)  # type: ignore[misc]
        if load_network:
            load_target_states(state_dict, self.target_networks())


def check_distinct_networks(owner: str, target: nn.Module, online: nn.Module) -> None:
    """A target network must be a separate copy: sharing parameters would make it pointless."""
    if target is online or {id(p) for p in target.parameters()} & {
        id(p) for p in online.parameters()
    }:
        raise ConfigurationError(
            f"{owner}: a target network shares parameters with the network it tracks; pass a "
            "separate copy (copy.deepcopy(q))"
        )


def sample_policy(policy: nn.Module, observation: Tensor) -> tuple[Tensor, Tensor]:
    """``(actions, log_probs)`` from a stochastic policy, whatever mode the module is in.

    Uses ``policy.sample`` when the policy has one (every emote Gaussian policy does), so that a
    collector switching the shared module to eval mode cannot change what a loss computes;
    otherwise calls the module, which must then be in train mode and return the pair.
    """
    sample = getattr(policy, "sample", None)
    result = sample(observation) if callable(sample) else policy(observation)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise ConfigurationError(
            f"policy {type(policy).__name__} returned {type(result).__name__}; SAC needs a "
            "policy whose sample(observation) (or forward in train mode) returns (actions, "
            "log_probs)"
        )
    return result


def window_count(owner: str, rewards: Tensor, rollout_length: int) -> int:
    """The number of windows in a batch of ``count * rollout_length`` reward rows."""
    rows = rewards.shape[0]
    if rows % rollout_length != 0:
        raise ConfigurationError(
            f"{owner}: the batch has {rows} reward rows, not a multiple of rollout_length "
            f"{rollout_length}; sample with the loader's rollout_length equal to the target's"
        )
    return rows // rollout_length


def window_ends(owner: str, next_observation: Tensor, count: int, rollout_length: int) -> Tensor:
    """The observation after each window: one row per window.

    N-step tables already give one row per window; one-step tables give one per transition, of
    which each window's last is the one to bootstrap from.
    """
    rows = next_observation.shape[0]
    if rows == count:
        return next_observation
    if rows == count * rollout_length:
        return next_observation[rollout_length - 1 :: rollout_length]
    raise ConfigurationError(
        f"{owner}: next_observation has {rows} rows; expected {count} (one per window) or "
        f"{count * rollout_length} (one per transition) for {count} windows of {rollout_length}"
    )


def window_starts(owner: str, tensors: Sequence[Tensor], count: int) -> list[Tensor]:
    """Each window's first row of ``tensors`` (unchanged when there is one row per window)."""
    selected = []
    for tensor in tensors:
        rows = tensor.shape[0]
        if rows == count:
            selected.append(tensor)
        elif rows % count == 0:
            selected.append(tensor[:: rows // count])
        else:
            raise ConfigurationError(
                f"{owner}: a batch entry has {rows} rows but q_target has {count}; the Q target "
                "and the loss must see the same batch and rollout_length"
            )
    return selected


def importance_weighted_mean(
    owner: str, losses: Tensor, importance_weights: Tensor | None, count: int
) -> Tensor:
    """The mean of per-window ``losses``, weighted by each window's importance weight when the
    batch has them (prioritized replay), else plain."""
    if importance_weights is None:
        return losses.mean()
    (weights,) = window_starts(owner, [importance_weights], count)
    return (weights * losses).mean()


class TdErrorPublisher:
    """For Q losses that feed prioritized replay: the loss stores its batch's TD errors in
    ``_td_errors``; after the step, :meth:`backward` publishes them (one per window) for the
    :class:`~emote_core.memory.priorities.PriorityUpdater`.

    Mixed in before :class:`~emote_core.callbacks.loss.LossCallback`.
    """

    name: str
    data_group: str
    _td_errors: Tensor | None = None

    def backward(self, **state: Any) -> dict[str, Any]:
        """One step of the loss, then ``{data_group: {"<name>_td_error": (count, 1),
        "<name>_td_error_step": bp_step}}``."""
        super().backward(**state)  # type: ignore[misc]
        td_errors, self._td_errors = self._td_errors, None
        return {self.data_group: td_error_outputs(self.name, td_errors, state.get("bp_step"))}


class NStepTarget:
    """``reward_scale * sum_i gamma^i r_i + gamma^L * mask * bootstrap`` per window.

    Masks are per transition; a 0 stops both later rewards and the bootstrap (within a sampled
    window only the last transition can have one, as windows never cross episodes).

    Args:
        owner: The callback's name, for messages.
        gamma: The discount factor.
        rollout_length: The window length ``L``.
        reward_scale: Multiplies the rewards (not the bootstrap value).
    """

    def __init__(self, owner: str, gamma: float, rollout_length: int, reward_scale: float) -> None:
        self.owner = owner
        self.gamma = finite_number(owner, "gamma", gamma, 0.0, 1.0)
        self.rollout_length = positive_int(owner, "rollout_length", rollout_length)
        self.reward_scale = finite_number(owner, "reward_scale", reward_scale)
        self._gamma_matrix = make_gamma_matrix(self.gamma, self.rollout_length)

    def __call__(self, rewards: Tensor, masks: Tensor | None, bootstrap: Tensor) -> Tensor:
        """Targets ``(count, 1)`` from ``rewards``/``masks`` ``(count * L, 1)`` and ``bootstrap``
        ``(count, 1)``; ``masks=None`` bootstraps everywhere."""
        length = self.rollout_length
        count = bootstrap.shape[0]
        rewards = rewards.reshape(count, length) * self.reward_scale
        if length == 1:
            if masks is None:
                return rewards + self.gamma * bootstrap
            return rewards + self.gamma * masks.reshape(count, 1) * bootstrap
        if masks is None:
            masks_end = torch.ones_like(bootstrap)
        else:
            alive = masks.reshape(count, length).cumprod(dim=1)
            rewards = rewards * torch.cat([torch.ones_like(bootstrap), alive[:, :-1]], dim=1)
            masks_end = alive[:, -1:]
        matrix = self._gamma_matrix
        if matrix.device != rewards.device or matrix.dtype != rewards.dtype:
            matrix = self._gamma_matrix = matrix.to(device=rewards.device, dtype=rewards.dtype)
        return discount(rewards, bootstrap, masks=masks_end, gamma_matrix=matrix)


class TargetFollower:
    """Moves a target network toward its online network, with the parameter pairs found once.

    Args:
        target: The target network.
        source: The online network it follows.
    """

    def __init__(self, target: nn.Module, source: nn.Module) -> None:
        self.target_parameters = list(target.parameters())
        self.source_parameters = list(source.parameters())
        self.target_buffers = list(target.buffers())
        self.source_buffers = list(source.buffers())
        if len(self.target_parameters) != len(self.source_parameters) or len(
            self.target_buffers
        ) != len(self.source_buffers):
            raise ConfigurationError(
                "a target network must have the same parameters and buffers as the network it "
                "follows; build it as copy.deepcopy(q)"
            )

    def polyak_(self, tau: float) -> None:
        """Moves the target's parameters a fraction ``tau`` toward the source's; copies buffers.

        One foreach call does every parameter's ``lerp_`` (the same arithmetic, one kernel
        launch on CUDA instead of one per parameter).
        """
        with torch.no_grad():
            if self.target_parameters:
                torch._foreach_lerp_(self.target_parameters, self.source_parameters, tau)
            for target, source in zip(self.target_buffers, self.source_buffers, strict=True):
                target.copy_(source)

    def copy_(self) -> None:
        """Copies the source's parameters and buffers into the target."""
        with torch.no_grad():
            for target, source in zip(self.target_parameters, self.source_parameters, strict=True):
                target.copy_(source)
            for target, source in zip(self.target_buffers, self.source_buffers, strict=True):
                target.copy_(source)


def soft_update_from_to(source: nn.Module, target: nn.Module, tau: float) -> None:
    """Moves ``target`` a fraction ``tau`` toward ``source`` (upstream emote's Polyak update).

    Each target parameter becomes ``(1 - tau) * target + tau * source``; buffers (batch-norm
    statistics, say) are copied outright, as :class:`TargetFollower` does every step. Code that
    updates the same pair often should keep a :class:`TargetFollower`, which pairs the parameters
    once.

    Args:
        source: The online network.
        target: Its target copy, updated in place.
        tau: The fraction to move, in ``[0, 1]``; 1 copies the source.

    Raises:
        ConfigurationError: If ``tau`` is outside ``[0, 1]`` or the two networks do not have the
            same parameters and buffers.
    """
    tau = finite_number("soft_update_from_to", "tau", tau, 0.0, 1.0)
    TargetFollower(target, source).polyak_(tau)


def prepare_target(owner: str, target: nn.Module, source: nn.Module) -> None:
    """Starts ``target`` as a copy of ``source`` and stops it from ever collecting gradients.

    Raises:
        ConfigurationError: If the two networks do not have the same parameters.
    """
    check_distinct_networks(owner, target, source)
    try:
        target.load_state_dict(source.state_dict())
    except RuntimeError as error:
        raise ConfigurationError(
            f"{owner}: the target network does not match the network it tracks "
            f"({str(error).splitlines()[0]}); build the target as copy.deepcopy(q)"
        ) from error
    target.requires_grad_(False)


@contextmanager
def frozen(parameters: Sequence[Tensor]) -> Iterator[None]:
    """Within the block, ``parameters`` record no gradients (inputs still do).

    A policy loss back-propagates through the Q networks to the actions only; freezing their
    parameters skips the weight gradients it would otherwise compute and throw away.
    """
    changed = [p for p in parameters if p.requires_grad]
    for parameter in changed:
        parameter.requires_grad_(False)
    try:
        yield
    finally:
        for parameter in changed:
            parameter.requires_grad_(True)


__all__ = [
    "NStepTarget",
    "TargetFollower",
    "TargetNetworkCheckpoints",
    "TdErrorPublisher",
    "check_distinct_networks",
    "frozen",
    "importance_weighted_mean",
    "key_list",
    "load_target_states",
    "prepare_target",
    "priority_feedback",
    "sample_policy",
    "soft_update_from_to",
    "target_states",
    "window_count",
    "window_ends",
    "window_starts",
]
