"""GenRL as two registered algorithm families.

* ``genrl_vae`` trains the conditional action VAE offline from a store of demonstrations
  (``emote train genrl_vae --memory DEMOS --no-live``). Its acting network decodes the prior's
  latent: deterministically ``decoder(0, s)``, the demonstrations' most typical action in ``s``;
  sampled, ``decoder(z, s)`` with ``z ~ N(0, I)``.
* ``genrl_sac`` trains SAC in the latent space of a ``genrl_vae`` run (``vae_run``), with the
  decoder frozen: the policy picks latents in ``[-1, 1] * latent_scale``, the decoder turns them
  into actions, the replay table holds the latent of each step's action (the VAE's encoder
  labels what the agent did, warm-up included). It acts, is evaluated and exports as one network,
  policy and decoder together.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from emote_core.algorithms.genrl.export import latent_policy_graph
from emote_core.algorithms.genrl.losses import VAELoss
from emote_core.algorithms.genrl.memory import MemoryProxyWithEncoder
from emote_core.algorithms.genrl.scaling import DEFAULT_LATENT_SCALE, check_latent_scale
from emote_core.algorithms.genrl.vae import (
    DEFAULT_BETA,
    VariationalAutoencoder,
    check_width,
    make_vae,
)
from emote_core.algorithms.genrl.wrappers import DecoderWrapper, PolicyWrapper
from emote_core.algorithms.registry import (
    AlgorithmFamily,
    BuildContext,
    Networks,
    TrainingParts,
    register_algorithm,
)
from emote_core.algorithms.sac.family import (
    SacConfig,
    SacNetworks,
    SoftActorCritic,
    gaussian_agent,
    noise_input_graph,
)
from emote_core.callback import Callback
from emote_core.callbacks.checkpoint_files import load_latest_checkpoint
from emote_core.errors import CheckpointError, ConfigurationError
from emote_core.nn.inputs import observation_dim
from emote_core.onnx.graph import PolicyGraph
from emote_core.spaces import BoxSpace, DiscreteSpace, MDPSpace
from emote_core.utils.files import read_regular_file

VAE_ALGORITHM = "genrl_vae"
LATENT_SAC_ALGORITHM = "genrl_sac"
VAE_CALLBACK = "vae"
"""The name of the VAE's loss, whose network state in a checkpoint is the whole VAE."""
ACTING_CALLBACK = "genrl_acting"
"""The checkpointed state of ``genrl_sac``'s acting network: the latent policy and the decoder."""


def _continuous_actions(name: str, spaces: MDPSpace, env_id: str) -> None:
    if isinstance(spaces.actions, DiscreteSpace):
        raise ConfigurationError(
            f"{name} models continuous (Box) actions; '{env_id}' has discrete actions"
        )


@dataclass
class GenrlVaeConfig:
    """The conditional action VAE (the recipe table ``[genrl_vae]``)."""

    latent_dim: int | None = None
    """The width of the latent action; the action's width when unset."""
    hidden_dims: list[int] = field(default_factory=lambda: [256, 256])
    """Layer widths of the encoder and of the decoder."""
    beta: float = DEFAULT_BETA
    """The weight of the KL term against the reconstruction's squared error."""
    learning_rate: float = 1e-3
    """Adam learning rate of the VAE."""
    max_grad_norm: float = 10.0
    """Gradient norm clip of the VAE's loss."""

    def latent_width(self, spaces: MDPSpace) -> int:
        """``latent_dim``, or the width of the actions of ``spaces`` when unset."""
        return self.latent_dim or int(np.prod(spaces.actions.shape))


class PriorDecoding(nn.Module):
    """``(observation, epsilon) -> decoder(epsilon, observation)``: actions of the VAE's prior.

    ``epsilon`` of zeros is the prior's mean (the deterministic action). It holds the VAE's own
    encoder and decoder, so its state has the VAE's entries and a checkpoint's VAE loads into it.
    """

    def __init__(self, vae: VariationalAutoencoder) -> None:
        super().__init__()
        self.encoder = vae.encoder
        self.decoder = vae.decoder
        self.noise_dim = vae.latent_dim
        """The width of ``epsilon``: the latent's."""
        self.observation_dim = vae.observation_dim

    def forward(self, observation: Tensor, epsilon: Tensor | None = None) -> Tensor:
        """The ``(B, action_dim)`` actions of ``(B, latent_dim)`` latents (zeros when
        ``epsilon`` is ``None``).

        Raises:
            ConfigurationError: If an input has the wrong width.
        """
        if epsilon is None:
            epsilon = observation.new_zeros((observation.shape[0], self.noise_dim))
        check_width("PriorDecoding", "latents", epsilon, self.noise_dim)
        check_width("PriorDecoding", "observations", observation, self.observation_dim)
        return self.decoder(epsilon, observation)


@dataclass
class VaeNetworks(Networks):
    """The VAE, acting through its prior."""

    vae: VariationalAutoencoder
    prior_decoding: PriorDecoding

    @property
    def acting(self) -> nn.Module:
        """Decodes the prior's latents."""
        return self.prior_decoding


@register_algorithm
class GenrlVae(AlgorithmFamily):
    """GenRL's conditional action VAE, trained offline on demonstrations."""

    name: ClassVar[str] = VAE_ALGORITHM
    config_class: ClassVar[type] = GenrlVaeConfig
    summary: ClassVar[str] = "GenRL's action VAE, trained offline on demonstrations"
    acting_callback: ClassVar[str] = VAE_CALLBACK
    offline_only: ClassVar[bool] = True

    def validate(self, config: GenrlVaeConfig, *, source: str) -> None:
        where = f"{source}: '{self.name}"
        if config.latent_dim is not None and config.latent_dim < 1:
            raise ConfigurationError(
                f"{where}.latent_dim' must be a positive integer; got {config.latent_dim}"
            )
        if not config.hidden_dims or any(width < 1 for width in config.hidden_dims):
            raise ConfigurationError(
                f"{where}.hidden_dims' must be positive widths; got {config.hidden_dims}"
            )
        if not (np.isfinite(config.beta) and config.beta >= 0.0):
            raise ConfigurationError(f"{where}.beta' must be finite and >= 0; got {config.beta}")
        if not config.max_grad_norm > 0.0:
            raise ConfigurationError(
                f"{where}.max_grad_norm' must be above 0; got {config.max_grad_norm}"
            )

    def check_spaces(self, spaces: MDPSpace, *, env_id: str) -> None:
        _continuous_actions(self.name, spaces, env_id)

    def make_networks(self, config: GenrlVaeConfig, context: BuildContext) -> VaeNetworks:
        vae = make_vae(
            observation_dim=observation_dim(context.spaces),
            action_dim=int(np.prod(context.spaces.actions.shape)),
            latent_dim=config.latent_width(context.spaces), hidden_dims=config.hidden_dims,
            beta=config.beta,
        ).to(context.device)  # fmt: skip
        return VaeNetworks(vae=vae, prior_decoding=PriorDecoding(vae))

    def training_parts(
        self, config: GenrlVaeConfig, networks: VaeNetworks, context: BuildContext
    ) -> TrainingParts:
        optimizer = torch.optim.Adam(networks.vae.parameters(), lr=config.learning_rate)
        loss = VAELoss(
            vae=networks.vae, optimizer=optimizer, seed=context.seed,
            max_grad_norm=config.max_grad_norm, name=VAE_CALLBACK,
        )  # fmt: skip
        agent = self.acting_agent(config, networks, context, deterministic=False)
        return TrainingParts(callbacks=[loss], agent=agent)

    def acting_agent(
        self, config: GenrlVaeConfig, networks: VaeNetworks, context: BuildContext, *,
        deterministic: bool,
    ) -> Any:  # fmt: skip
        return gaussian_agent(networks.acting, context, deterministic=deterministic)

    def policy_graph(self, acting: nn.Module, spaces: MDPSpace) -> PolicyGraph:
        return noise_input_graph(
            acting, spaces, algorithm=self.name, noise_shape=(int(acting.noise_dim),)
        )


# -- latent SAC ---------------------------------------------------------------------------------


@dataclass
class GenrlSacConfig(SacConfig):
    """SAC in the latent action space of a ``genrl_vae`` run (the recipe table ``[genrl_sac]``:
    every ``[sac]`` key, and these)."""

    vae_run: str = ""
    """The ``genrl_vae`` run directory whose latest checkpoint's decoder the policy acts
    through (relative paths from the working directory)."""
    latent_scale: float = DEFAULT_LATENT_SCALE
    """``latent = latent_scale * policy_action``: how far into the prior the policy reaches."""


@dataclass
class GenrlSacNetworks(SacNetworks):
    """SAC's networks over latent actions, the VAE they decode through, and the acting chain."""

    vae: VariationalAutoencoder | None = None
    policy_wrapper: PolicyWrapper | None = None

    @property
    def acting(self) -> nn.Module:
        """The latent policy and the frozen decoder, as one network."""
        return self.policy_wrapper


class ActingNetworkState(Callback):
    """Keeps a network's weights in checkpoints under its own name (trains nothing).

    ``genrl_sac``'s acting network, the latent policy with the decoder, is what ``emote eval``
    and ``emote export onnx`` rebuild; the policy's loss saves only the policy.
    """

    def __init__(self, network: nn.Module, name: str = ACTING_CALLBACK) -> None:
        super().__init__(name=name)
        self.network = network

    def state_dict(self) -> dict[str, Any]:
        return {"network_state_dict": self.network.state_dict()}

    def load_state_dict(
        self,
        state_dict: dict[str, Any],
        load_network: bool = True,
        load_optimizer: bool = True,
        load_hparams: bool = True,
    ) -> None:
        if load_network and "network_state_dict" in state_dict:
            self.network.load_state_dict(state_dict["network_state_dict"])


_VAE_RUN_OPTION = f"'{LATENT_SAC_ALGORITHM}.vae_run'"
_RUN_FILE_BYTES = 64 * 2**20  # the cap emote_core.runs reads run files with (a layer above)


def read_vae_config(vae_run: str) -> GenrlVaeConfig:
    """The ``[genrl_vae]`` table of a ``genrl_vae`` run's recipe (its checkpoint is not read).

    Raises:
        ConfigurationError: If ``vae_run`` is unset, is not an emote run, or is a run of another
            algorithm.
    """
    option = _VAE_RUN_OPTION
    if not vae_run:
        raise ConfigurationError(
            f"{option} must name a {VAE_ALGORITHM} run (emote train {VAE_ALGORITHM} --memory "
            "DEMOS --no-live)"
        )
    run = Path(vae_run)
    rule = f"name a {VAE_ALGORITHM} run directory"
    try:  # a pipe or /dev/zero in its place is refused, not read
        record = json.loads(read_regular_file(run / "run.json", limit=_RUN_FILE_BYTES, rule=rule))
        recipe = tomllib.loads(
            read_regular_file(run / "recipe.toml", limit=_RUN_FILE_BYTES, rule=rule).decode()
        )
    except (OSError, ValueError, RecursionError):
        raise ConfigurationError(
            f"{option} '{vae_run}' is not an emote run directory (no readable run.json and "
            f"recipe.toml); name a {VAE_ALGORITHM} run"
        ) from None
    algorithm = recipe.get("algorithm")
    if not isinstance(record, dict) or algorithm != VAE_ALGORITHM:
        raise ConfigurationError(
            f"{option} '{vae_run}' is a run of '{algorithm}', not of {VAE_ALGORITHM}; train the "
            f"VAE first: emote train {VAE_ALGORITHM} --memory DEMOS --no-live"
        )
    table = recipe.get(VAE_ALGORITHM, {})
    names = {f.name for f in dataclasses.fields(GenrlVaeConfig)}
    try:
        return GenrlVaeConfig(**{k: v for k, v in table.items() if k in names})
    except TypeError as error:
        raise ConfigurationError(
            f"{option} '{vae_run}': its recipe does not read: {error}"
        ) from None


def read_vae_run(vae_run: str, spaces: MDPSpace, device: torch.device) -> VariationalAutoencoder:
    """The VAE of a ``genrl_vae`` run's latest checkpoint, for an environment of ``spaces``.

    Raises:
        ConfigurationError: As :func:`read_vae_config`; also if the run has no checkpoint that
            loads, or its VAE reads other observations or makes other actions than the
            environment's.
    """
    option = _VAE_RUN_OPTION
    config = read_vae_config(vae_run)
    try:
        _, checkpoint = load_latest_checkpoint(Path(vae_run))
        state = checkpoint["callbacks"][VAE_CALLBACK]["network_state_dict"]
    except (CheckpointError, KeyError, TypeError) as error:
        raise ConfigurationError(
            f"{option} '{vae_run}' has no VAE checkpoint to decode through ({error})"
        ) from None
    context = BuildContext(spaces=spaces, device=device)
    vae = GenrlVae().make_networks(config, context).vae
    try:
        vae.load_state_dict(state)
    except RuntimeError as error:
        raise ConfigurationError(
            f"{option} '{vae_run}': its VAE was trained for other observations or actions than "
            f"this environment's ({str(error).splitlines()[0]}); train it on demonstrations of "
            "this environment"
        ) from None
    return vae


def _latent_spaces(spaces: MDPSpace, latent_dim: int) -> MDPSpace:
    actions = BoxSpace(np.float32, (latent_dim,), low=-1.0, high=1.0)
    return dataclasses.replace(spaces, actions=actions)


@register_algorithm
class GenrlSac(SoftActorCritic):
    """SAC acting in the latent action space of a ``genrl_vae`` run, through its frozen
    decoder."""

    name: ClassVar[str] = LATENT_SAC_ALGORITHM
    config_class: ClassVar[type] = GenrlSacConfig
    summary: ClassVar[str] = "SAC in a GenRL VAE's latent action space (vae_run)"
    acting_callback: ClassVar[str] = ACTING_CALLBACK

    def validate(self, config: GenrlSacConfig, *, source: str) -> None:
        super().validate(config, source=source)
        try:
            check_latent_scale(f"'{self.name}'", config.latent_scale)
        except ConfigurationError as error:
            raise ConfigurationError(f"{source}: {error}") from None

    def table_spaces(self, config: GenrlSacConfig, spaces: MDPSpace) -> MDPSpace:
        """The environment's spaces with the latent policy's ``[-1, 1]`` actions (the latent's
        width from the VAE run's recipe; its checkpoint is read once, by the networks)."""
        return _latent_spaces(spaces, read_vae_config(config.vae_run).latent_width(spaces))

    def make_networks(self, config: GenrlSacConfig, context: BuildContext) -> GenrlSacNetworks:
        vae = read_vae_run(config.vae_run, context.spaces, context.device)
        latent = dataclasses.replace(context, spaces=_latent_spaces(context.spaces, vae.latent_dim))
        sac = super().make_networks(config, latent)
        wrapper = PolicyWrapper(
            sac.policy, DecoderWrapper(vae.decoder), latent_scale=config.latent_scale
        )
        fields = {f.name: getattr(sac, f.name) for f in dataclasses.fields(SacNetworks)}
        return GenrlSacNetworks(**fields, vae=vae, policy_wrapper=wrapper)

    def training_parts(
        self, config: GenrlSacConfig, networks: GenrlSacNetworks, context: BuildContext
    ) -> TrainingParts:
        latent = dataclasses.replace(
            context, spaces=_latent_spaces(context.spaces, networks.vae.latent_dim)
        )
        parts = super().training_parts(config, networks, latent)
        parts.callbacks.append(ActingNetworkState(networks.policy_wrapper))
        parts.agent = self.acting_agent(config, networks, context, deterministic=False)
        parts.memory_wrapper = functools.partial(
            MemoryProxyWithEncoder, encoder=networks.vae.encoder,
            latent_scale=config.latent_scale,
        )  # fmt: skip
        return parts

    def policy_graph(self, acting: nn.Module, spaces: MDPSpace) -> PolicyGraph:
        return latent_policy_graph(acting, spaces, algorithm=self.name)


__all__ = [
    "ACTING_CALLBACK",
    "ActingNetworkState",
    "GenrlSac",
    "GenrlSacConfig",
    "GenrlSacNetworks",
    "GenrlVae",
    "GenrlVaeConfig",
    "PriorDecoding",
    "VaeNetworks",
    "read_vae_config",
    "read_vae_run",
]
