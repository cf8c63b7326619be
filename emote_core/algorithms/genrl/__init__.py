"""GenRL's library pieces: a conditional VAE that turns demonstrated actions into a latent action
space, and the wrappers that let SAC learn and act in it.

Modules: :mod:`.vae` (the VAE), :mod:`.losses` (:class:`VAELoss`), :mod:`.scaling` (policy
actions to latents), :mod:`.wrappers` (:class:`PolicyWrapper`), :mod:`.memory`
(:class:`MemoryProxyWithEncoder`), :mod:`.export` (the acting module) and :mod:`.family` (the
``genrl_vae`` and ``genrl_sac`` families).
"""

from __future__ import annotations

from emote_core.algorithms.genrl.export import (
    GENRL_ALGORITHM,
    LatentPolicyActing,
    latent_policy_graph,
)
from emote_core.algorithms.genrl.family import (
    GenrlSac,
    GenrlSacConfig,
    GenrlVae,
    GenrlVaeConfig,
    read_vae_run,
)
from emote_core.algorithms.genrl.losses import VAELoss
from emote_core.algorithms.genrl.memory import MemoryProxyWithEncoder
from emote_core.algorithms.genrl.scaling import (
    DEFAULT_LATENT_SCALE,
    check_latent_scale,
    latent_to_policy,
    policy_to_latent,
)
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
from emote_core.algorithms.genrl.wrappers import DecoderWrapper, EncoderWrapper, PolicyWrapper

__all__ = [
    "DEFAULT_BETA",
    "DEFAULT_LATENT_SCALE",
    "GENRL_ALGORITHM",
    "DecoderWrapper",
    "EncoderWrapper",
    "GenrlSac",
    "GenrlSacConfig",
    "GenrlVae",
    "GenrlVaeConfig",
    "LatentPolicyActing",
    "MemoryProxyWithEncoder",
    "MlpActionDecoder",
    "MlpActionEncoder",
    "PolicyWrapper",
    "VAELoss",
    "VaeLossTerms",
    "VaeOutput",
    "VariationalAutoencoder",
    "check_latent_scale",
    "gaussian_kl",
    "latent_policy_graph",
    "latent_to_policy",
    "make_vae",
    "policy_to_latent",
    "read_vae_run",
    "reparameterise",
    "vae_loss",
]
