"""A conditional variational autoencoder over actions: the latent action space of GenRL.

The encoder gives ``q(z | a, s) = N(mean, exp(log_var))``; the decoder turns a latent and the
observation back into an action. The loss is the mean squared reconstruction error plus
``beta`` times the KL to ``N(0, I)`` (summed over latent dimensions, in nats), so small
``beta`` (:data:`DEFAULT_BETA`) keeps the latent informative.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from emote_core.errors import ConfigurationError
from emote_core.nn.encoders import Activation, MlpEncoder
from emote_core.utils.checks import non_negative_number, positive_int

LOG_VAR_MIN = -20.0
"""The encoder's log-variance is clamped below to this (a standard deviation of ``4.5e-5``)."""
LOG_VAR_MAX = 10.0
"""The encoder's log-variance is clamped above to this, so ``exp(log_var)`` cannot overflow."""
DEFAULT_BETA = 0.01
"""The KL weight :func:`make_vae` uses when none is given (see the module docstring)."""
DEFAULT_HIDDEN_DIMS = (256, 256)
"""The layer widths of the default encoder and decoder."""


class VaeOutput(NamedTuple):
    """What :meth:`VariationalAutoencoder.forward` returns, each ``(B, ...)``."""

    reconstruction: Tensor
    """The decoded action of the sampled latent, ``(B, action_dim)``."""
    mean: Tensor
    """The mean of ``q(z | a, s)``, ``(B, latent_dim)``."""
    log_var: Tensor
    """The log-variance of ``q(z | a, s)``, ``(B, latent_dim)``."""
    latent: Tensor
    """The reparameterised sample ``mean + exp(log_var / 2) * noise``, ``(B, latent_dim)``."""


class VaeLossTerms(NamedTuple):
    """The loss of a batch and its two terms, each a scalar tensor."""

    loss: Tensor
    """``reconstruction + beta * kl``: what is minimised."""
    reconstruction: Tensor
    """The mean squared error between decoded and given actions (over rows and dimensions)."""
    kl: Tensor
    """The mean over rows of ``KL(q(z | a, s) || N(0, I))`` in nats (summed over latent dims)."""


def gaussian_kl(mean: Tensor, log_var: Tensor) -> Tensor:
    """``KL(N(mean, diag(exp(log_var))) || N(0, I))`` per row.

    ``0.5 * sum_j (exp(log_var_j) + mean_j^2 - 1 - log_var_j)``, in nats.

    Args:
        mean: ``(B, latent_dim)`` means.
        log_var: ``(B, latent_dim)`` log-variances.

    Returns:
        ``(B,)`` divergences, each >= 0.
    """
    return 0.5 * (log_var.exp() + mean.square() - 1.0 - log_var).sum(dim=-1)


def vae_loss(
    reconstruction: Tensor, actions: Tensor, mean: Tensor, log_var: Tensor, *, beta: float
) -> VaeLossTerms:
    """The VAE's loss: reconstruction MSE plus ``beta`` times the KL to the prior.

    Args:
        reconstruction: ``(B, action_dim)`` decoded actions.
        actions: ``(B, action_dim)`` actions that were encoded.
        mean: ``(B, latent_dim)`` means of ``q(z | a, s)``.
        log_var: ``(B, latent_dim)`` log-variances of ``q(z | a, s)``.
        beta: The KL weight, finite and >= 0.

    Returns:
        The loss and both terms.

    Raises:
        ConfigurationError: If ``beta`` is negative or not finite.
    """
    beta = non_negative_number("vae_loss", "beta", beta)
    reconstruction_error = F.mse_loss(reconstruction, actions)
    kl = gaussian_kl(mean, log_var).mean()
    return VaeLossTerms(reconstruction_error + beta * kl, reconstruction_error, kl)


def standard_normal(
    shape: Sequence[int],
    *,
    dtype: torch.dtype,
    device: torch.device,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Standard normal noise of ``shape`` on ``device``, drawn by ``generator`` on its own
    device and then moved (the global generator when ``None``)."""
    if generator is None:
        return torch.randn(tuple(shape), dtype=dtype, device=device)
    return torch.randn(tuple(shape), generator=generator, device=generator.device, dtype=dtype).to(
        device
    )


def reparameterise(
    mean: Tensor,
    log_var: Tensor,
    *,
    generator: torch.Generator | None = None,
    noise: Tensor | None = None,
) -> Tensor:
    """A sample ``mean + exp(log_var / 2) * noise`` that gradients flow through.

    Args:
        mean: ``(B, latent_dim)`` means.
        log_var: ``(B, latent_dim)`` log-variances.
        generator: Draws the standard normal noise (:func:`standard_normal`).
        noise: The standard normal noise, drawn already (``generator`` is then unused).
    """
    if noise is None:
        noise = standard_normal(
            mean.shape, dtype=mean.dtype, device=mean.device, generator=generator
        )
    return mean + (0.5 * log_var).exp() * noise


class MlpActionEncoder(nn.Module):
    """``(action, observation) -> (mean, log_var)``: an MLP over the concatenation, then one
    linear layer to the mean and log-variance of the latent (clamped to
    ``[LOG_VAR_MIN, LOG_VAR_MAX]``).

    Args:
        action_dim: The width of an action.
        observation_dim: The width of the flattened observation.
        latent_dim: The width of the latent.
        hidden_dims: The MLP's layer widths.
        activation: Builds the activation after each layer.

    Raises:
        ConfigurationError: If a width is not a positive integer.
    """

    def __init__(
        self,
        *,
        action_dim: int,
        observation_dim: int,
        latent_dim: int,
        hidden_dims: Sequence[int] = DEFAULT_HIDDEN_DIMS,
        activation: Activation = nn.ReLU,
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        self.action_dim = positive_int(owner, "action_dim", action_dim)
        self.observation_dim = positive_int(owner, "observation_dim", observation_dim)
        self.latent_dim = positive_int(owner, "latent_dim", latent_dim)
        self.body = MlpEncoder(
            input_dim=action_dim + observation_dim, hidden_dims=hidden_dims, activation=activation
        )
        self.head = nn.Linear(self.body.output_dim, 2 * latent_dim)

    def forward(self, action: Tensor, observation: Tensor) -> tuple[Tensor, Tensor]:
        """``(mean, log_var)``, each ``(B, latent_dim)``, for ``(B, action_dim)`` actions taken
        in ``(B, observation_dim)`` observations."""
        features = self.body(torch.cat([action, observation], dim=-1))
        mean, log_var = self.head(features).chunk(2, dim=-1)
        return mean, log_var.clamp(LOG_VAR_MIN, LOG_VAR_MAX)


class MlpActionDecoder(nn.Module):
    """``(latent, observation) -> action``: an MLP over the concatenation, then one linear layer
    to the action, squashed by ``tanh`` into ``[-1, 1]`` (emote's bounded actions) unless
    ``squash`` is false.

    Args:
        latent_dim: The width of the latent.
        observation_dim: The width of the flattened observation.
        action_dim: The width of an action.
        hidden_dims: The MLP's layer widths.
        activation: Builds the activation after each layer.
        squash: Bound the actions to ``[-1, 1]`` with ``tanh`` (for unbounded actions: false).

    Raises:
        ConfigurationError: If a width is not a positive integer.
    """

    def __init__(
        self,
        *,
        latent_dim: int,
        observation_dim: int,
        action_dim: int,
        hidden_dims: Sequence[int] = DEFAULT_HIDDEN_DIMS,
        activation: Activation = nn.ReLU,
        squash: bool = True,
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        self.latent_dim = positive_int(owner, "latent_dim", latent_dim)
        self.observation_dim = positive_int(owner, "observation_dim", observation_dim)
        self.action_dim = positive_int(owner, "action_dim", action_dim)
        self.squash = bool(squash)
        self.body = MlpEncoder(
            input_dim=latent_dim + observation_dim, hidden_dims=hidden_dims, activation=activation
        )
        self.head = nn.Linear(self.body.output_dim, action_dim)

    def forward(self, latent: Tensor, observation: Tensor) -> Tensor:
        """``(B, action_dim)`` actions for ``(B, latent_dim)`` latents in ``(B,
        observation_dim)`` observations."""
        actions = self.head(self.body(torch.cat([latent, observation], dim=-1)))
        return torch.tanh(actions) if self.squash else actions


def declared_width(module: nn.Module, what: str) -> int | None:
    """The integer ``what`` attribute of ``module`` (``latent_dim``, say), or ``None``."""
    value = getattr(module, what, None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def check_width(owner: str, what: str, tensor: Tensor, expected: int | None) -> None:
    """Refuses a ``(B, W)`` input whose width ``W`` is not ``expected`` (when known).

    Nothing is checked while the TorchScript exporter traces: the widths of an exported network
    are fixed when it is built, and a check would only be recorded as a constant.

    Raises:
        ConfigurationError: Naming the input, the width given and the width expected.
    """
    if torch.jit.is_tracing():
        return
    if tensor.dim() != 2:
        raise ConfigurationError(
            f"{owner} takes {what} as (batch, width) tensors; got shape {tuple(tensor.shape)} — "
            "flatten the observation first (emote_core.nn.inputs.flatten_observation)"
        )
    if expected is not None and tensor.shape[-1] != expected:
        raise ConfigurationError(
            f"{owner} takes {what} of width {expected}; got width {tensor.shape[-1]} — pass the "
            f"{what} the VAE was built for"
        )


class VariationalAutoencoder(nn.Module):
    """A conditional VAE of actions given observations (see the module docstring).

    Args:
        encoder: ``encoder(action, observation) -> (mean, log_var)``, each ``(B, latent_dim)``
            (:class:`MlpActionEncoder`, say).
        decoder: ``decoder(latent, observation) -> action`` (:class:`MlpActionDecoder`).
        latent_dim: The width of the latent; left out, the one the parts declare
            (``latent_dim``, or upstream emote's ``encoder.output_size``/``decoder.input_size``).
        beta: The weight of the KL term in :meth:`loss`, finite and >= 0.
        device: Where the VAE runs: the parts are moved there (``None``: left where they are).

    Raises:
        ConfigurationError: If ``latent_dim`` is not a positive integer (or is left out and the
            parts declare none), ``beta`` is negative, or the encoder and decoder declare (as
            ``latent_dim``, ``observation_dim`` and ``action_dim`` attributes) widths that
            disagree with each other or ``latent_dim``.
    """

    def __init__(
        self,
        encoder: nn.Module,
        decoder: nn.Module,
        *,
        latent_dim: int | None = None,
        beta: float,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        if latent_dim is None:
            latent_dim = _declared_latent_dim(owner, encoder, decoder)
        self.latent_dim = positive_int(owner, "latent_dim", latent_dim)
        self.beta = non_negative_number(owner, "beta", beta)
        for part, module in (("encoder", encoder), ("decoder", decoder)):
            declared = declared_width(module, "latent_dim")
            if declared is not None and declared != latent_dim:
                raise ConfigurationError(
                    f"{owner}: the {part} has latent_dim {declared} but the VAE has latent_dim "
                    f"{latent_dim}; build both parts with the VAE's latent_dim"
                )
        widths: dict[str, int | None] = {}
        for what in ("observation_dim", "action_dim"):
            encoded, decoded = declared_width(encoder, what), declared_width(decoder, what)
            if encoded is not None and decoded is not None and encoded != decoded:
                raise ConfigurationError(
                    f"{owner}: the encoder has {what} {encoded} but the decoder has {decoded}; "
                    "build both parts for the same observations and actions"
                )
            widths[what] = encoded if encoded is not None else decoded
        self.encoder = encoder
        self.decoder = decoder
        self.observation_dim: int | None = widths["observation_dim"]
        """The width of the flattened observation, when the parts declare it."""
        self.action_dim: int | None = widths["action_dim"]
        """The width of an action, when the parts declare it."""
        if device is not None:
            self.to(device)

    def encode(self, action: Tensor, observation: Tensor) -> tuple[Tensor, Tensor]:
        """``(mean, log_var)`` of ``q(z | action, observation)``, each ``(B, latent_dim)``.

        Raises:
            ConfigurationError: If an input or the encoder's output has the wrong width.
        """
        owner = type(self).__name__
        check_width(owner, "actions", action, self.action_dim)
        check_width(owner, "observations", observation, self.observation_dim)
        mean, log_var = self.encoder(action, observation)
        if mean.shape[-1] != self.latent_dim or log_var.shape != mean.shape:
            raise ConfigurationError(
                f"{owner}: the encoder gave means of shape {tuple(mean.shape)} and log-variances "
                f"of shape {tuple(log_var.shape)}; both must be (batch, {self.latent_dim})"
            )
        return mean, log_var

    def decode(self, latent: Tensor, observation: Tensor) -> Tensor:
        """The ``(B, action_dim)`` actions of ``(B, latent_dim)`` latents.

        Raises:
            ConfigurationError: If an input has the wrong width.
        """
        owner = type(self).__name__
        check_width(owner, "latents", latent, self.latent_dim)
        check_width(owner, "observations", observation, self.observation_dim)
        return self.decoder(latent, observation)

    def forward(
        self,
        action: Tensor,
        observation: Tensor,
        *,
        generator: torch.Generator | None = None,
        noise: Tensor | None = None,
    ) -> VaeOutput:
        """Encodes, samples a latent by reparameterisation and decodes it.

        Args:
            action: ``(B, action_dim)`` actions.
            observation: ``(B, observation_dim)`` flattened observations they were taken in.
            generator: Draws the latent's noise (the global generator when ``None``).
            noise: The latent's ``(B, latent_dim)`` standard normal noise, drawn already
                (``generator`` is then unused).

        Returns:
            The reconstruction, the posterior's mean and log-variance, and the sampled latent.
        """
        mean, log_var = self.encode(action, observation)
        latent = reparameterise(mean, log_var, generator=generator, noise=noise)
        return VaeOutput(self.decode(latent, observation), mean, log_var, latent)

    def loss(
        self,
        action: Tensor,
        observation: Tensor,
        *,
        generator: torch.Generator | None = None,
        noise: Tensor | None = None,
    ) -> VaeLossTerms:
        """:func:`vae_loss` of a forward pass (:meth:`forward`'s arguments), with this VAE's
        ``beta``."""
        output = self(action, observation, generator=generator, noise=noise)
        return vae_loss(output.reconstruction, action, output.mean, output.log_var, beta=self.beta)


def _declared_latent_dim(owner: str, encoder: nn.Module, decoder: nn.Module) -> int:
    """The latent width the parts declare: ``latent_dim``, else upstream emote's sizes."""
    candidates = {
        width
        for width in (
            declared_width(encoder, "latent_dim"), declared_width(decoder, "latent_dim"),
            declared_width(encoder, "output_size"), declared_width(decoder, "input_size"),
        )
        if width is not None
    }  # fmt: skip
    if len(candidates) != 1:
        found = "none" if not candidates else f"different widths {sorted(candidates)}"
        raise ConfigurationError(
            f"{owner}: latent_dim was left out and the encoder and decoder declare {found} (as "
            "latent_dim, or encoder.output_size and decoder.input_size); pass latent_dim=..."
        )
    return candidates.pop()


def make_vae(
    *,
    observation_dim: int,
    action_dim: int,
    latent_dim: int,
    hidden_dims: Sequence[int] = DEFAULT_HIDDEN_DIMS,
    beta: float = DEFAULT_BETA,
    activation: Activation = nn.ReLU,
    squash: bool = True,
) -> VariationalAutoencoder:
    """A VAE of :class:`MlpActionEncoder` and :class:`MlpActionDecoder` with the same layers.

    Args:
        observation_dim: The width of the flattened observation
            (:func:`~emote_core.nn.inputs.observation_dim`).
        action_dim: The width of an action.
        latent_dim: The width of the latent.
        hidden_dims: The layer widths of both MLPs.
        beta: The KL weight.
        activation: Builds the activation after each layer.
        squash: Bound decoded actions to ``[-1, 1]`` (emote's continuous actions are).

    Raises:
        ConfigurationError: If a width is not a positive integer or ``beta`` is negative.
    """
    shared: dict[str, Any] = {
        "observation_dim": observation_dim, "action_dim": action_dim, "latent_dim": latent_dim,
        "hidden_dims": hidden_dims, "activation": activation,
    }  # fmt: skip
    return VariationalAutoencoder(
        MlpActionEncoder(**shared),
        MlpActionDecoder(**shared, squash=squash),
        latent_dim=latent_dim,
        beta=beta,
    )


__all__ = [
    "DEFAULT_BETA",
    "DEFAULT_HIDDEN_DIMS",
    "LOG_VAR_MAX",
    "LOG_VAR_MIN",
    "MlpActionDecoder",
    "MlpActionEncoder",
    "VaeLossTerms",
    "VaeOutput",
    "VariationalAutoencoder",
    "check_width",
    "declared_width",
    "gaussian_kl",
    "make_vae",
    "reparameterise",
    "standard_normal",
    "vae_loss",
]
