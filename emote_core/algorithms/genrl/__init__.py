"""GenRL's library pieces: a conditional VAE that turns demonstrated actions into a latent action
space, and the wrappers that let SAC learn and act in it.

* :mod:`.vae`: the VAE (:class:`VariationalAutoencoder`, :func:`make_vae`), its loss terms and
  the KL to the prior;
* :mod:`.losses`: :class:`VAELoss`, which trains the VAE on a data group of demonstrations;
* :mod:`.scaling`: the one convention between the policy's ``[-1, 1]`` actions and latents,
  ``latent = latent_scale * policy_action``;
* :mod:`.wrappers`: the encoder for labelling, the frozen decoder, and the policy that acts
  through it (:class:`PolicyWrapper`);
* :mod:`.memory`: :class:`MemoryProxyWithEncoder`, which stores latent actions in the replay
  memory;
* :mod:`.export`: the acting module (latent policy and decoder, one network) and its ONNX graph;
* :mod:`.family`: the registered families ``genrl_vae`` (the VAE, trained offline on a store of
  demonstrations) and ``genrl_sac`` (SAC in the latent space of a ``genrl_vae`` run).
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
