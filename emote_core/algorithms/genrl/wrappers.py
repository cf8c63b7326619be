"""The VAE's halves as the rest of GenRL uses them, and the policy that acts through the decoder.

* :class:`EncoderWrapper`: an environment action and its observation -> the latent mean, without
  gradients (labelling what an agent did).
* :class:`DecoderWrapper`: a latent and an observation -> an environment action, through a frozen
  decoder: gradients reach the latent, never the decoder's parameters.
* :class:`PolicyWrapper`: a policy over ``[-1, 1]`` policy actions (SAC's
  :class:`~emote_core.nn.policies.GaussianMlpPolicy` with ``action_dim = latent_dim``), scaled
  into latents and decoded into environment actions.

Policy actions and latents are related by ``latent = latent_scale * policy_action``
(:mod:`emote_core.algorithms.genrl.scaling`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from emote_core.algorithms.genrl.scaling import check_latent_scale, policy_to_latent
from emote_core.algorithms.genrl.vae import check_width, declared_width
from emote_core.errors import ConfigurationError

ConditionFn = Callable[[Tensor], Tensor]
"""Picks what conditions the VAE out of a ``(B, ...)`` flattened observation batch."""


def _condition(condition_fn: ConditionFn | None, observation: Tensor) -> Tensor:
    return observation if condition_fn is None else condition_fn(observation)


class EncoderWrapper(nn.Module):
    """``(action, observation) -> mean``: the encoder's posterior mean, without gradients.

    Args:
        encoder: ``encoder(action, condition) -> (mean, log_var)`` (a VAE's ``encoder``).
            Widths it declares (``action_dim``, ``observation_dim``, ``latent_dim``
            attributes) are checked on every call.
        condition_fn: Turns the observation into the encoder's condition (``None``: the
            observation itself), as upstream emote's second argument.
    """

    def __init__(self, encoder: nn.Module, condition_fn: ConditionFn | None = None) -> None:
        super().__init__()
        self.encoder = encoder
        self.condition_fn = condition_fn
        self.action_dim = declared_width(encoder, "action_dim")
        self.observation_dim = declared_width(encoder, "observation_dim")
        self.latent_dim = declared_width(encoder, "latent_dim")

    def forward(self, action: Tensor, observation: Tensor) -> Tensor:
        """The ``(B, latent_dim)`` latent means of ``(B, action_dim)`` actions taken in ``(B,
        observation_dim)`` flattened observations.

        Raises:
            ConfigurationError: If an input has a width other than the encoder's.
        """
        owner = type(self).__name__
        condition = _condition(self.condition_fn, observation)
        check_width(owner, "actions", action, self.action_dim)
        check_width(owner, "observations", condition, self.observation_dim)
        with torch.no_grad():
            mean, _ = self.encoder(action, condition)
        return mean


class DecoderWrapper(nn.Module):
    """``(latent, observation) -> action`` through a frozen decoder.

    The decoder is frozen in place (``requires_grad_(False)``, and kept in eval mode): gradients
    flow through it to the latent, never into its parameters. Train the VAE first; a
    :class:`~emote_core.algorithms.genrl.losses.VAELoss` refuses a VAE whose decoder is frozen.

    It decodes the latent it is given, unscaled (:class:`PolicyWrapper`'s ``latent_scale``
    scales policy actions into latents).

    Args:
        decoder: ``decoder(latent, condition) -> action`` (a VAE's ``decoder``).
        condition_fn: Turns the observation into the decoder's condition (``None``: the
            observation itself), as upstream emote's second argument.
        latent_dim: The width of its latents; read from the decoder's ``latent_dim`` (or
            upstream's ``input_size``) when left out.

    Raises:
        ConfigurationError: If the latent width is neither given nor declared, or the two
            disagree.
    """

    def __init__(
        self,
        decoder: nn.Module,
        condition_fn: ConditionFn | None = None,
        *,
        latent_dim: int | None = None,
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        declared = declared_width(decoder, "latent_dim")
        if declared is None:
            declared = declared_width(decoder, "input_size")  # upstream emote's decoders
        if latent_dim is None:
            latent_dim = declared
        if isinstance(latent_dim, bool) or not isinstance(latent_dim, int) or latent_dim < 1:
            raise ConfigurationError(
                f"{owner}: latent_dim must be a positive integer; got {latent_dim!r} — pass "
                "latent_dim=... for a decoder without a latent_dim attribute"
            )
        if declared is not None and declared != latent_dim:
            raise ConfigurationError(
                f"{owner}: latent_dim is {latent_dim} but the decoder's is {declared}; leave "
                "latent_dim out to use the decoder's"
            )
        decoder.requires_grad_(False)
        decoder.eval()
        self.decoder = decoder
        self.condition_fn = condition_fn
        self.latent_dim = latent_dim
        self.observation_dim = declared_width(decoder, "observation_dim")
        self.action_dim = declared_width(decoder, "action_dim")

    def train(self, mode: bool = True) -> DecoderWrapper:
        """Sets the mode of the wrapper; the frozen decoder stays in eval mode."""
        super().train(mode)
        self.decoder.eval()
        return self

    def forward(self, latent: Tensor, observation: Tensor) -> Tensor:
        """The ``(B, action_dim)`` actions of ``(B, latent_dim)`` latents in ``(B,
        observation_dim)`` flattened observations.

        Raises:
            ConfigurationError: If an input has a width other than the decoder's.
        """
        owner = type(self).__name__
        condition = _condition(self.condition_fn, observation)
        check_width(owner, "latents", latent, self.latent_dim)
        check_width(owner, "observations", condition, self.observation_dim)
        return self.decoder(latent, condition)


class PolicyWrapper(nn.Module):
    """A policy that chooses in latent space and acts in the environment's action space.

    ``forward(observation, epsilon)`` is ``decoder(latent_scale * policy.act(observation,
    epsilon), observation)``: the policy's ``[-1, 1]`` action (``tanh(mean + std * epsilon)``,
    the deterministic ``tanh(mean)`` without ``epsilon``) is scaled into a latent and decoded.
    It acts the same in train and eval mode; SAC's losses train ``policy`` itself, in policy
    space, on the latents :class:`~emote_core.algorithms.genrl.memory.MemoryProxyWithEncoder`
    stores.

    Args:
        policy: A policy over ``latent_dim`` policy actions in ``[-1, 1]`` with
            ``act(observation, epsilon)`` (a :class:`~emote_core.nn.policies.GaussianMlpPolicy`),
            or one whose eval-mode ``forward(observation, epsilon)`` gives the action.
        decoder_wrapper: The frozen decoder.
        latent_scale: ``latent = latent_scale * policy_action``; finite and > 0.

    Raises:
        ConfigurationError: If ``decoder_wrapper`` is not a :class:`DecoderWrapper`, the policy's
            ``action_dim`` is not the decoder's ``latent_dim``, or ``latent_scale`` is not
            finite and positive.
    """

    def __init__(
        self, policy: nn.Module, decoder_wrapper: DecoderWrapper, *, latent_scale: float
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        if not isinstance(decoder_wrapper, DecoderWrapper):
            raise ConfigurationError(
                f"{owner}: decoder_wrapper must be a DecoderWrapper (it freezes the decoder); got "
                f"{type(decoder_wrapper).__name__} — wrap it: DecoderWrapper(vae.decoder)"
            )
        self.latent_scale = check_latent_scale(owner, latent_scale)
        policy_dim = declared_width(policy, "action_dim")
        if policy_dim is not None and policy_dim != decoder_wrapper.latent_dim:
            raise ConfigurationError(
                f"{owner}: the policy has action_dim {policy_dim} but the decoder's latent_dim is "
                f"{decoder_wrapper.latent_dim}; build the policy with "
                f"action_dim={decoder_wrapper.latent_dim}"
            )
        self.policy = policy
        self.decoder_wrapper = decoder_wrapper
        self.latent_dim = decoder_wrapper.latent_dim
        """The width of the policy's actions and of ``epsilon``."""
        self.noise_dim = self.latent_dim
        """The width of ``epsilon`` (agent proxies and exports draw noise this wide)."""
        self.action_dim = decoder_wrapper.action_dim
        """The width of the environment actions it returns (when the decoder declares it)."""

    def policy_actions(self, observation: Tensor, epsilon: Tensor | None = None) -> Tensor:
        """The policy's ``(B, latent_dim)`` actions in ``[-1, 1]``, before scaling."""
        act = getattr(self.policy, "act", None)
        if callable(act):
            return act(observation, epsilon)
        outputs = self.policy(observation, epsilon)
        return outputs[0] if isinstance(outputs, tuple | list) else outputs

    def forward(self, observation: Tensor, epsilon: Tensor | None = None) -> Tensor:
        """The ``(B, action_dim)`` environment actions for ``(B, observation_dim)`` flattened
        observations, with ``(B, latent_dim)`` standard normal ``epsilon`` (``None`` or zeros:
        the deterministic action)."""
        latent = policy_to_latent(self.policy_actions(observation, epsilon), self.latent_scale)
        return self.decoder_wrapper(latent, observation)

    def sample(self, observation: Tensor, epsilon: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Decoded actions of a sample of the policy, with the sample's log-probabilities.

        Returns:
            ``(B, action_dim)`` actions and the ``(B, 1)`` log-probabilities of the policy
            actions behind them (in policy space).

        Raises:
            ConfigurationError: If the policy has no ``sample(observation, epsilon)``.
        """
        sample = getattr(self.policy, "sample", None)
        if not callable(sample):
            raise ConfigurationError(
                f"{type(self).__name__}.sample needs a policy with sample(observation, epsilon) "
                f"returning (actions, log_probs); {type(self.policy).__name__} has none — use a "
                "GaussianMlpPolicy"
            )
        policy_actions, log_probs = sample(observation, epsilon)
        latent = policy_to_latent(policy_actions, self.latent_scale)
        return self.decoder_wrapper(latent, observation), log_probs


__all__ = ["ConditionFn", "DecoderWrapper", "EncoderWrapper", "PolicyWrapper"]
