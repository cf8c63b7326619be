"""emote_core's top level: the names a library user starts from, each the object of its home
module, loaded on first use so that ``import emote_core`` stays light."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import emote_core
from emote_core import (
    ArrayMemoryTable,
    Callback,
    DictObsMemoryTable,
    MemoryLoader,
    MemoryStore,
    MemoryTableProxy,
    Order,
    Trainer,
    get_algorithm,
    load_table,
    save_table,
)
from emote_core.spaces import MDPSpace
from emote_core.typing import EpisodeState

# Each exported name and the module that defines it.
LAZY = {
    "AddOn": "emote_core.algorithms.registry",
    "AlgorithmFamily": "emote_core.algorithms.registry",
    "ArrayMemoryTable": "emote_core.memory.table",
    "Callback": "emote_core.callback",
    "DictObsMemoryTable": "emote_core.memory.builders",
    "DoubleDQN": "emote_core.algorithms.dqn.family",
    "DqnConfig": "emote_core.algorithms.dqn.family",
    "EmoteError": "emote_core.errors",
    "MemoryLoader": "emote_core.memory.loaders",
    "MemoryStore": "emote_core.stores.zarr_store.reader",
    "MemoryTableProxy": "emote_core.memory.proxy",
    "Order": "emote_core.callback",
    "SacConfig": "emote_core.algorithms.sac.family",
    "ShardWriter": "emote_core.stores.zarr_store.writer",
    "SoftActorCritic": "emote_core.algorithms.sac.family",
    "StateDict": "emote_core.trainer",
    "Trainer": "emote_core.trainer",
    "create_store": "emote_core.stores.zarr_store.writer",
    "get_algorithm": "emote_core.algorithms.registry",
    "load_table": "emote_core.stores.zarr_store.tables",
    "register_addon": "emote_core.algorithms.registry",
    "register_algorithm": "emote_core.algorithms.registry",
    "save_table": "emote_core.stores.zarr_store.tables",
}
OWN = {"DISTRIBUTION", "__version__", "install_command"}


def test_the_top_level_exports_the_starting_names_each_from_its_home_module() -> None:
    assert set(emote_core.__all__) == set(LAZY) | OWN
    for name, module in LAZY.items():
        assert getattr(emote_core, name) is getattr(sys.modules[module], name), name
    assert set(emote_core.__all__) <= set(dir(emote_core))


def test_an_unknown_name_is_an_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Trainr'"):
        _ = emote_core.Trainr


def test_type_checkers_see_every_exported_name_with_its_module() -> None:
    """The ``if TYPE_CHECKING:`` imports of the face (what type checkers and the API reference
    read) name exactly the lazy table's names, from the same modules."""
    tree = ast.parse(Path(emote_core.__file__).read_text(encoding="utf-8"))
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    )
    seen = {
        alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert seen == LAZY


def test_importing_emote_core_imports_no_other_emote_module_nor_torch() -> None:
    code = (
        "import sys, emote_core\n"
        "print(sorted(m for m in sys.modules if m.startswith('emote_core')))\n"
        "print(sorted({'torch', 'zarr', 'numpy', 'gymnasium'} & set(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.splitlines() == ["['emote_core']", "[]"]


def test_the_families_are_registered_under_their_recipe_names() -> None:
    assert isinstance(get_algorithm("sac"), emote_core.SoftActorCritic)
    assert get_algorithm("sac").config_class is emote_core.SacConfig
    assert isinstance(get_algorithm("dqn"), emote_core.DoubleDQN)
    assert get_algorithm("dqn").config_class is emote_core.DqnConfig
    assert issubclass(emote_core.SoftActorCritic, emote_core.AlgorithmFamily)


def _episode(length: int, start: float) -> dict[str, np.ndarray]:
    observations = start + np.arange(length + 1, dtype=np.float32)
    return {
        "obs": np.stack([observations, -observations], axis=1),
        "actions": np.full((length, 1), 0.5, dtype=np.float32),
        "rewards": np.ones((length, 1), dtype=np.float32),
    }


def test_a_table_filled_through_the_proxy_trains_and_round_trips_a_store(tmp_path: Path) -> None:
    spaces = MDPSpace.from_gymnasium(
        gym.spaces.Box(-100.0, 100.0, (2,), np.float32), gym.spaces.Box(-1.0, 1.0, (1,))
    )
    table = DictObsMemoryTable(spaces=spaces, maxlen=1000, seed=0)
    assert isinstance(table, ArrayMemoryTable)
    proxy = MemoryTableProxy(table)
    for start in (0.0, 100.0, 200.0):
        proxy.add_episode(_episode(8, start), EpisodeState.TERMINAL)
    assert table.episode_count == 3 and table.size() == 24

    class Batches(Callback):
        """Keeps the observations of every batch it trains on."""

        order = Order.DEFAULT

        def __init__(self) -> None:
            super().__init__(data_group="default")
            self.observations: list[torch.Tensor] = []

        def backward(self, observation: dict[str, torch.Tensor]) -> None:
            self.observations.append(observation["obs"])

    seen = Batches()
    loader = MemoryLoader(table=table, rollout_count=4, rollout_length=2)
    state = Trainer([seen], _first(loader, 3)).train()
    assert state["bp_step"] == 3 and len(seen.observations) == 3
    stored_rows = {tuple(row) for e in range(3) for row in _episode(8, 100.0 * e)["obs"]}
    for batch in seen.observations:
        assert batch.shape == (8, 2)
        assert {tuple(row) for row in batch.numpy().tolist()} <= stored_rows

    url = str(tmp_path / "memory.zarr")
    assert save_table(table, url) == 3
    assert MemoryStore(url).episode_count == 3
    copy = DictObsMemoryTable(spaces=spaces, maxlen=1000, seed=0)
    assert load_table(copy, [url]) == 3
    assert [e[1]["obs"].tolist() for e in copy.episodes()] == [
        e[1]["obs"].tolist() for e in table.episodes()
    ]


def _first(loader: MemoryLoader, count: int):
    """The first ``count`` batches of ``loader``."""
    for index, batch in enumerate(loader):
        if index == count:
            return
        yield batch
