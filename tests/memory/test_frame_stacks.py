"""Frame-stacked observations stored one frame per step: tables rebuild the stacks that
emote's FrameStack gave the agent, exactly, from one stored frame per step, in RAM and in stores."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emote_core.env import FrameStack
from emote_core.errors import ConfigurationError, SchemaError
from emote_core.memory.builders import DictObsMemoryTable, DictObsNStepMemoryTable
from emote_core.memory.frame_stacks import FRAME_PREFIX, frame_stacks
from emote_core.memory.mappers import (
    FrameStackMapper,
    LastFrameStackMapper,
    mapper_from_description,
)
from emote_core.memory.proxy import MemoryTableProxy
from emote_core.spaces import BoxSpace, DictSpace, MDPSpace, space_from_json
from emote_core.stores.memory_export import MemoryExporterProxyWrapper
from emote_core.stores.zarr_store import MemoryStore
from emote_core.stores.zarr_store.tables import load_table, save_table
from emote_core.typing import DictObservation, DictResponse, EpisodeState

H, W, C = 6, 5, 3


class NoiseImages(gymnasium.Env):
    """Random uint8 images of (H, W, C); episodes of ``length`` steps end TERMINAL."""

    def __init__(self, length: int = 9) -> None:
        self.observation_space = gymnasium.spaces.Box(0, 255, (H, W, C), np.uint8)
        self.action_space = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.length = length
        self._t = 0

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._t = 0
        return self._image(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self._t += 1
        return self._image(), float(self._t), self._t >= self.length, False, {}

    def _image(self) -> np.ndarray:
        return self.np_random.integers(0, 256, (H, W, C), dtype=np.uint8)


def spaces_for(frames: int, dtype: Any = np.uint8) -> MDPSpace:
    return MDPSpace(
        rewards=BoxSpace(np.float32, (1,)),
        actions=BoxSpace(np.float32, (1,)),
        state=DictSpace({"pixels": BoxSpace(dtype, (H, W, C * frames), 0, 255, frames=frames)}),
    )


def play(env: gymnasium.Env, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One episode through the env: the stacked observations (N + 1), actions and rewards."""
    observation, _ = env.reset(seed=seed)
    observations, rewards = [np.asarray(observation)], []
    done = False
    while not done:
        observation, reward, terminated, truncated, _ = env.step(np.zeros(1, np.float32))
        observations.append(np.asarray(observation))
        rewards.append(reward)
        done = terminated or truncated
    length = len(rewards)
    return np.stack(observations), np.zeros((length, 1), np.float32), np.float32(rewards)


def episode(frames: int, seed: int, length: int = 9) -> dict[str, np.ndarray]:
    stacked, actions, rewards = play(FrameStack(NoiseImages(length), frames), seed)
    return {"pixels": stacked, "actions": actions, "rewards": rewards}


@pytest.mark.parametrize("frames", [2, 3, 4])
def test_sampled_stacks_are_those_the_frame_stack_wrapper_gave_the_agent(frames):
    table = DictObsMemoryTable(spaces=spaces_for(frames), maxlen=1_000, seed=0)
    sequence = episode(frames, seed=frames)
    table.add_sequence(7, sequence, end_state=EpisodeState.TERMINAL)
    length = len(sequence["rewards"])
    batch = table.sample_by_index([7] * (length - 2), range(length - 2), 3)  # windows of 3
    stacked = sequence["pixels"]
    rows = np.concatenate([np.arange(o, o + 3) for o in range(length - 2)])
    np.testing.assert_array_equal(batch["observation"]["pixels"].numpy(), stacked[rows])
    np.testing.assert_array_equal(batch["next_observation"]["pixels"].numpy(), stacked[rows + 1])
    assert batch["observation"]["pixels"].dtype == torch.uint8  # frames stay uint8
    assert FRAME_PREFIX + "pixels" not in batch  # the single frames stay inside the table


def test_the_table_holds_one_frame_per_step_not_the_stack():
    frames = 4
    stacked_table = DictObsMemoryTable(spaces=spaces_for(frames), maxlen=1_000, seed=0)
    stacked_table.add_sequence(0, episode(frames, seed=1))
    [(_, held, _)] = list(stacked_table.episodes())
    assert set(held) == {FRAME_PREFIX + "pixels", "actions", "rewards"}
    assert held[FRAME_PREFIX + "pixels"].shape == (10, C, H, W)  # N + 1 frames, channels first
    assert held[FRAME_PREFIX + "pixels"].dtype == np.uint8
    per_row = stacked_table._arrays[FRAME_PREFIX + "pixels"].host.itemsize * H * W * C
    assert per_row == H * W * C  # one uint8 frame per row


def test_n_step_tables_bootstrap_from_the_stack_after_each_window():
    frames = 3
    table = DictObsNStepMemoryTable(spaces=spaces_for(frames), maxlen=1_000, seed=0)
    sequence = episode(frames, seed=2, length=8)
    table.add_sequence(0, sequence)
    batch = table.sample_by_index([0, 0, 0], [0, 2, 5], 3)
    np.testing.assert_array_equal(
        batch["next_observation"]["pixels"].numpy(), sequence["pixels"][[3, 5, 8]]
    )
    np.testing.assert_array_equal(
        batch["observation"]["pixels"].numpy()[3:6], sequence["pixels"][2:5]
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    frames=st.integers(1, 4),
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=6),
    window=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_windows_rebuild_every_stack_across_episodes_and_ejections(frames, lengths, window, seed):
    """Random episode lengths through a small table that ejects: every window of every held
    episode gives back the stacks the agent saw, never frames of a neighbouring episode."""
    table = DictObsMemoryTable(spaces=spaces_for(frames), maxlen=30, seed=0)
    played = {}
    for identity, length in enumerate(lengths):
        played[identity] = episode(frames, seed=seed + identity, length=length)
        table.add_sequence(identity, played[identity])
    held = [identity for identity, _, _ in table.episodes()]
    assert held == list(played)[len(played) - len(held) :]
    for identity in held:
        length = len(played[identity]["rewards"])
        if length < window:
            continue
        offsets = range(length - window + 1)
        batch = table.sample_by_index([identity] * len(offsets), offsets, window)
        rows = np.concatenate([np.arange(o, o + window) for o in offsets])
        stacked = played[identity]["pixels"]
        np.testing.assert_array_equal(batch["observation"]["pixels"].numpy(), stacked[rows])
        np.testing.assert_array_equal(
            batch["next_observation"]["pixels"].numpy(), stacked[rows + 1]
        )


def test_stacks_that_do_not_follow_from_their_frames_are_refused_naming_the_step():
    table = DictObsMemoryTable(spaces=spaces_for(3), maxlen=1_000, seed=0)
    sequence = episode(3, seed=3)
    shuffled = dict(sequence, pixels=sequence["pixels"].copy())
    shuffled["pixels"][5, 0, 0, 0] ^= 0xFF  # the oldest frame of step 5 is not step 4's
    with pytest.raises(SchemaError, match=r"'pixels' at step 5 .* shifted by one frame"):
        table.add_sequence(0, shuffled)
    zero_padded = dict(sequence, pixels=sequence["pixels"].copy())
    zero_padded["pixels"][0, ..., :C] = 0  # a stack after a reset padded with zeros
    with pytest.raises(SchemaError, match=r"at step 0 .* one frame repeated 3 times"):
        table.add_sequence(1, zero_padded)
    with pytest.raises(SchemaError, match=r"values have shape \(6, 5, 6\) per step"):
        table.add_sequence(2, dict(sequence, pixels=sequence["pixels"][..., : 2 * C]))
    assert table.episode_count == 0


def test_a_store_holds_the_frames_once_and_loads_back_into_the_same_stacks(tmp_path):
    spaces = spaces_for(3)
    table = DictObsMemoryTable(spaces=spaces, maxlen=1_000, seed=0)
    sequences = [episode(3, seed=10 + k, length=5 + k) for k in range(4)]
    for identity, sequence in enumerate(sequences):
        table.add_sequence(identity, sequence, end_state=EpisodeState.INTERRUPTED)
    save_table(table, tmp_path / "pixels.zarr", spaces=spaces.to_json())

    store = MemoryStore(tmp_path / "pixels.zarr")
    stored = {schema.name: schema for schema in store.schemas()}
    assert stored[FRAME_PREFIX + "pixels"].shape == (C, H, W)
    assert stored[FRAME_PREFIX + "pixels"].dtype == np.uint8
    assert MDPSpace.from_json(store.attributes["spaces"]).state["pixels"].frames == 3

    fresh = DictObsMemoryTable(spaces=spaces, maxlen=1_000, seed=0)
    assert load_table(fresh, [tmp_path / "pixels.zarr"]) == 4
    for identity, sequence in enumerate(sequences):
        length = len(sequence["rewards"])
        batch = fresh.sample_by_index([identity], [0], length)
        np.testing.assert_array_equal(
            batch["observation"]["pixels"].numpy(), sequence["pixels"][:-1]
        )
        np.testing.assert_array_equal(
            batch["next_observation"]["pixels"].numpy(), sequence["pixels"][1:]
        )


def test_live_exports_write_the_frames_the_table_holds(tmp_path):
    """The proxy hands the episode to the table and to the store export in the table's form."""
    frames = 3
    table = DictObsMemoryTable(spaces=spaces_for(frames), maxlen=1_000, seed=0)
    exporter = MemoryExporterProxyWrapper(
        MemoryTableProxy(table),
        target_memory_name="replay",
        inf_steps_per_memory_export=1,
        experiment_root_path=tmp_path,
        min_time_per_export=0.0,
    )
    env = FrameStack(NoiseImages(length=6), frames)
    observation, _ = env.reset(seed=5)
    state, seen = EpisodeState.INITIAL, []
    while True:
        seen.append(np.asarray(observation))
        exporter.add(
            {
                0: DictObservation(
                    episode_state=state,
                    array_data={"pixels": observation},
                    rewards={"reward": 1.0},
                )
            },
            {}
            if state == EpisodeState.TERMINAL
            else {0: DictResponse({"actions": np.zeros(1, np.float32)})},
        )
        if state == EpisodeState.TERMINAL:
            break
        observation, _, terminated, _, _ = env.step(np.zeros(1, np.float32))
        state = EpisodeState.TERMINAL if terminated else EpisodeState.RUNNING
    exporter.export()
    exporter.close()
    [(identity, data, _)] = list(MemoryStore(tmp_path / "replay_export").episodes())
    assert set(data) >= {FRAME_PREFIX + "pixels"} and "pixels" not in data
    newest = np.moveaxis(np.stack(seen)[..., -C:], -1, 1)  # stored channels first
    np.testing.assert_array_equal(data[FRAME_PREFIX + "pixels"], newest)
    fresh = DictObsMemoryTable(spaces=spaces_for(frames), maxlen=1_000, seed=0)
    load_table(fresh, [tmp_path / "replay_export"])
    batch = fresh.sample_by_index([identity], [0], 6)
    np.testing.assert_array_equal(batch["observation"]["pixels"].numpy(), np.stack(seen)[:-1])


def test_frame_stack_spaces_round_trip_and_compare_by_their_frames():
    space = BoxSpace(np.uint8, (84, 84, 9), 0, 255, frames=3)
    assert space.frame_shape == (84, 84, 3)
    document = space.to_json()
    assert document["frames"] == 3
    assert space_from_json(document) == space
    plain = BoxSpace(np.uint8, (84, 84, 9), 0, 255)
    assert "frames" not in plain.to_json()  # stores written before stacks read the same
    assert plain != space and plain.frame_shape == (84, 84, 9)
    env = FrameStack(NoiseImages(), 3)
    state = MDPSpace.from_gymnasium(env.observation_space, env.action_space).state
    assert state["obs"].frames == 3 and state["obs"].frame_shape == (H, W, C)
    assert frame_stacks(MDPSpace.from_gymnasium(env.observation_space, env.action_space)) == {
        "obs": 3
    }


@pytest.mark.parametrize(
    ("shape", "frames", "message"),
    [
        ((84, 84, 9), 0, "integer >= 1"),
        ((84, 84, 9), "3", "integer >= 1"),
        ((84, 84, 9), True, "integer >= 1"),
        ((84, 84, 8), 3, "holds them equally"),
        ((), 2, "holds them equally"),
    ],
)
def test_bad_frame_counts_are_one_line_errors(shape, frames, message):
    with pytest.raises(ConfigurationError, match=message):
        BoxSpace(np.uint8, shape, frames=frames)


def test_a_key_named_like_a_stacks_frame_column_is_refused_only_beside_a_stacked_entry():
    def spaces(frames: int) -> MDPSpace:
        return MDPSpace(
            rewards=BoxSpace(np.float32, (1,)),
            actions=BoxSpace(np.float32, (1,)),
            state=DictSpace(
                {
                    "pixels": BoxSpace(np.uint8, (2, 2, 2 * frames), frames=frames),
                    "frame_pixels": BoxSpace(np.float32, (3,)),
                }
            ),
        )

    DictObsMemoryTable(spaces=spaces(1), maxlen=100)  # no stack, no frame column: fine
    with pytest.raises(ConfigurationError, match="clashes with the frame column of 'pixels'"):
        DictObsMemoryTable(spaces=spaces(2), maxlen=100)


def test_frame_stack_mappers_round_trip_through_their_descriptions():
    for mapper in (FrameStackMapper(3), FrameStackMapper(4, 1), LastFrameStackMapper(2)):
        again = mapper_from_description(mapper.describe())
        assert type(again) is type(mapper) and again.describe() == mapper.describe()
    with pytest.raises(ConfigurationError, match="integer 'frames'"):
        mapper_from_description({"type": "FrameStackMapper", "frames": "3"})
    with pytest.raises(ConfigurationError, match="frames >= 1"):
        mapper_from_description({"type": "FrameStackMapper", "frames": 0})


def test_a_convolutional_encoder_sees_the_same_batch_from_frames_as_from_whole_stacks():
    """The sampled stack is a view of the frames (channels-first underneath): a conv encoder
    reads it as it reads a table of whole stacks, and the frames are not copied pixel by pixel."""
    from emote_core.nn import Conv2dEncoder

    frames = 3
    sequence = episode(frames, seed=4)
    whole_spaces = spaces_for(frames)
    whole = DictObsMemoryTable(
        spaces=MDPSpace(
            rewards=whole_spaces.rewards,
            actions=whole_spaces.actions,
            state=DictSpace({"pixels": BoxSpace(np.uint8, (H, W, C * frames), 0, 255)}),
        ),
        maxlen=1_000,
        seed=0,
    )
    stacked = DictObsMemoryTable(spaces=whole_spaces, maxlen=1_000, seed=0)
    for table in (whole, stacked):
        table.add_sequence(0, sequence)
    offsets = list(range(9))
    a = whole.sample_by_index([0] * 9, offsets, 1)["observation"]["pixels"]
    b = stacked.sample_by_index([0] * 9, offsets, 1)["observation"]["pixels"]
    assert torch.equal(a, b)
    assert b.movedim(-1, 1).is_contiguous()  # channels first underneath: a view, no copy
    torch.manual_seed(0)
    encoder = Conv2dEncoder(input_shape=(H, W, C * frames), channels=[4], kernels=[3])
    # Equal up to float summation order (the two memory layouts pick different conv kernels).
    torch.testing.assert_close(encoder(a), encoder(b), rtol=1e-4, atol=1e-3)
