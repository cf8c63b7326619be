"""The dynamics model: a network that predicts the next observation and the reward, with the
normalisation and the delta encoding of its inputs and targets around it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from torch import Tensor, nn

from emote_core.errors import ConfigurationError
from emote_core.models.normalizer import Normalizer
from emote_core.utils.checks import positive_int


class DynamicsNetwork(Protocol):
    """What :class:`DynamicModel` needs of its network (an ``nn.Module``), as
    :class:`~emote_core.models.EnsembleOfGaussian` and
    :class:`~emote_core.models.DeterministicModel` provide it. Inputs and targets are normalised.
    """

    in_size: int
    out_size: int
    ensemble_size: int
    num_elites: int
    deterministic: bool

    def bootstrap(
        self, model_in: Tensor, target: Tensor, *, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]:
        """The rows each member trains on, ``(ensemble_size, B, in_size)`` and
        ``(ensemble_size, B, out_size)``; all the training step's random draws are here."""
        ...

    def member_loss(
        self, member_in: Tensor, member_target: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The training loss of :meth:`bootstrap`'s rows and detached statistics of it."""
        ...

    def member_mse(self, model_in: Tensor, target: Tensor) -> Tensor:
        """``(ensemble_size,)``: each member's mean squared error on the rows as given."""
        ...

    def set_elites(self, scores: Tensor) -> None:
        """Keeps the ``num_elites`` members with the lowest scores for :meth:`sample`."""
        ...

    def sample(self, model_in: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """``(B, out_size)``: one prediction per row."""
        ...


class DynamicModel(nn.Module):
    """Predicts the next observation (and the reward) of a transition with a network.

    The network maps the normalised (processed) observation and action to the normalised
    observation delta (``next_observation`` itself for ``no_delta_list``), then the reward with
    ``learned_rewards``. The normalisers are submodules, saved with the weights.

    Args:
        model: The network, an ``nn.Module`` such as an
            :class:`~emote_core.models.EnsembleOfGaussian`. When it declares ``in_size`` and
            ``out_size``, they must be the model input's width and ``observation_size`` (+1 with
            learned rewards); a network that declares neither is used unchecked.
        observation_size: The width of an observation; ``None`` reads it from the network's
            ``out_size``.
        action_size: The width of an action; ``None`` reads it from the network's ``in_size``.
        learned_rewards: Whether the model predicts the reward as the target's last column.
        obs_process_fn: Maps observations ``(B, observation_size)`` to the features the network
            sees (called once on a zero row to find their width).
        no_delta_list: Observation dimensions predicted absolutely rather than as deltas.

    Raises:
        ConfigurationError: If ``model`` is not a module, a size is not a positive integer, is
            left out for a network that declares none, or does not match the network's, or a
            ``no_delta_list`` entry is not a dimension.
    """

    delta_mask: Tensor

    def __init__(
        self,
        *,
        model: DynamicsNetwork,
        observation_size: int | None = None,
        action_size: int | None = None,
        learned_rewards: bool = True,
        obs_process_fn: Callable[[Tensor], Tensor] | nn.Module | None = None,
        no_delta_list: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise ConfigurationError(
                f"DynamicModel's model must be a torch.nn.Module; got {type(model).__name__} — "
                "use an EnsembleOfGaussian or a DeterministicModel"
            )
        self.learned_rewards = bool(learned_rewards)
        in_size, out_size = getattr(model, "in_size", None), getattr(model, "out_size", None)
        declared = isinstance(in_size, int) and isinstance(out_size, int)
        if (observation_size is None or action_size is None) and not declared:
            raise ConfigurationError(
                f"DynamicModel needs observation_size and action_size for a network that "
                f"declares no in_size/out_size ({type(model).__name__}); got observation_size="
                f"{observation_size!r}, action_size={action_size!r} — pass both"
            )
        if observation_size is None:
            observation_size = int(out_size) - (1 if self.learned_rewards else 0)
        self.observation_size = positive_int("DynamicModel", "observation_size", observation_size)
        self.model = model
        self.obs_process_fn = obs_process_fn
        device = _device_of(model)
        feature_size = observation_size
        if obs_process_fn is not None:
            with torch.no_grad():
                zero = torch.zeros(1, observation_size, device=device)
                feature_size = int(obs_process_fn(zero).shape[-1])
        if action_size is None:
            action_size = int(in_size) - feature_size
        self.action_size = positive_int("DynamicModel", "action_size", action_size)
        self.input_size = feature_size + action_size
        self.target_size = observation_size + (1 if learned_rewards else 0)
        if declared and (in_size, out_size) != (self.input_size, self.target_size):
            raise ConfigurationError(
                f"DynamicModel needs a network with in_size {self.input_size} (observation "
                f"features {feature_size} + action {action_size}) and out_size "
                f"{self.target_size} (observation {observation_size}"
                f"{' + reward 1' if learned_rewards else ''}); got in_size {in_size} and "
                f"out_size {out_size} — build the network with those sizes"
            )
        absolute = list(no_delta_list or [])
        for dim in absolute:
            if isinstance(dim, bool) or not isinstance(dim, int) or not 0 <= dim < observation_size:
                raise ConfigurationError(
                    f"DynamicModel's no_delta_list must hold observation dimensions in "
                    f"[0, {observation_size}); got {absolute!r}"
                )
        self.no_delta_list = sorted(set(absolute))
        mask = torch.ones(observation_size, dtype=torch.bool, device=device)
        mask[self.no_delta_list] = False
        # Not persistent: it follows from the constructor's arguments, not from training.
        self.register_buffer("delta_mask", mask, persistent=False)
        self.input_normalizer = Normalizer(self.input_size).to(device)
        self.target_normalizer = Normalizer(self.target_size).to(device)

    @property
    def ensemble_size(self) -> int:
        """The network's number of members."""
        return int(self.model.ensemble_size)

    @property
    def num_elites(self) -> int:
        """How many members :meth:`sample` draws from."""
        return int(self.model.num_elites)

    def set_elites(self, scores: Tensor) -> None:
        """Keeps the members with the lowest ``scores`` (``(ensemble_size,)``), e.g. the
        :meth:`member_mse` of held-out transitions, for :meth:`sample`."""
        self.model.set_elites(scores)

    def get_model_input(self, observation: Tensor, action: Tensor) -> Tensor:
        """The raw (not normalised) model input: processed observation, then action.

        Args:
            observation: ``(B, observation_size)``.
            action: ``(B, action_size)``.

        Returns:
            ``(B, input_size)``.

        Raises:
            ConfigurationError: If a width is wrong.
        """
        if observation.shape[-1] != self.observation_size or action.shape[-1] != self.action_size:
            raise ConfigurationError(
                f"DynamicModel takes observations (B, {self.observation_size}) and actions "
                f"(B, {self.action_size}); got {tuple(observation.shape)} and "
                f"{tuple(action.shape)}"
            )
        features = observation if self.obs_process_fn is None else self.obs_process_fn(observation)
        # The network is float32; environments may give float64 (MuJoCo's observations).
        return torch.cat([features.float(), action.float()], dim=-1)

    def _target(
        self, observation: Tensor, next_observation: Tensor, reward: Tensor | None
    ) -> Tensor:
        if next_observation.shape != observation.shape:
            raise ConfigurationError(
                f"DynamicModel takes next observations of the observations' shape "
                f"{tuple(observation.shape)}; got {tuple(next_observation.shape)}"
            )
        observation, next_observation = observation.float(), next_observation.float()
        target = torch.where(self.delta_mask, next_observation - observation, next_observation)
        if not self.learned_rewards:
            return target
        if reward is None:
            raise ConfigurationError(
                "DynamicModel was built with learned_rewards=True, so its batches need a reward; "
                "got None — pass reward of shape (B,) or (B, 1), or build with "
                "learned_rewards=False"
            )
        rows = observation.shape[0]
        if reward.shape == (rows,):
            reward = reward.unsqueeze(-1)
        if reward.shape != (rows, 1):
            raise ConfigurationError(
                f"DynamicModel takes rewards of shape ({rows},) or ({rows}, 1); got "
                f"{tuple(reward.shape)}"
            )
        return torch.cat([target, reward.to(target.dtype)], dim=-1)

    def process_batch(
        self,
        observation: Tensor,
        next_observation: Tensor,
        action: Tensor,
        reward: Tensor | None = None,
        *,
        update_normalizers: bool = False,
    ) -> tuple[Tensor, Tensor]:
        """The normalised model input and target of a batch of transitions.

        Args:
            observation: ``(B, observation_size)``.
            next_observation: ``(B, observation_size)``.
            action: ``(B, action_size)``.
            reward: ``(B,)`` or ``(B, 1)``; required with learned rewards, ignored without.
            update_normalizers: Merge the batch's raw inputs and targets into the normalisers
                first.

        Returns:
            ``(B, input_size)`` and ``(B, target_size)``.

        Raises:
            ConfigurationError: If a shape is wrong or a learned reward is missing.
        """
        model_in = self.get_model_input(observation, action)
        target = self._target(observation, next_observation, reward)
        if update_normalizers:
            self.input_normalizer.update(model_in)
            self.target_normalizer.update(target)
        return self.input_normalizer.normalize(model_in), self.target_normalizer.normalize(target)

    def training_rows(
        self,
        observation: Tensor,
        next_observation: Tensor,
        action: Tensor,
        reward: Tensor | None = None,
        *,
        generator: torch.Generator | None = None,
        update_normalizers: bool = True,
    ) -> tuple[Tensor, Tensor]:
        """The rows each member of the network trains on, in normalised units: the first half of
        :meth:`loss`, with its random draws, its checks and the normalisers' update.

        Args:
            observation: ``(B, observation_size)``.
            next_observation: ``(B, observation_size)``.
            action: ``(B, action_size)``.
            reward: ``(B,)`` or ``(B, 1)``; required with learned rewards.
            generator: The CPU generator of the network's bootstrap.
            update_normalizers: Merge the batch into the normalisers first.

        Returns:
            ``(ensemble_size, B, input_size)`` and ``(ensemble_size, B, target_size)``.
        """
        model_in, target = self.process_batch(
            observation, next_observation, action, reward, update_normalizers=update_normalizers
        )
        return self.model.bootstrap(model_in, target, generator=generator)

    def member_loss(
        self, member_in: Tensor, member_target: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The second half of :meth:`loss`: the network's loss on :meth:`training_rows`' rows and
        its detached statistics. Nothing here synchronises with the host or draws random
        numbers, so it compiles as one graph."""
        return self.model.member_loss(member_in, member_target)

    def loss(
        self,
        observation: Tensor,
        next_observation: Tensor,
        action: Tensor,
        reward: Tensor | None = None,
        *,
        generator: torch.Generator | None = None,
        update_normalizers: bool = True,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The network's training loss on a batch of transitions, in normalised units.

        Args:
            observation: ``(B, observation_size)``.
            next_observation: ``(B, observation_size)``.
            action: ``(B, action_size)``.
            reward: ``(B,)`` or ``(B, 1)``; required with learned rewards.
            generator: The CPU generator of the network's bootstrap.
            update_normalizers: Merge the batch into the normalisers first.

        Returns:
            The scalar loss and the network's detached statistics (``"mse"``, ...).
        """
        rows = self.training_rows(
            observation, next_observation, action, reward,
            generator=generator, update_normalizers=update_normalizers,
        )  # fmt: skip
        return self.member_loss(*rows)

    def member_mse(
        self,
        observation: Tensor,
        next_observation: Tensor,
        action: Tensor,
        reward: Tensor | None = None,
    ) -> Tensor:
        """Each member's mean squared error in normalised target units, ``(ensemble_size,)``.

        With fitted normalisers, a member's value is the fraction of the target's variance it
        does not explain (0 is perfect, about 1 is no better than the mean). The normalisers are
        not updated, so held-out transitions stay held out.
        """
        model_in, target = self.process_batch(observation, next_observation, action, reward)
        return self.model.member_mse(model_in, target)

    def sample(
        self, observation: Tensor, action: Tensor, *, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """Draws the next observation and the reward of each transition from the network.

        Args:
            observation: ``(B, observation_size)``.
            action: ``(B, action_size)``.
            generator: The CPU generator of the network's choice of members and noise.

        Returns:
            The next observation ``(B, observation_size)``, of the observation's dtype, and the
            reward ``(B, 1)`` (float32), or ``None`` without learned rewards; without gradient.
        """
        with torch.no_grad():
            model_in = self.input_normalizer.normalize(self.get_model_input(observation, action))
            predicted = self.target_normalizer.denormalize(
                self.model.sample(model_in, generator)  # positional, as upstream's networks take it
            )
            change = predicted[:, : self.observation_size].to(observation.dtype)
            next_observation = torch.where(self.delta_mask, observation + change, change)
            reward = predicted[:, self.observation_size :] if self.learned_rewards else None
            return next_observation, reward

    def extra_repr(self) -> str:
        return (
            f"observation_size={self.observation_size}, action_size={self.action_size}, "
            f"learned_rewards={self.learned_rewards}, no_delta_list={self.no_delta_list}"
        )


def _device_of(module: nn.Module) -> torch.device:
    for tensor in module.parameters():
        return tensor.device
    for tensor in module.buffers():
        return tensor.device
    return torch.device("cpu")


__all__ = ["DynamicModel", "DynamicsNetwork"]
