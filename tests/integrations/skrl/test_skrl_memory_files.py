"""SkrlMemory.save writes skrl's own files; load rebuilds the episodes from them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from emote_core.errors import FormatError
from emote_core.integrations.skrl.memory import SkrlMemory
from emote_core.integrations.skrl.reader import read_skrl_memory

from .test_skrl_memory import NAMES, _collect, _create

skrl_memories = pytest.importorskip("skrl.memories.torch", reason="skrl is in the dev extra")

KINDS = ["pt", "npz", "csv"]


def _filled(envs: int = 2, steps: int = 33, memory_size: int = 40):
    theirs = skrl_memories.RandomMemory(memory_size=memory_size, num_envs=envs, device="cpu")
    ours = SkrlMemory(memory_size=memory_size, num_envs=envs, device="cpu")
    for memory in (theirs, ours):
        _create(memory)
    _collect([theirs, ours], envs=envs, steps=steps)
    return theirs, ours


def _saved(memory, directory: Path, kind: str) -> Path:
    memory.save(str(directory), format=kind)
    (path,) = (directory / "memories").iterdir()
    return path


def _contents(path: Path) -> dict[str, np.ndarray] | str:
    if path.suffix == ".pt":
        return {k: v.numpy() for k, v in torch.load(path, weights_only=True).items()}
    if path.suffix == ".npz":
        with np.load(path) as archive:
            return {k: archive[k] for k in archive.files}
    return path.read_text()


@pytest.mark.parametrize("kind", KINDS)
def test_save_writes_what_skrl_itself_writes(tmp_path, kind):
    theirs, ours = _filled()
    mine = _contents(_saved(ours, tmp_path / "ours", kind))
    skrls = _contents(_saved(theirs, tmp_path / "theirs", kind))
    if kind == "csv":
        assert mine == skrls
        return
    assert list(mine) == list(skrls)
    for name in skrls:
        assert mine[name].dtype == skrls[name].dtype
        np.testing.assert_array_equal(mine[name], skrls[name])


@pytest.mark.parametrize("kind", KINDS)
def test_load_rebuilds_the_same_ring_and_episodes(tmp_path, kind):
    _, ours = _filled()
    path = _saved(ours, tmp_path, kind)
    again = SkrlMemory(memory_size=40, num_envs=2, device="cpu")
    _create(again)
    again.load(str(path))
    assert (len(again), again.memory_index, again.filled) == (len(ours), ours.memory_index, False)
    for name in NAMES:
        np.testing.assert_array_equal(
            again.get_tensor_by_name(name).numpy(), ours.get_tensor_by_name(name).numpy()
        )
    ours.flush()
    again.flush()
    before = [(d, e) for _, d, e in ours.table.episodes()]
    after = [(d, e) for _, d, e in again.table.episodes()]
    assert [e for _, e in after] == [e for _, e in before]
    for (a, _), (b, _) in zip(after, before, strict=True):
        np.testing.assert_array_equal(a["observations"], b["observations"])


@pytest.mark.parametrize("kind", ["pt", "npz"])
def test_load_takes_a_file_skrl_saved_and_skrl_loads_ours(tmp_path, kind):
    theirs, ours = _filled(envs=1, steps=25)
    fresh = SkrlMemory(memory_size=40, device="cpu")  # no tensors: the file declares them
    fresh.load(str(_saved(theirs, tmp_path / "theirs", kind)))
    assert fresh.get_tensor_names() == theirs.get_tensor_names() and len(fresh) == 25
    np.testing.assert_array_equal(
        fresh.get_tensor_by_name("rewards").numpy(), theirs.get_tensor_by_name("rewards").numpy()
    )
    loaded = skrl_memories.RandomMemory(memory_size=40, device="cpu")
    _create(loaded)
    loaded.load(str(_saved(ours, tmp_path / "ours", kind)))
    # skrl's load sets the `_tensor_<name>` attributes.
    np.testing.assert_array_equal(
        loaded._tensor_observations.numpy(), theirs.get_tensor_by_name("observations").numpy()
    )


@pytest.mark.parametrize("kind", KINDS)
def test_emotes_skrl_reader_sees_the_episodes_the_table_holds(tmp_path, kind):
    _, ours = _filled()
    read = read_skrl_memory(_saved(ours, tmp_path, kind), num_envs=2)
    ours.flush()
    held = sorted(ours.table.episodes(), key=lambda e: e[1]["observations"][0].tolist())
    episodes = sorted(read.episodes, key=lambda e: e[1]["obs"][0].tolist())
    assert [e for *_, e in episodes] == [e for *_, e in held]
    for (_, a, _), (_, b, _) in zip(episodes, held, strict=True):
        np.testing.assert_array_equal(a["obs"], b["observations"])


def test_loading_a_csv_with_tensors_the_memory_lacks_is_refused(tmp_path):
    _, ours = _filled(envs=1, steps=5)
    path = _saved(ours, tmp_path, "csv")
    bare = SkrlMemory(memory_size=40, device="cpu")
    bare.create_tensor("rewards", size=1)
    with pytest.raises(FormatError, match=r"did not create; a \.csv records no dtypes"):
        bare.load(str(path))
    with pytest.raises(FormatError, match="does not exist"):
        bare.load(str(tmp_path / "nothing.pt"))
