"""Frame-stacked stores through conversion: emote-memory stores keep one frame per step, every
other format gets the stacks the agent saw, under the entry's own name."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emote_core.integrations.convert import convert
from emote_core.integrations.formats import read_source
from emote_core.memory.builders import DictObsMemoryTable
from emote_core.memory.frame_stacks import FRAME_PREFIX, stack_frames, unstack_frames
from emote_core.spaces import BoxSpace, DictSpace, MDPSpace
from emote_core.stores.zarr_store.tables import save_table
from emote_core.typing import EpisodeState

H, W, C, FRAMES = 4, 3, 2, 3


def spaces(frames: int = FRAMES) -> MDPSpace:
    return MDPSpace(
        rewards=BoxSpace(np.float32, (1,)),
        actions=BoxSpace(np.float32, (1,)),
        state=DictSpace({"obs": BoxSpace(np.uint8, (H, W, C * frames), 0, 255, frames=frames)}),
    )


def stacks_of(frames: np.ndarray, count: int) -> np.ndarray:
    """Stacks as emote's FrameStack builds them, from ``(N + 1, H, W, C)`` frames."""
    return np.stack(
        [
            np.concatenate([frames[max(p - j, 0)] for j in range(count - 1, -1, -1)], axis=-1)
            for p in range(len(frames))
        ]
    )


def pixel_store(path, episodes: int = 3) -> list[np.ndarray]:
    """A frame-stacked store of ``episodes`` episodes; returns each one's stacks."""
    rng = np.random.default_rng(0)
    table = DictObsMemoryTable(spaces=spaces(), maxlen=1_000, seed=0)
    seen = []
    for identity in range(episodes):
        length = 4 + identity
        stacked = stacks_of(rng.integers(0, 256, (length + 1, H, W, C), dtype=np.uint8), FRAMES)
        seen.append(stacked)
        sequence = {
            "obs": stacked,
            "actions": rng.normal(size=(length, 1)).astype(np.float32),
            "rewards": rng.normal(size=length).astype(np.float32),
        }
        table.add_sequence(identity, sequence, end_state=EpisodeState.INTERRUPTED)
    save_table(table, path, spaces=spaces().to_json())
    return seen


@pytest.mark.parametrize("target", ["npz", "pt", "emote-v1"])
def test_other_formats_get_the_stacks_the_agent_saw(tmp_path, target):
    seen = pixel_store(tmp_path / "pixels.zarr")
    destination = tmp_path / f"pixels.{target}"
    convert(tmp_path / "pixels.zarr", destination, target_format=target)
    _, stored = read_source(str(destination))
    names = {column.name for column in stored.columns}
    assert FRAME_PREFIX + "obs" not in names
    observations = [data[name] for _, data, _ in stored.episodes for name in data if "obs" in name]
    assert [o.shape for o in observations] == [s.shape for s in seen]
    for got, stacked in zip(observations, seen, strict=True):
        np.testing.assert_array_equal(got, stacked)


def test_a_store_converted_to_a_store_keeps_one_frame_per_step(tmp_path):
    seen = pixel_store(tmp_path / "pixels.zarr")
    convert(tmp_path / "pixels.zarr", tmp_path / "copy.zarr")
    _, stored = read_source(str(tmp_path / "copy.zarr"))
    frames = [data[FRAME_PREFIX + "obs"] for _, data, _ in stored.episodes]
    assert frames[0].shape == (len(seen[0]), C, H, W)
    for got, stacked in zip(frames, seen, strict=True):
        np.testing.assert_array_equal(stack_frames(got, FRAMES), stacked)
    assert stored.spaces["state"]["spaces"]["obs"]["frames"] == FRAMES


def test_whole_stacks_converted_back_to_a_store_train_like_the_original(tmp_path):
    """npz out and back in: a plain stacked column that a frame-stacked recipe can't mistake."""
    seen = pixel_store(tmp_path / "pixels.zarr")
    convert(tmp_path / "pixels.zarr", tmp_path / "pixels.npz", target_format="npz")
    convert(tmp_path / "pixels.npz", tmp_path / "back.zarr")
    _, stored = read_source(str(tmp_path / "back.zarr"))
    [observation] = [c for c in stored.columns if c.stored and c.shape == (H, W, C * FRAMES)]
    for (_, data, _), stacked in zip(stored.episodes, seen, strict=True):
        np.testing.assert_array_equal(data[observation.name], stacked)


@settings(max_examples=30, deadline=None)
@given(
    count=st.integers(1, 4),
    steps=st.integers(1, 9),
    shape=st.sampled_from([(2,), (3, 2), (2, 3, 2)]),
    seed=st.integers(0, 2**16),
)
def test_stack_frames_inverts_unstack_frames(count, steps, shape, seed):
    rng = np.random.default_rng(seed)
    *lead, channels = shape
    stacked = stacks_of(rng.integers(0, 256, (steps, *shape), dtype=np.uint8), count)
    space = MDPSpace(
        rewards=BoxSpace(np.float32, (1,)),
        actions=BoxSpace(np.float32, (1,)),
        state=DictSpace({"x": BoxSpace(np.uint8, (*lead, channels * count), frames=count)}),
    )
    frames = unstack_frames({"x": stacked}, {"x": count}, space)[FRAME_PREFIX + "x"]
    assert frames.shape == (steps, channels, *lead)
    np.testing.assert_array_equal(stack_frames(frames, count), stacked)
