"""How the offline families' networks start: bc's and cql's with PyTorch's default layers, as
d3rlpy's, iql's as upstream emote's (orthogonal, as SAC's); each table's ``initialization``
chooses."""

from __future__ import annotations

import pytest
import torch

from emote_core.algorithms.bc import BcConfig, BehaviourCloning
from emote_core.algorithms.cql import ConservativeQLearning, CqlConfig
from emote_core.algorithms.iql import ImplicitQLearning, IqlConfig
from emote_core.algorithms.registry import BuildContext
from emote_core.algorithms.sac import SacConfig
from emote_core.algorithms.sac.family import SoftActorCritic
from emote_core.nn import LayerInit
from tests.algorithms.offline import BOX, CPU


def last_layers(networks) -> list[torch.nn.Linear]:
    """Every network's last linear layer (the ones upstream's start zeroes the biases of)."""
    modules = [m for m in vars(networks).values() if isinstance(m, torch.nn.Module)]
    layers = []
    for module in modules:
        linears = [m for m in module.modules() if isinstance(m, torch.nn.Linear)]
        if linears:
            layers.append(linears[-1])
    return layers


@pytest.mark.parametrize(
    ("family", "config", "default"),
    [
        (BehaviourCloning(), BcConfig, LayerInit.TORCH),
        (ImplicitQLearning(), IqlConfig, LayerInit.ORTHOGONAL),
        (ConservativeQLearning(), CqlConfig, LayerInit.TORCH),
    ],
    ids=["bc", "iql", "cql"],
)
def test_offline_families_start_as_their_table_says(family, config, default) -> None:
    assert config().initialization is default
    context = BuildContext(spaces=BOX, device=CPU)
    for start, zero_biases in ((LayerInit.TORCH, False), (LayerInit.ORTHOGONAL, True)):
        networks = family.make_networks(config(hidden_dims=[16], initialization=start), context)
        layers = last_layers(networks)
        assert layers, family.name
        assert all(bool(layer.bias.eq(0).all()) == zero_biases for layer in layers), start


def test_sac_keeps_upstreams_orthogonal_start_by_default() -> None:
    assert SacConfig().initialization is LayerInit.ORTHOGONAL
    networks = SoftActorCritic().make_networks(
        SacConfig(hidden_dims=[16]), BuildContext(spaces=BOX, device=CPU)
    )
    assert all(layer.bias.eq(0).all() for layer in last_layers(networks))
