"""Random generators into checkpoints and back."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from emote_core.errors import CheckpointError
from emote_core.utils.random_state import capture, generators_of, restore


def through_a_checkpoint(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_numpy_and_torch_generators_draw_the_same_after_a_round_trip() -> None:
    numbers, noise = np.random.default_rng(3), torch.Generator().manual_seed(4)
    numbers.random(5), torch.randn(5, generator=noise)
    state = through_a_checkpoint(capture({"numbers": numbers, "noise": noise}))
    expected = numbers.random(3), torch.randn(3, generator=noise)

    fresh_numbers, fresh_noise = np.random.default_rng(0), torch.Generator()
    restore({"numbers": fresh_numbers, "noise": fresh_noise}, state, owner="test")
    assert np.array_equal(fresh_numbers.random(3), expected[0])
    assert torch.equal(torch.randn(3, generator=fresh_noise), expected[1])


def test_a_missing_or_mismatched_state_is_refused_by_name() -> None:
    state = capture({"numbers": np.random.default_rng(1)})
    with pytest.raises(CheckpointError, match=r"test's generators \['other'\]"):
        restore({"other": np.random.default_rng(1)}, state, owner="test")
    with pytest.raises(CheckpointError, match=r"test's generators \['numbers'\]"):
        restore({"numbers": torch.Generator()}, state, owner="test")
    left = torch.Generator().manual_seed(5)
    expected = left.get_state()
    assert restore({"numbers": left}, state, owner="test", strict=False) == ["numbers"]
    assert torch.equal(left.get_state(), expected)


def test_objects_name_their_generators_and_others_have_none() -> None:
    import gymnasium

    from emote_core.proxies import RandomAgentProxy

    agent = RandomAgentProxy(action_space=gymnasium.spaces.Box(-1, 1, (2,)), seed=1)
    assert list(generators_of(agent, "warmup.")) == ["warmup.actions"]
    assert generators_of(object()) == {}
