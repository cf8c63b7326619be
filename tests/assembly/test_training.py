"""Sizes a recipe asks for are weighed against the machine before a training run allocates them."""

from __future__ import annotations

import pytest
import torch

from emote_core.assembly.builders import make_env, make_networks
from emote_core.assembly.training import TRAINING_COPIES, check_networks_fit
from emote_core.errors import ConfigurationError
from emote_core.recipes import load_recipe
from emote_core.utils import memory_budget

CPU = torch.device("cpu")


def spaces_of(recipe):
    env = make_env(recipe, num_envs=1)
    env.close()
    return env.spaces


def test_networks_too_large_for_the_machine_are_refused_naming_the_key_that_sizes_them() -> None:
    recipe = load_recipe("sac_hit_the_middle", ["sac.hidden_dims=[1000000, 1000000]"])
    with pytest.raises(ConfigurationError) as caught:
        check_networks_fit(recipe, spaces_of(recipe), CPU)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(
        "training the networks of sac.hidden_dims = [1000000, 1000000] needs about "
    )
    assert message.endswith(" GiB of RAM available; lower sac.hidden_dims")


def test_the_estimate_counts_the_parameters_the_networks_really_have(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recipe = load_recipe("sac_hit_the_middle", ["sac.hidden_dims=[48, 40]"])
    spaces = spaces_of(recipe)
    check_networks_fit(recipe, spaces, CPU)  # a few thousand parameters fit

    # SAC trains a policy and two Q networks, with a target copy of each Q network.
    networks = make_networks(recipe, spaces, CPU)
    modules = [networks.policy, networks.q1, networks.q2, *networks.targets.values()]
    real = {id(p): p for module in modules for p in module.parameters()}
    count = sum(p.numel() for p in real.values())
    needed = TRAINING_COPIES * 4 * count  # float32
    monkeypatch.setattr(memory_budget, "available_bytes", lambda device: needed - 1)
    with pytest.raises(ConfigurationError) as caught:
        check_networks_fit(recipe, spaces, CPU)
    message = str(caught.value)
    # The key changed from the recipe's defaults is the one named.
    assert message == (
        f"training the networks of sac.hidden_dims = [48, 40] needs about "
        f"{needed / (1 << 20):,.1f} MiB ({count:,} parameters, each held as weights, gradients "
        f"and two optimizer moments), more than the {(needed - 1) / (1 << 20):,.1f} MiB of RAM "
        "available; lower sac.hidden_dims"
    )
    monkeypatch.setattr(memory_budget, "available_bytes", lambda device: needed)
    check_networks_fit(recipe, spaces, CPU)
