"""Add-ons' data groups (``AddOn.data_sources``): resolved from the recipe, refused when they
would overwrite the replay memory's group or each other's."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import pytest

from emote_core.algorithms.registry import AddOn, DataSource, register_addon, unregister_addon
from emote_core.assembly.builders import data_sources
from emote_core.errors import ConfigurationError
from emote_core.recipes.loading import recipe_from_dict


@dataclass
class GroupConfig:
    group: str = "demonstrations"
    store: str = "demo.zarr"
    batch_size: int | None = None


class Demonstrations(AddOn):
    name: ClassVar[str] = "demonstrations_throwaway"
    config_class: ClassVar[type] = GroupConfig

    def data_sources(self, config: GroupConfig) -> list[DataSource]:
        option = f"{self.name}.store"
        source = DataSource(
            data_group=config.group, store=config.store, option=option, batch_size=config.batch_size
        )
        return [source]


class MoreDemonstrations(Demonstrations):
    name: ClassVar[str] = "more_demonstrations_throwaway"


@pytest.fixture
def addons() -> Iterator[None]:
    register_addon(Demonstrations)
    register_addon(MoreDemonstrations)
    yield
    unregister_addon(Demonstrations.name)
    unregister_addon(MoreDemonstrations.name)


def test_a_data_source_gets_the_recipes_batch_size_unless_it_has_its_own(addons: None) -> None:
    recipe = recipe_from_dict(
        {"addons": ["demonstrations_throwaway"], "memory": {"batch_size": 48}}
    )
    assert data_sources(recipe) == [
        DataSource(data_group="demonstrations", store="demo.zarr", batch_size=48,
                   option="demonstrations_throwaway.store")
    ]  # fmt: skip
    recipe = recipe_from_dict(
        {"addons": ["demonstrations_throwaway"], "demonstrations_throwaway": {"batch_size": 7}}
    )
    assert data_sources(recipe)[0].batch_size == 7
    assert data_sources(recipe_from_dict({})) == []


def test_a_data_group_that_is_taken_is_refused_naming_the_addon(addons: None) -> None:
    recipe = recipe_from_dict(
        {"addons": ["demonstrations_throwaway"], "demonstrations_throwaway": {"group": "default"}}
    )
    taken = "'demonstrations_throwaway' asks for data group 'default', which the replay memory"
    with pytest.raises(ConfigurationError, match=taken):
        data_sources(recipe)
    both = recipe_from_dict(
        {"addons": ["demonstrations_throwaway", "more_demonstrations_throwaway"]}
    )
    with pytest.raises(ConfigurationError, match="'more_demonstrations_throwaway' asks for data"):
        data_sources(both)
