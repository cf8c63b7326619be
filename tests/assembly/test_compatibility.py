"""Stores, policies and environments are checked against each other before anything steps; every
refusal is one line naming both sides in words, never raw shapes or class names."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pytest

from emote_core.assembly.builders import make_env
from emote_core.assembly.compatibility import (
    StoreUse,
    check_collect_store,
    check_policy_fits,
    check_store_fits,
    check_training_stores,
)
from emote_core.assembly.provenance import session_provenance
from emote_core.errors import ConfigurationError
from emote_core.memory import DictObsMemoryTable
from emote_core.recipes import load_recipe
from emote_core.recipes.schema import Recipe
from emote_core.spaces import BoxSpace, DictSpace, DiscreteSpace, MDPSpace
from emote_core.stores.provenance import PolicyKind, PolicyRecord
from emote_core.stores.stored import ColumnSchema
from emote_core.stores.zarr_store import MemoryStore, create_store, store_columns
from emote_core.stores.zarr_store.tables import StoreAppender

RAW_SHAPE = re.compile(r"\(\d+,?\)|\[\d+\]|Proxy|Space\(")


def spaces_of(recipe: Recipe) -> MDPSpace:
    env = make_env(recipe, num_envs=1)
    try:
        return env.spaces
    finally:
        env.close()


def collected_store(path: Path, recipe: Recipe, *, provenance: bool = True) -> MemoryStore:
    """An empty store made as `emote collect` makes one for ``recipe`` (with or without the
    provenance an older emote did not write)."""
    spaces = spaces_of(recipe)
    record = session_provenance(recipe, policy=PolicyRecord(PolicyKind.RANDOM), num_envs=1)
    table = DictObsMemoryTable(spaces=spaces, maxlen=100)
    StoreAppender(
        path, table, spaces=spaces.to_json(), provenance=record if provenance else None
    ).close()
    return MemoryStore(path)


def refusal(error: pytest.ExceptionInfo[ConfigurationError]) -> str:
    text = str(error.value)
    assert "\n" not in text and not RAW_SHAPE.search(text), text
    return text


def test_a_store_of_another_env_names_both_envs_and_both_sizes(tmp_path: Path) -> None:
    store = collected_store(tmp_path / "c.zarr", load_recipe("dqn_cartpole"))
    pendulum = load_recipe("sac_pendulum")
    with pytest.raises(ConfigurationError) as error:
        check_store_fits(store, spaces_of(pendulum), pendulum, use=StoreUse.TRAIN)
    assert refusal(error) == (
        f"store '{store.url}' holds observations 'obs' of 4 numbers; Pendulum-v1 gives 3 numbers "
        "— the store was collected on CartPole-v1; train from stores collected on Pendulum-v1, "
        "or use a recipe for CartPole-v1"
    )


def test_a_store_of_another_env_id_with_the_same_spaces_is_refused(tmp_path: Path) -> None:
    store = collected_store(tmp_path / "c.zarr", load_recipe("dqn_cartpole"))
    older = load_recipe("dqn_cartpole", ["env.id=CartPole-v0"])
    spaces = spaces_of(older)
    assert spaces == spaces_of(load_recipe("dqn_cartpole"))
    with pytest.raises(ConfigurationError) as error:
        check_store_fits(store, spaces, older, use=StoreUse.COLLECT)
    text = refusal(error)
    assert text.startswith(
        f"store '{store.url}' was collected on CartPole-v1; this recipe runs CartPole-v0"
    )
    assert "collect into a new store" in text
    check_store_fits(store, spaces, load_recipe("dqn_cartpole"), use=StoreUse.COLLECT)


def test_a_store_without_provenance_is_checked_by_its_spaces(tmp_path: Path) -> None:
    store = collected_store(tmp_path / "c.zarr", load_recipe("dqn_cartpole"), provenance=False)
    older = load_recipe("dqn_cartpole", ["env.id=CartPole-v0"])
    check_store_fits(store, spaces_of(older), older, use=StoreUse.TRAIN)  # nothing says otherwise
    pendulum = load_recipe("sac_pendulum")
    with pytest.raises(ConfigurationError) as error:
        check_store_fits(store, spaces_of(pendulum), pendulum, use=StoreUse.TRAIN)
    assert "— the store was collected on another environment;" in refusal(error)


def test_a_store_known_only_by_its_columns_is_checked_by_them(tmp_path: Path) -> None:
    """Converted stores from formats without spaces: an int actions column of one number fits a
    discrete env; an observation column of another size does not."""
    columns = [
        ColumnSchema("obs", "Column", (4,), np.dtype(np.float32)),
        ColumnSchema("actions", "Column", (1,), np.dtype(np.int64)),
        ColumnSchema("rewards", "Column", (1,), np.dtype(np.float32)),
    ]
    create_store(
        tmp_path / "s.zarr",
        columns=store_columns(columns, None, "rewards", ["obs"]),
        length_key="rewards",
    )
    store = MemoryStore(tmp_path / "s.zarr")
    cartpole = load_recipe("dqn_cartpole")
    check_store_fits(store, spaces_of(cartpole), cartpole, use=StoreUse.TRAIN)
    pendulum = load_recipe("sac_pendulum")
    with pytest.raises(ConfigurationError) as error:
        check_store_fits(store, spaces_of(pendulum), pendulum, use=StoreUse.TRAIN)
    assert "holds observations 'obs' of 4 numbers; Pendulum-v1 gives 3 numbers" in refusal(error)


def test_training_stores_are_checked_from_the_recipe_alone(tmp_path: Path) -> None:
    collected_store(tmp_path / "c.zarr", load_recipe("dqn_cartpole"))
    with pytest.raises(ConfigurationError, match="collected on CartPole-v1"):
        check_training_stores(load_recipe("sac_pendulum"), [tmp_path / "c.zarr"])
    check_training_stores(load_recipe("dqn_cartpole"), [tmp_path / "c.zarr"])


def test_collect_checks_only_a_store_that_exists(tmp_path: Path) -> None:
    pendulum = load_recipe("sac_pendulum")
    check_collect_store(tmp_path / "new.zarr", pendulum, spaces_of(pendulum))
    assert not (tmp_path / "new.zarr").exists()
    collected_store(tmp_path / "c.zarr", load_recipe("dqn_cartpole"))
    with pytest.raises(ConfigurationError, match="collect into a new store"):
        check_collect_store(tmp_path / "c.zarr", pendulum, spaces_of(pendulum))


def test_a_policy_that_does_not_fit_names_both_envs(caplog: pytest.LogCaptureFixture) -> None:
    pendulum = load_recipe("sac_pendulum")
    spaces = spaces_of(pendulum)
    reads = DictSpace({"obs": BoxSpace(np.float32, (2,))})
    with pytest.raises(ConfigurationError) as error:
        check_policy_fits("r", "emote/HitTheMiddle-v0", reads, spaces.actions, spaces, pendulum)
    assert refusal(error) == (
        "policy 'r' reads observations 'obs' of 2 numbers; Pendulum-v1 gives 3 numbers — it was "
        "trained on emote/HitTheMiddle-v0; collect with a policy trained on Pendulum-v1, or with "
        "a recipe for emote/HitTheMiddle-v0"
    )
    with pytest.raises(ConfigurationError) as error:
        check_policy_fits("q.onnx", None, spaces.state, DiscreteSpace(n=2), spaces, pendulum)
    assert "policy 'q.onnx' acts with one of 2 choices; Pendulum-v1 takes 1 number" in refusal(
        error
    )
    assert "trained on another environment" in str(error.value)
    missing = DictSpace({"pixels": BoxSpace(np.uint8, (64, 64, 3))})
    with pytest.raises(ConfigurationError) as error:
        check_policy_fits("p.onnx", None, missing, spaces.actions, spaces, pendulum)
    assert (
        "reads observations 'pixels' of 64x64 image with 3 channels, which Pendulum-v1 does not "
        "give" in refusal(error)
    )
    with caplog.at_level(logging.WARNING):
        check_policy_fits("p", "Pendulum-v0", spaces.state, spaces.actions, spaces, pendulum)
    assert "trained on Pendulum-v0 and acts here in Pendulum-v1" in caplog.text


def test_a_store_of_the_same_env_id_with_other_settings_says_so(tmp_path: Path) -> None:
    store = collected_store(tmp_path / "h.zarr", load_recipe("sac_hit_the_middle"))
    other = load_recipe("sac_hit_the_middle")
    held = spaces_of(other)
    wider = MDPSpace(
        rewards=held.rewards, actions=held.actions,
        state=DictSpace({"obs": BoxSpace(np.float32, (5,))}),
    )  # fmt: skip
    with pytest.raises(ConfigurationError) as error:
        check_store_fits(store, wider, other, use=StoreUse.TRAIN)
    assert refusal(error).startswith(
        f"store '{store.url}' holds observations 'obs' of 2 numbers; emote/HitTheMiddle-v0 gives "
        "5 numbers — the store was collected on emote/HitTheMiddle-v0 with other settings"
    )
