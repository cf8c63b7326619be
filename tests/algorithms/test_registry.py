"""The registry of algorithm families and add-ons: what it accepts, what it refuses, and how it
finds other packages' plug-ins through entry points."""

from __future__ import annotations

import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from emote_core.algorithms.dqn import DqnConfig
from emote_core.algorithms.registry import (
    AddOn,
    AlgorithmFamily,
    algorithm_names,
    find_plugin,
    get_addon,
    get_algorithm,
    register_addon,
    register_algorithm,
    unregister_addon,
)
from emote_core.algorithms.sac import SacConfig, SoftActorCritic
from emote_core.errors import ConfigurationError
from emote_core.recipes.loading import recipe_from_dict, recipe_to_toml


@dataclass
class EmptyConfig:
    """No settings."""


def test_emote_registers_its_own_families_on_import() -> None:
    assert {"dqn", "sac"} <= set(algorithm_names())
    assert isinstance(get_algorithm("sac"), SoftActorCritic)
    assert get_algorithm("dqn").config_class is DqnConfig
    assert find_plugin("sac") is get_algorithm("sac")


def test_unknown_names_get_the_closest_registered_one() -> None:
    with pytest.raises(ConfigurationError, match=r"no algorithm named 'sca'; did you mean 'sac'\?"):
        get_algorithm("sca")
    with pytest.raises(ConfigurationError, match=r"no add-on named 'nothing'"):
        get_addon("nothing")


class Nameless(AddOn):
    name: ClassVar[str] = "not an identifier"
    config_class: ClassVar[type] = EmptyConfig


class NoTable(AddOn):
    name: ClassVar[str] = "no_table"
    config_class: ClassVar[type] = dict


class SacImpostor(AddOn):
    name: ClassVar[str] = "sac"
    config_class: ClassVar[type] = EmptyConfig


def test_registration_refuses_what_a_recipe_could_not_name_or_configure() -> None:
    with pytest.raises(ConfigurationError, match="must be an identifier"):
        register_addon(Nameless)
    with pytest.raises(ConfigurationError, match="needs config_class, the dataclass"):
        register_addon(NoTable)
    with pytest.raises(ConfigurationError, match="derive from AlgorithmFamily"):
        register_algorithm(SacImpostor)
    with pytest.raises(ConfigurationError, match="derive from AddOn"):
        register_addon(SoftActorCritic)
    with pytest.raises(ConfigurationError, match="Unfinished does not implement acting_agent, "):
        register_algorithm(Unfinished)
    with pytest.raises(ConfigurationError, match="needs acting_callback"):
        register_algorithm(NoActingCallback)


class Unfinished(AlgorithmFamily):
    name: ClassVar[str] = "unfinished"
    config_class: ClassVar[type] = EmptyConfig


class NoActingCallback(SoftActorCritic):
    name: ClassVar[str] = "no_acting_callback"
    acting_callback: ClassVar[str] = ""


class OtherSac(SoftActorCritic):
    pass


def test_a_taken_name_needs_replace_and_registering_the_same_class_again_is_harmless() -> None:
    register_algorithm(SoftActorCritic)  # emote's own import did it already: no error
    with pytest.raises(ConfigurationError, match="'sac' is already registered by SoftActorCritic"):
        register_algorithm(OtherSac)
    try:
        register_algorithm(OtherSac, replace=True)
        assert isinstance(get_algorithm("sac"), OtherSac)
    finally:
        register_algorithm(SoftActorCritic, replace=True)
    assert type(get_algorithm("sac")) is SoftActorCritic


def test_plugin_tables_load_typed_with_defaults_and_unknown_tables_are_named() -> None:
    recipe = recipe_from_dict({"algorithm": "dqn", "dqn": {"gamma": 0.9}}, source="r.toml")
    assert recipe.config == DqnConfig(gamma=0.9) and recipe.dqn is recipe.config
    assert "sac" not in recipe.sections  # only the tables a recipe has, and its algorithm's
    assert recipe_from_dict({}, source="r.toml").sac == SacConfig()
    old = {"algorithm": "sac", "sac": {"tau": 0.01}, "dqn": {}}  # run directories before plug-ins
    both = recipe_from_dict(old, source="old.toml")
    assert both.sac.tau == 0.01 and both.dqn == DqnConfig()
    assert recipe_from_dict(tomllib.loads(recipe_to_toml(both))) == both
    with pytest.raises(ConfigurationError, match=r"unknown key 'sacc'; did you mean 'sac'\?"):
        recipe_from_dict({"sacc": {}}, source="r.toml")
    with pytest.raises(ConfigurationError, match=r"unknown key 'dqn.gama'; did you mean"):
        recipe_from_dict({"algorithm": "dqn", "dqn": {"gama": 0.9}}, source="r.toml")
    with pytest.raises(ConfigurationError, match=r"'sac.gamma' must be within \[0, 1\]"):
        recipe_from_dict({"sac": {"gamma": 2.0}}, source="r.toml")


class Marker(AddOn):
    name: ClassVar[str] = "marker"
    config_class: ClassVar[type] = EmptyConfig


def test_an_addon_is_named_once_and_gets_its_default_table() -> None:
    register_addon(Marker)
    try:
        assert recipe_from_dict({"addons": ["marker"]}).marker == EmptyConfig()
        with pytest.raises(ConfigurationError, match="'addons' names an add-on twice"):
            recipe_from_dict({"addons": ["marker", "marker"]}, source="r.toml")
    finally:
        unregister_addon("marker")
    with pytest.raises(ConfigurationError, match=r"r\.toml: no add-on named 'marker'"):
        recipe_from_dict({"addons": ["marker"]}, source="r.toml")


PLUGIN_MODULE = """
from dataclasses import dataclass
from typing import ClassVar

from emote_core.algorithms.registry import AddOn


@dataclass
class GreetingConfig:
    greeting: str = "hello"


class Greeting(AddOn):
    name: ClassVar[str] = "greeting_from_elsewhere"
    config_class: ClassVar[type] = GreetingConfig
"""


def test_other_packages_plug_in_through_entry_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "greeting_plugin.py").write_text(PLUGIN_MODULE)
    dist_info = tmp_path / "greeting_plugin-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: greeting-plugin\n")
    (dist_info / "entry_points.txt").write_text(
        "[emote.addons]\ngreeting_from_elsewhere = greeting_plugin:Greeting\n"
        "[emote.algorithms]\nbroken_elsewhere = no_such_module_anywhere:Nothing\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        addon = get_addon("greeting_from_elsewhere")  # not registered: the entry point loads it
        assert type(addon).__name__ == "Greeting"
        recipe = recipe_from_dict(
            {"addons": ["greeting_from_elsewhere"], "greeting_from_elsewhere": {"greeting": "hi"}}
        )
        assert recipe.greeting_from_elsewhere.greeting == "hi"
        # A broken entry point of another package is skipped with a warning, not an error.
        with pytest.raises(ConfigurationError, match="no algorithm named 'broken_elsewhere'"):
            get_algorithm("broken_elsewhere")
    finally:
        unregister_addon("greeting_from_elsewhere")
        sys.modules.pop("greeting_plugin", None)
