"""``emote collect``'s batched path stores exactly the episodes the plain per-agent path
(GymCollector feeding a MemoryTableProxy, one agent at a time) collects for the same seeds: the
same rows, identities, end states, returns and checksums, episodes ending mid-chunk in several
slots at once, and episodes that span chunks and collector calls."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest

from emote_core.assembly.builders import make_env
from emote_core.assembly.collection import CollectionProgress, collect_to_store
from emote_core.env import GymCollector
from emote_core.memory import DictObsMemoryTable, MemoryTableProxy
from emote_core.proxies import RandomAgentProxy
from emote_core.recipes import load_recipe
from emote_core.stores.zarr_store import MemoryStore
from emote_core.typing import EpisodeState
from tests.env.test_batch_collector import StepByStep


def per_agent_episodes(recipe, num_envs: int, vector_steps: int) -> list[tuple]:
    env = make_env(recipe, num_envs=num_envs)
    proxy = MemoryTableProxy(DictObsMemoryTable(spaces=env.spaces, maxlen=1_000_000))
    episodes: list[tuple] = []
    proxy.episode_listeners.append(lambda *episode: episodes.append(episode))
    agent = RandomAgentProxy(action_space=env.single_action_space, seed=recipe.seed)
    collector = GymCollector(env=env, agent=agent, memory=StepByStep(proxy), seed=recipe.seed)
    collector.collect(vector_steps)
    env.close()
    return episodes


@pytest.mark.parametrize(
    ("recipe_name", "overrides", "num_envs", "vector_steps"),
    [
        ("dqn_cartpole", [], 5, 300),  # short TERMINAL episodes, often several in one step
        ("dqn_cartpole", [], 1, 400),
        # INTERRUPTED at 300 steps: episodes span the 256-step chunks (1024 rows, set below, over
        # 4 envs) and the collector calls (128 vector steps of 4 envs)
        ("sac_pendulum", ["env.max_episode_steps=300"], 4, 700),
    ],
)
def test_collect_stores_what_the_per_agent_path_collects(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    recipe_name: str,
    overrides: list[str],
    num_envs: int,
    vector_steps: int,
) -> None:
    monkeypatch.setattr("emote_core.env.batch_collector.CHUNK_ROWS", 1_024)
    recipe = load_recipe(recipe_name, overrides)
    out = str(tmp_path / "store.zarr")
    result = collect_to_store(
        recipe, out, steps=vector_steps * num_envs, num_envs=num_envs, count_store=False
    )
    expected = per_agent_episodes(recipe, num_envs, vector_steps)
    store = MemoryStore(out)
    stored = list(store.episodes())  # checks every episode's checksum as it reads
    assert len(stored) == len(expected) == result.summary["episodes"] >= 3
    assert {state for *_, state in stored} <= {EpisodeState.TERMINAL, EpisodeState.INTERRUPTED}
    for (identity, data, state), (reference_id, reference, reference_state) in zip(
        stored, expected, strict=True
    ):
        assert (identity, state) == (reference_id, reference_state)
        for key, values in reference.items():
            np.testing.assert_array_equal(
                np.asarray(data[key]).reshape(values.shape), values, err_msg=key
            )
    (shard,) = store.shards
    table = shard.table
    np.testing.assert_array_equal(table["length"], [len(e[1]["rewards"]) for e in expected])
    np.testing.assert_array_equal(
        table["return"], [float(np.sum(e[1]["rewards"], dtype=np.float64)) for e in expected]
    )
    checksums = []
    for _, reference, _ in expected:  # the checksum of the bytes as stored, column by column
        checksum = 0
        for column in store.columns:
            array = np.ascontiguousarray(reference[column.name], dtype=column.schema.dtype)
            checksum = zlib.crc32(memoryview(array).cast("B"), checksum)
        checksums.append(checksum)
    np.testing.assert_array_equal(table["checksum"], checksums)


def test_the_shown_return_is_the_mean_of_the_last_twenty_episodes(tmp_path: Path) -> None:
    recipe = load_recipe("dqn_cartpole")
    shown: list[tuple[int, float | None]] = []

    def on_progress(progress: CollectionProgress) -> None:
        shown.append((progress.episodes, progress.recent_return))

    out = str(tmp_path / "store.zarr")
    collect_to_store(recipe, out, steps=40_000, num_envs=4, on_progress=on_progress,
                     count_store=False)  # fmt: skip
    returns = MemoryStore(out).shards[0].table["return"]
    assert len(returns) > 40 and shown[0] == (0, None)
    assert shown[-1][1] == pytest.approx(float(np.mean(returns[-20:])))
    # Each report averages the last (up to) twenty episodes handed out by then, however many
    # ended between reports.
    means = [float(np.mean(returns[max(0, k - 20) : k])) for k in range(1, len(returns) + 1)]
    middle = [r for _, r in shown[1:-1] if r is not None]
    assert len(set(middle)) >= 2
    for value in middle:
        assert any(value == pytest.approx(mean) for mean in means)


@pytest.mark.parametrize("recipe_name", ["sac_hit_the_middle", "dqn_cartpole"])
def test_emote_train_collects_whole_episodes_in_bulk(tmp_path: Path, recipe_name: str) -> None:
    import torch

    from emote_core.assembly.training import build_training
    from emote_core.runs import prepare_run

    recipe = load_recipe(recipe_name, ["memory.warmup_steps=64", "memory.batch_size=16"])
    run = prepare_run(tmp_path / "run", recipe=recipe, command=["test"])
    setup = build_training(recipe, run=run, device=torch.device("cpu"), bp_steps=2)
    try:
        assert setup.collector.records_episodes  # the export wrapper passes episodes on
        setup.trainer.train()
        assert setup.collector.memory.completed_episodes >= 1
    finally:
        setup.env.close()
