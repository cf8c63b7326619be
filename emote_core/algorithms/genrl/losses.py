"""VAELoss: trains GenRL's action VAE on a data group of demonstrated (observation, action)s."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor

from emote_core.algorithms.base import key_list
from emote_core.algorithms.genrl.vae import VaeLossTerms, VariationalAutoencoder, standard_normal
from emote_core.callbacks.loss import LossCallback
from emote_core.errors import ConfigurationError
from emote_core.nn.inputs import flatten_observation
from emote_core.proxies.base import as_generator
from emote_core.utils.random_state import capture, restore


class VAELoss(LossCallback):
    """One optimisation step of the VAE per batch: reconstruction MSE plus ``beta`` times the KL.

    Reads ``observation`` (flattened with ``observation_keys``) and ``actions`` of its data
    group, and computes :meth:`VariationalAutoencoder.loss` with latent noise drawn from its own
    generator (seeded by ``seed``; saved in checkpoints). Logs ``loss/<name>`` (the total, as
    every loss) and its terms ``<name>/reconstruction`` and ``<name>/kl``.

    Args:
        vae: The VAE to train; its parameters must not be frozen.
        optimizer: The optimizer over the VAE's parameters.
        observation_keys: The observation keys the VAE reads (``None``: all, sorted).
        condition_fn: Turns the flattened observation into the VAE's condition (``None``: the
            observation itself), as the wrappers' ``condition_fn``.
        seed: Seeds the latent noise; ``None`` draws from fresh entropy.
        lr_schedule: A torch learning-rate scheduler stepped after every update.
        max_grad_norm: Clip the gradient norm to this (``None``: no clipping).
        data_group: The data group of demonstrations read (``default``: the run's memory, as an
            offline run over a store of demonstrations has it).
        name: Unique name; keys logs and checkpoints.
        **kwargs: Passed to :class:`~emote_core.callbacks.loss.LossCallback`.

    Raises:
        ConfigurationError: If ``vae`` is not a :class:`VariationalAutoencoder` or some of its
            parameters are frozen (a :class:`~emote_core.algorithms.genrl.wrappers.DecoderWrapper`
            froze its decoder).
    """

    compiled_methods: ClassVar[tuple[str, ...]] = ("loss_terms",)

    def __init__(
        self,
        *,
        vae: VariationalAutoencoder,
        optimizer: torch.optim.Optimizer,
        observation_keys: Sequence[str] | None = None,
        condition_fn: Callable[[Tensor], Tensor] | None = None,
        seed: int | None = None,
        lr_schedule: torch.optim.lr_scheduler.LRScheduler | None = None,
        max_grad_norm: float | None = 10.0,
        data_group: str = "default",
        name: str = "vae",
        **kwargs: Any,
    ) -> None:
        if not isinstance(vae, VariationalAutoencoder):
            raise ConfigurationError(
                f"{name}: vae must be a VariationalAutoencoder; got {type(vae).__name__}"
            )
        frozen = [n for n, p in vae.named_parameters() if not p.requires_grad]
        if frozen:
            raise ConfigurationError(
                f"{name}: {len(frozen)} of the VAE's parameters are frozen (first: '{frozen[0]}'; "
                "a DecoderWrapper freezes its decoder) — train the VAE before wrapping its decoder"
            )
        super().__init__(
            name=name, network=vae, optimizer=optimizer, lr_schedule=lr_schedule,
            max_grad_norm=max_grad_norm, data_group=data_group, **kwargs,
        )  # fmt: skip
        self.vae = vae
        self.observation_keys = key_list(observation_keys)
        self.condition_fn = condition_fn
        self._generator = as_generator(seed)

    def loss(self, observation: dict[str, Tensor], actions: Tensor) -> Tensor:
        """``mse(decoder(z, s), a) + beta * mean KL(q(z | a, s) || N(0, I))`` over the batch."""
        inputs = flatten_observation(observation, self.observation_keys)
        if self.condition_fn is not None:
            inputs = self.condition_fn(inputs)
        actions = actions.reshape(actions.shape[0], -1).to(inputs.dtype)
        if actions.shape[0] != inputs.shape[0]:
            raise ConfigurationError(
                f"{self.name}: the batch has {inputs.shape[0]} observations and "
                f"{actions.shape[0]} actions; the data group '{self.data_group}' must hold one "
                "action per observation"
            )
        # Drawn here, eagerly, so that a compiled loss_terms need not trace the generator.
        noise = standard_normal(
            (inputs.shape[0], self.vae.latent_dim), dtype=inputs.dtype, device=inputs.device,
            generator=self._generator,
        )  # fmt: skip
        terms = self.loss_terms(actions, inputs, noise)
        self.log_scalar(f"{self.name}/reconstruction", terms.reconstruction.detach())
        self.log_scalar(f"{self.name}/kl", terms.kl.detach())
        return terms.loss

    def loss_terms(self, actions: Tensor, inputs: Tensor, noise: Tensor) -> VaeLossTerms:
        """The VAE's loss and its terms on flattened inputs with the latent noise drawn: what
        ``training.compile`` compiles."""
        return self.vae.loss(actions, inputs, noise=noise)

    def random_generators(self) -> dict[str, torch.Generator]:
        """The latent noise's generator."""
        return {"latent_noise": self._generator}

    def state_dict(self) -> dict[str, Any]:
        """The VAE, optimizer, schedule and noise generator's states, and the logs."""
        state = super().state_dict()
        state["random_state"] = capture(self.random_generators())
        return state

    def load_state_dict(
        self,
        state_dict: dict[str, Any],
        load_network: bool = True,
        load_optimizer: bool = True,
        load_hparams: bool = True,
    ) -> None:
        """Restores what :meth:`state_dict` saved, as selected by the flags (a checkpoint
        without the generator's state leaves it as it is)."""
        super().load_state_dict(state_dict, load_network, load_optimizer, load_hparams)
        restore(self.random_generators(), state_dict.get("random_state", {}), owner=self.name,
                strict=False)  # fmt: skip


__all__ = ["VAELoss"]
