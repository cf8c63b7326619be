"""Action coverage as ``emote memory inspect --actions`` reports it: discrete counts and actions
never taken, Box statistics and bins visited, the same whether read in one block or many, and
read from a multi-shard store's actions column block by block."""

from __future__ import annotations

import numpy as np
import pytest

from emote_core.spaces import BoxSpace, DictSpace, DiscreteSpace, MDPSpace
from emote_core.stores import inspect as store_inspect
from emote_core.stores.agents import record_agents
from emote_core.stores.inspect import store_action_coverage, store_report
from emote_core.stores.stored import ColumnSchema
from emote_core.stores.summary import ActionCoverage
from emote_core.stores.zarr_store import MemoryStore, ShardWriter, create_store, store_columns
from emote_core.typing import EpisodeState


def test_discrete_coverage_counts_each_action_and_names_those_never_taken():
    coverage = ActionCoverage(DiscreteSpace(n=5))
    coverage.add(np.array([[0], [1], [1], [4]]))
    coverage.add(np.array([[1], [7], [-1]]))  # 7 and -1 are no action of Discrete(5)
    report = coverage.report()
    assert report["kind"] == "discrete" and report["transitions"] == 7
    assert report["counts"] == [1, 3, 0, 0, 1]
    assert report["shares"] == pytest.approx([1 / 7, 3 / 7, 0, 0, 1 / 7])
    assert report["never_taken"] == [2, 3]
    assert report["outside"] == 2


def test_box_coverage_shows_actions_bunched_near_zero():
    rng = np.random.default_rng(0)
    space = BoxSpace(np.float32, (2,), low=-1.0, high=1.0)
    near_zero = np.stack([rng.uniform(-0.05, 0.05, 1000), rng.uniform(-1, 1, 1000)], axis=1)
    coverage = ActionCoverage(space)
    coverage.add(near_zero)
    first, second = coverage.report()["dimensions"]
    assert first["bins_visited"] == 2 and first["coverage"] == 0.2  # the bins beside 0
    assert first["bin_counts"][4] + first["bin_counts"][5] == 1000
    assert second["coverage"] == 1.0
    assert (first["low"], first["high"]) == (-1.0, 1.0)


def test_box_statistics_read_in_blocks_equal_those_of_the_whole():
    rng = np.random.default_rng(1)
    actions = rng.normal(3.0, 2.0, size=(10_000, 3))
    actions[5, 1] = np.nan
    space = BoxSpace(np.float32, (3,), low=[-1.0, -1.0, -np.inf], high=[1.0, 10.0, np.inf])
    whole, blocks = ActionCoverage(space), ActionCoverage(space)
    whole.add(actions)
    for block in np.array_split(actions, 7):
        blocks.add(block)
    report, by_blocks = whole.report(), blocks.report()
    for dim, same in zip(report["dimensions"], by_blocks["dimensions"], strict=True):
        assert {k: v for k, v in dim.items() if k not in ("mean", "std")} == {
            k: v for k, v in same.items() if k not in ("mean", "std")
        }
        assert (same["mean"], same["std"]) == pytest.approx((dim["mean"], dim["std"]))
    kept = np.delete(actions, 5, axis=0)
    assert report["nonfinite"] == 1 and report["transitions"] == 9_999
    for d, dim in enumerate(report["dimensions"]):
        assert dim["mean"] == pytest.approx(kept[:, d].mean())
        assert dim["std"] == pytest.approx(kept[:, d].std())
        assert (dim["min"], dim["max"]) == (kept[:, d].min(), kept[:, d].max())
    first, _, unbounded = report["dimensions"]
    assert first["outside"] == int(np.sum(np.abs(kept[:, 0]) > 1))  # out of bounds: not binned
    assert sum(first["bin_counts"]) == 9_999 - first["outside"]
    assert unbounded["coverage"] is None and unbounded["bin_counts"] is None


def test_a_multi_shard_store_is_covered_block_by_block(tmp_path, monkeypatch):
    spaces = MDPSpace(
        rewards=BoxSpace(np.float32, (1,)), actions=DiscreteSpace(n=4),
        state=DictSpace({"obs": BoxSpace(np.float32, (2,))}),
    )  # fmt: skip
    schemas = [
        ColumnSchema("obs", "Column", (2,), np.dtype(np.float32)),
        ColumnSchema("actions", "Column", (1,), np.dtype(np.int64)),
        ColumnSchema("rewards", "Column", (1,), np.dtype(np.float32)),
    ]

    def episode(identity: int, action: int, length: int) -> tuple:
        data = {"obs": np.zeros((length + 1, 2), np.float32),
                "actions": np.full((length, 1), action, np.int64),
                "rewards": np.ones((length, 1), np.float32)}  # fmt: skip
        return identity, data, EpisodeState.TERMINAL

    url = tmp_path / "s.zarr"
    create_store(url, columns=store_columns(schemas, episode(0, 0, 3), "actions"),
                 length_key="actions", spaces=spaces.to_json())  # fmt: skip
    with ShardWriter(url, shard="a") as writer:
        writer.append([episode(0, 0, 30), episode(1, 1, 20)])
    with ShardWriter(url, shard="b") as writer:  # a multi-agent shard: agents by episode id
        record_agents(writer.group, {"agents": ["x", "y"],
                                     "groups": [{"name": "g", "agents": ["x", "y"]}]})  # fmt: skip
        writer.append([episode(2, 1, 5), episode(3, 1, 4)])
    monkeypatch.setattr(store_inspect, "BLOCK_BYTES", 8)  # a block per chunk: many reads

    report = store_action_coverage(MemoryStore(url))
    assert report is not None and report["column"] == "actions"
    assert report["counts"] == [30, 29, 0, 0] and report["never_taken"] == [2, 3]
    assert report["unreadable_rows"] == 0 and report["problems"] == []
    whole = store_report(str(url), actions=True)
    assert whole["actions"]["counts"] == [30, 29, 0, 0]
    assert whole["agents"]["b"]["groups"] == [{"name": "g", "agents": ["x", "y"], "episodes": 2}]
    assert whole["returns"]["episodes"] == 4 and whole["episode_ends"]["terminal"] == 4
