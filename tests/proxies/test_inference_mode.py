"""inference_mode_of: eval mode and no gradients inside, every module's own mode back after."""

from __future__ import annotations

import torch
from torch import nn

from emote_core.proxies.base import inference_mode_of


def modes(network: nn.Module) -> list[bool]:
    return [module.training for module in network.modules()]


def test_every_module_is_in_eval_mode_inside_and_gets_its_own_mode_back() -> None:
    network = nn.Sequential(nn.Linear(3, 8), nn.Dropout(0.5), nn.Sequential(nn.Linear(8, 1)))
    network[2].eval()  # a part the user keeps in eval mode, such as a frozen encoder
    before = modes(network)
    assert before == [True, True, True, False, False]
    for _ in range(2):  # the second time from the cached tree
        with inference_mode_of(network):
            assert modes(network) == [False] * 5
            assert not torch.is_grad_enabled()
        assert modes(network) == before


def test_a_network_already_in_eval_mode_is_left_as_it_is() -> None:
    network = nn.Sequential(nn.Linear(3, 8), nn.Dropout(0.5)).eval()
    with inference_mode_of(network):
        assert modes(network) == [False, False, False]
    assert modes(network) == [False, False, False]


def test_a_part_replaced_after_the_first_act_is_switched_too() -> None:
    network = nn.Sequential(nn.Linear(3, 8), nn.Identity())
    with inference_mode_of(network):
        pass
    network[1] = nn.Dropout(0.9)  # new, in train mode: it would drop most activations
    inputs = torch.ones(4, 3)
    with inference_mode_of(network):
        assert not network[1].training
        first, second = network(inputs), network(inputs)
    torch.testing.assert_close(first, second)  # deterministic: the dropout is off
    assert network[1].training
    network.add_module("extra", nn.Dropout(0.9))
    with inference_mode_of(network):
        assert not network.extra.training


class KeepsEncoderFrozen(nn.Module):
    """A module whose own train() keeps its encoder in eval mode."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(3, 3)
        self.head = nn.Linear(3, 1)

    def train(self, mode: bool = True) -> KeepsEncoderFrozen:
        super().train(mode)
        self.encoder.eval()
        return self


def test_a_module_with_its_own_train_goes_through_it() -> None:
    network = KeepsEncoderFrozen().train()
    with inference_mode_of(network):
        assert modes(network) == [False, False, False]
    assert modes(network) == [True, False, True]
