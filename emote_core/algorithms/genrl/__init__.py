"""GenRL's library pieces: a conditional VAE that turns demonstrated actions into a latent action
space, and the wrappers that let SAC learn and act in it.

* :mod:`.vae`: the VAE (:class:`VariationalAutoencoder`, :func:`make_vae`), its loss terms and
  the KL to the prior;

Nothing here is registered as an algorithm family yet.
"""

from __future__ import annotations

from emote_core.algorithms.genrl.vae import (
    DEFAULT_BETA,
    MlpActionDecoder,
    MlpActionEncoder,
    VaeLossTerms,
    VaeOutput,
    VariationalAutoencoder,
    gaussian_kl,
    make_vae,
    reparameterise,
    vae_loss,
)

__all__ = [
    "DEFAULT_BETA",
    "MlpActionDecoder",
    "MlpActionEncoder",
    "VaeLossTerms",
    "VaeOutput",
    "VariationalAutoencoder",
    "gaussian_kl",
    "make_vae",
    "reparameterise",
    "vae_loss",
]
