"""flatten_observation: the one tensor networks get from a dict observation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from emote_core.errors import ConfigurationError
from emote_core.nn.inputs import flatten_observation, observation_dim
from emote_core.spaces import BoxSpace, DictSpace


def test_keys_are_flattened_and_joined_in_sorted_order_by_default() -> None:
    observation = {"b": torch.ones(2, 2, 2), "a": torch.zeros(2, 3)}
    flat = flatten_observation(observation)
    assert flat.shape == (2, 7)
    assert flat[:, :3].eq(0).all() and flat[:, 3:].eq(1).all()
    chosen = flatten_observation(observation, ["b", "a"])
    assert chosen[:, :4].eq(1).all() and chosen[:, 4:].eq(0).all()


def test_a_single_image_key_passes_unflattened() -> None:
    image = torch.rand(3, 8, 8, 1)
    observation = {"image": image, "speed": torch.rand(3, 1)}
    assert flatten_observation(observation, ["image"], flatten=False) is image
    with pytest.raises(ConfigurationError, match="one observation entry"):
        flatten_observation(observation, flatten=False)


def test_missing_keys_name_what_is_there() -> None:
    with pytest.raises(ConfigurationError, match=r"\['velocity'\].*\['obs'\]"):
        flatten_observation({"obs": torch.zeros(1, 2)}, ["velocity"])
    with pytest.raises(ConfigurationError, match="not the string"):
        flatten_observation({"obs": torch.zeros(1, 2)}, "obs")


def test_observation_dim_matches_the_flattened_width() -> None:
    space = DictSpace({"a": BoxSpace(np.float32, (3,)), "b": BoxSpace(np.float32, (2, 2))})
    assert observation_dim(space) == 7
    assert observation_dim(space, ["b"]) == 4


def test_float64_observations_reach_the_networks_as_float32() -> None:
    # MuJoCo environments observe float64; tables keep it, the networks are float32.
    single = flatten_observation({"obs": torch.ones(2, 4, dtype=torch.float64)})
    joined = flatten_observation({"a": torch.ones(2, 1, dtype=torch.float64),
                                  "b": torch.ones(2, 2)})  # fmt: skip
    assert single.dtype == joined.dtype == torch.float32 and joined.shape == (2, 3)
    pixels = torch.zeros(2, 3, 3, dtype=torch.uint8)
    assert flatten_observation({"obs": pixels}, flatten=False).dtype == torch.uint8


def test_uint8_frames_and_integer_entries_reach_mlps_as_unscaled_float32() -> None:
    # A pixel env's frames stay uint8 in tables; an MLP over them gets float32 values 0..255.
    frames = torch.tensor([[[0, 255]], [[7, 9]]], dtype=torch.uint8)
    joined = flatten_observation({"frames": frames, "count": torch.tensor([[3], [4]])})
    assert joined.dtype == torch.float32
    assert joined.tolist() == [[3.0, 0.0, 255.0], [4.0, 7.0, 9.0]]
