"""Adaptors: what each does to a sampled batch, alone and at the end of a real table's sample."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from emote_core.errors import ConfigurationError
from emote_core.memory.adaptors import (
    Adaptor,
    DictObsAdaptor,
    KeyCastAdaptor,
    KeyScaleAdaptor,
    RandomShift,
    SamplePreprocessor,
    TerminalAdaptor,
)
from emote_core.memory.builders import DictObsMemoryTable
from emote_core.spaces import BoxSpace, DictSpace, MDPSpace
from emote_core.typing import EpisodeState


def flat_batch(rows: int = 6) -> dict:
    return {
        "pos": torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2),
        "next_pos": torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2) + 100,
        "vel": torch.ones(rows, 1),
        "next_vel": torch.full((rows, 1), 2.0),
        "actions": torch.zeros(rows, 1),
        "rewards": torch.arange(rows, dtype=torch.float32).reshape(rows, 1),
    }


# DictObsAdaptor.


def test_dict_obs_adaptor_nests_observations_and_removes_flat_columns() -> None:
    batch = flat_batch()
    pos, next_pos = batch["pos"], batch["next_pos"]
    out = DictObsAdaptor(["pos", "vel"])(batch, 3, 2)
    assert sorted(out) == ["actions", "next_observation", "observation", "rewards"]
    assert out["observation"]["pos"] is pos
    assert out["next_observation"]["pos"] is next_pos
    assert torch.equal(out["next_observation"]["vel"], torch.full((6, 1), 2.0))


def test_dict_obs_adaptor_renames_with_output_keys() -> None:
    out = DictObsAdaptor(["pos", "vel"], output_keys=["position", "velocity"])(flat_batch(), 3, 2)
    assert sorted(out["observation"]) == ["position", "velocity"]
    assert sorted(out["next_observation"]) == ["position", "velocity"]
    assert "pos" not in out and "next_vel" not in out


def test_dict_obs_adaptor_without_next_columns_leaves_next_observation_out() -> None:
    batch = {"pos": torch.zeros(4, 2), "actions": torch.zeros(4, 1)}
    out = DictObsAdaptor(["pos"])(batch, 4, 1)
    assert "next_observation" not in out
    assert out["observation"]["pos"].shape == (4, 2)


def test_dict_obs_adaptor_with_next_false_gathers_only_observations() -> None:
    batch = flat_batch()
    next_pos = batch["next_pos"]
    out = DictObsAdaptor(["pos", "vel"], with_next=False)(batch, 3, 2)
    assert "next_observation" not in out
    assert sorted(out["observation"]) == ["pos", "vel"]
    assert out["next_pos"] is next_pos and "next_vel" in out  # left as flat entries


def test_dict_obs_adaptor_with_next_true_requires_the_next_columns() -> None:
    batch = {"pos": torch.zeros(4, 2), "actions": torch.zeros(4, 1)}
    with pytest.raises(ConfigurationError, match=r"not \['next_pos'\]; with_next=True needs every"):
        DictObsAdaptor(["pos"], with_next=True)(batch, 4, 1)
    out = DictObsAdaptor(["pos", "vel"], with_next=True)(flat_batch(), 3, 2)
    assert sorted(out["next_observation"]) == ["pos", "vel"]
    with pytest.raises(ConfigurationError, match="with_next must be true, false or None"):
        DictObsAdaptor(["pos"], with_next="yes")  # type: ignore[arg-type]


def test_dict_obs_adaptor_rejects_next_columns_for_only_some_keys() -> None:
    batch = flat_batch()
    del batch["next_vel"]
    with pytest.raises(ConfigurationError, match="next_vel"):
        DictObsAdaptor(["pos", "vel"])(batch, 3, 2)


def test_dict_obs_adaptor_names_a_missing_observation_column() -> None:
    with pytest.raises(ConfigurationError, match=r"'speed'.*batch keys"):
        DictObsAdaptor(["pos", "speed"])(flat_batch(), 3, 2)


@pytest.mark.parametrize(
    ("keys", "outputs", "message"),
    [
        (["pos", "vel"], ["only_one"], "one output key per observation key"),
        (["pos", "pos"], None, "repeat"),
        ([], None, "at least one"),
    ],
)
def test_dict_obs_adaptor_rejects_bad_key_lists(keys, outputs, message) -> None:
    with pytest.raises(ConfigurationError, match=message):
        DictObsAdaptor(keys, output_keys=outputs)


# KeyScaleAdaptor and KeyCastAdaptor.


def test_key_scale_adaptor_scales_only_its_key_and_keeps_float32() -> None:
    batch = flat_batch()
    out = KeyScaleAdaptor(np.float64(0.5), "rewards")(batch, 6, 1)
    assert out["rewards"].dtype == torch.float32
    assert torch.allclose(out["rewards"].flatten(), torch.arange(6) * 0.5)
    assert torch.equal(out["pos"], torch.arange(12, dtype=torch.float32).reshape(6, 2))


def test_key_scale_adaptor_scales_per_dimension() -> None:
    batch = {"pos": torch.ones(3, 2)}
    out = KeyScaleAdaptor([2.0, -1.0], "pos")(batch, 3, 1)
    assert torch.equal(out["pos"], torch.tensor([[2.0, -1.0]] * 3))


def test_key_scale_adaptor_names_a_missing_key() -> None:
    with pytest.raises(ConfigurationError, match="KeyScaleAdaptor reads batch key 'reward'"):
        KeyScaleAdaptor(2.0, "reward")(flat_batch(), 6, 1)


@pytest.mark.parametrize("dtype", [torch.float32, np.float32, "float32"])
def test_key_cast_adaptor_casts_images_to_float(dtype) -> None:
    images = torch.arange(24, dtype=torch.uint8).reshape(2, 3, 2, 2)
    out = KeyCastAdaptor(dtype, "image")({"image": images}, 2, 1)
    assert out["image"].dtype == torch.float32
    assert torch.equal(out["image"], images.float())


def test_key_cast_adaptor_rejects_dtypes_torch_cannot_hold() -> None:
    with pytest.raises(ConfigurationError, match="torch cannot hold"):
        KeyCastAdaptor(object, "image")


# TerminalAdaptor.


def test_terminal_adaptor_zeroes_masks_only_where_a_done_meets_a_terminal_flag() -> None:
    dones = torch.tensor([[0.0], [1.0], [0.0], [1.0]])
    flags = torch.tensor([[1.0], [1.0], [0.0], [0.0]])  # a mid-episode flag must not count
    batch = {
        "dones": dones,
        "masks": torch.tensor([[1.0], [0.0], [1.0], [0.0]]),  # from the end states: overridden
        "next_terminal": flags,
        "terminal": torch.zeros(4, 1),
    }
    out = TerminalAdaptor()(batch, 2, 2)
    assert out["masks"].tolist() == [[1.0], [0.0], [1.0], [1.0]]
    assert out["masks"].dtype == torch.float32
    assert "terminal" not in out and "next_terminal" not in out


def test_terminal_adaptor_applies_a_per_window_flag_to_its_window() -> None:
    # upstream's terminal tag: one value per window (count rows), here windows of 2 steps
    batch = {
        "dones": torch.tensor([[0.0], [1.0], [0.0], [1.0]]),
        "masks": torch.ones(4, 1),
        "terminal": torch.tensor([1.0, 0.0]),
    }
    out = TerminalAdaptor(value_key="terminal", target_key="masks")(batch, 2, 2)
    assert out["masks"].tolist() == [[1.0], [0.0], [1.0], [1.0]]


def test_terminal_adaptor_rejects_a_flag_of_neither_row_count() -> None:
    batch = {"dones": torch.zeros(4, 1), "masks": torch.ones(4, 1), "next_terminal": torch.ones(3)}
    with pytest.raises(ConfigurationError, match="per-step or a tag column"):
        TerminalAdaptor()(batch, 2, 2)


# SamplePreprocessor and RandomShift.


def reference_shift(image: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """The image moved by (dy, dx) with edge pixels repeated, computed the slow, obvious way."""
    height, width = image.shape[-2:]
    out = torch.empty_like(image)
    for i in range(height):
        for j in range(width):
            out[..., i, j] = image[
                ..., min(max(i + dy, 0), height - 1), min(max(j + dx, 0), width - 1)
            ]
    return out


def shifts_of(original: torch.Tensor, shifted: torch.Tensor, pad: int) -> list[tuple[int, int]]:
    """For each image, a (dy, dx) within pad that reproduces it (an error if none does)."""
    found = []
    for image, result in zip(original, shifted, strict=True):
        matches = [
            (dy, dx)
            for dy in range(-pad, pad + 1)
            for dx in range(-pad, pad + 1)
            if torch.equal(reference_shift(image, dy, dx), result)
        ]
        assert matches, "a shifted image is not a translation of its original"
        found.append(matches[0])
    return found


def test_random_shift_translates_each_image_with_edges_repeated() -> None:
    images = torch.randint(0, 255, (16, 3, 9, 9), dtype=torch.uint8)
    shifted = RandomShift(pad=2, seed=0)(images)
    assert shifted.shape == images.shape and shifted.dtype == torch.uint8
    shifts = shifts_of(images, shifted, pad=2)
    assert len(set(shifts)) > 1, "every image got the same shift"


def test_random_shift_is_reproducible_from_its_seed() -> None:
    images = torch.rand(8, 1, 6, 6)
    assert torch.equal(RandomShift(pad=2, seed=3)(images), RandomShift(pad=2, seed=3)(images))
    assert not torch.equal(RandomShift(pad=2, seed=3)(images), RandomShift(pad=2, seed=4)(images))


def test_random_shift_rejects_bad_arguments() -> None:
    with pytest.raises(ConfigurationError, match="pad >= 0"):
        RandomShift(pad=-1)
    with pytest.raises(ConfigurationError, match="height, width"):
        RandomShift()(torch.zeros(4, 4))


def test_sample_preprocessor_augments_chosen_keys_of_both_observation_groups() -> None:
    images = torch.rand(10, 2, 7, 7)
    vectors = torch.rand(10, 3)
    batch = {
        "observation": {"image": images.clone(), "vector": vectors.clone()},
        "next_observation": {"image": images.clone(), "vector": vectors.clone()},
    }
    out = SamplePreprocessor(RandomShift(pad=3, seed=1), keys=["image"])(batch, 10, 1)
    now = shifts_of(images, out["observation"]["image"], pad=3)
    after = shifts_of(images, out["next_observation"]["image"], pad=3)
    assert now != after, "observations and next observations should draw their own shifts"
    assert torch.equal(out["observation"]["vector"], vectors)


def test_sample_preprocessor_rejects_a_transform_that_changes_the_row_count() -> None:
    batch = {"observation": {"x": torch.zeros(6, 2)}}
    with pytest.raises(ConfigurationError, match="6 rows of 'observation/x' into 3"):
        SamplePreprocessor(lambda t: t[:3])(batch, 6, 1)


def test_adaptor_protocol_admits_the_adaptors_and_plain_functions() -> None:
    def halve(batch: dict, count: int, sequence_length: int) -> dict:
        return batch

    for adaptor in (DictObsAdaptor(["x"]), KeyScaleAdaptor(2.0, "x"), TerminalAdaptor(), halve):
        assert isinstance(adaptor, Adaptor)
    assert not isinstance(42, Adaptor)


# At the end of a real table's sample.


def image_table(device: str = "cpu") -> tuple[DictObsMemoryTable, np.ndarray]:
    spaces = MDPSpace(
        rewards=BoxSpace(np.float32, (1,)),
        actions=BoxSpace(np.float32, (2,)),
        state=DictSpace(
            {"image": BoxSpace(np.uint8, (1, 8, 8)), "vector": BoxSpace(np.float32, (3,))}
        ),
    )
    table = DictObsMemoryTable(
        spaces=spaces,
        maxlen=1000,
        seed=0,
        device=device,
        adaptors=[KeyScaleAdaptor(0.1, "rewards"), KeyCastAdaptor(torch.float32, "image")],
        preprocessor=SamplePreprocessor(RandomShift(pad=2, seed=0), keys=["image"]),
    )
    rng = np.random.default_rng(0)
    images = rng.integers(0, 255, (21, 1, 8, 8), dtype=np.uint8)
    table.add_sequence(
        0,
        {
            "image": images,
            "vector": rng.normal(size=(21, 3)).astype(np.float32),
            "actions": rng.normal(size=(20, 2)).astype(np.float32),
            "rewards": np.arange(20, dtype=np.float32),
        },
        end_state=EpisodeState.INTERRUPTED,
    )
    return table, images


def test_table_adaptors_scale_cast_and_augment_in_order() -> None:
    table, images = image_table()
    batch = table.sample(8, 2)
    _, offsets = table.last_sample_indices
    positions = (offsets[:, None] + np.arange(2)[None, :]).reshape(-1)
    assert torch.allclose(batch["rewards"].flatten(), torch.from_numpy(positions * 0.1).float())
    image = batch["observation"]["image"]
    assert image.dtype == torch.float32  # cast before nesting, augmented after
    originals = torch.from_numpy(images[positions]).float()
    shifts_of(originals, image, pad=2)
    next_originals = torch.from_numpy(images[positions + 1]).float()
    shifts_of(next_originals, batch["next_observation"]["image"], pad=2)


@pytest.mark.gpu
def test_adaptors_keep_cuda_batches_on_the_device() -> None:
    table, images = image_table(device="cuda")
    batch = table.sample(8, 2)
    assert batch["rewards"].device.type == "cuda"
    assert batch["observation"]["image"].device.type == "cuda"
    _, offsets = table.last_sample_indices
    positions = (offsets[:, None] + np.arange(2)[None, :]).reshape(-1)
    originals = torch.from_numpy(images[positions]).float()
    shifts_of(originals, batch["observation"]["image"].cpu(), pad=2)


def test_terminal_adaptor_keys_go_by_keyword_as_upstreams_order_is_the_other() -> None:
    with pytest.raises(TypeError, match="positional"):
        TerminalAdaptor("masks", "next_terminal")  # upstream's (target_key, value_key)
    adaptor = TerminalAdaptor(target_key="masks", value_key="next_terminal")
    assert (adaptor.value_key, adaptor.target_key) == ("next_terminal", "masks")
