"""Recipes: the shipped files load, overrides apply, mistakes are named with a fix."""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from emote_core.errors import ConfigurationError, UsageError
from emote_core.recipes import (
    available_recipes,
    load_recipe,
    recipe_from_dict,
    recipe_to_toml,
)
from emote_core.recipes.loading import is_learning_rate, validate_recipe
from emote_core.recipes.schema import SamplerKind


def test_every_shipped_recipe_loads_and_round_trips_through_toml() -> None:
    names = available_recipes()
    assert {"sac_hit_the_middle", "sac_pendulum", "dqn_cartpole", "sac_lunar_lander"} <= set(names)
    for name in names:
        recipe = load_recipe(name)
        assert recipe.name == name
        assert recipe_from_dict(tomllib.loads(recipe_to_toml(recipe))) == recipe


def test_shipped_recipes_pick_the_right_algorithm_for_their_env() -> None:
    assert load_recipe("dqn_cartpole").algorithm == "dqn"
    lander = load_recipe("sac_lunar_lander")
    assert lander.env.id == "LunarLander-v3" and lander.env.kwargs == {"continuous": True}


def test_overrides_use_toml_values_and_create_nothing_unknown() -> None:
    recipe = load_recipe(
        "sac_pendulum",
        ["training.bp_steps=12", "sac.hidden_dims=[32, 16]", "env.kwargs.g=9.81", "seed=3"],
    )
    assert recipe.training.bp_steps == 12
    assert recipe.sac.hidden_dims == [32, 16]
    assert recipe.env.kwargs == {"g": 9.81}
    assert recipe.seed == 3


def test_eval_and_logging_tables_load_and_round_trip() -> None:
    from emote_core.recipes import WandbMode

    defaults = load_recipe("sac_pendulum", ["eval.interval=0"])
    assert defaults.eval.deterministic is True and defaults.eval.seed != defaults.seed
    assert defaults.logging.wandb is False and defaults.logging.wandb_mode is WandbMode.OFFLINE
    assert load_recipe("sac_hit_the_middle").eval.interval == 500  # the shipped ones evaluate

    recipe = load_recipe(
        "sac_pendulum",
        ["eval.interval=250", "eval.deterministic=false", "eval.seed=77", "logging.wandb=true",
         "logging.wandb_project='p'", "logging.wandb_entity='team'",
         "logging.wandb_mode='online'"],
    )  # fmt: skip
    assert (recipe.eval.interval, recipe.eval.deterministic, recipe.eval.seed) == (250, False, 77)
    assert recipe.logging.wandb and recipe.logging.wandb_mode is WandbMode.ONLINE
    assert (recipe.logging.wandb_project, recipe.logging.wandb_entity) == ("p", "team")
    assert recipe_from_dict(tomllib.loads(recipe_to_toml(recipe))) == recipe


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("training.bp_step=1", "unknown key 'training.bp_step'; did you mean 'training.bp_steps'"),
        ("sac.learning_rate=fast", "'sac.learning_rate' must be a number; got 'fast'"),
        ("algorithm=sacc", "did you mean 'sac'"),
        ("training.bp_steps=0", "'training.bp_steps' must be at least 1"),
        ("training.export_interval=-5", "'training.export_interval' must be >= 0; got -5"),
        ("memory.store_episodes=1", "'memory.store_episodes' must be true or false"),
        ("training.bp_steps", "`overrides` takes KEY=VALUE"),
        ("sac.gamma=1.5", "'sac.gamma' must be within [0, 1]"),
        ("eval.interval=-1", "'eval.interval' must be >= 0; got -1"),
        ("eval.seed=-3", "'eval.seed' must be >= 0; got -3"),
        ("eval.deterministic=1", "'eval.deterministic' must be true or false"),
        ("logging.wandb_mode=offlin", "'logging.wandb_mode' must be one of ['offline', 'online']"),
        ("logging.wandb_project=' '", "'logging.wandb_project' must name a W&B project"),
        ("memory.sampler=priority", "did you mean 'prioritized'"),
        (
            "memory.priority_alpha=0.7",
            "'memory.priority_alpha' = 0.7 is a setting of prioritized replay but 'memory.sampler' "
            "is 'uniform'; set memory.sampler = \"prioritized\"",
        ),
    ],
)
def test_mistakes_are_named_with_a_fix(override: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        load_recipe("sac_pendulum", [override])
    assert message in str(caught.value)


def test_unknown_recipe_names_suggest_the_closest(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="did you mean sac_pendulum"):
        load_recipe("sac_pendulumm")
    broken = tmp_path / "broken.toml"
    broken.write_text("algorithm = sac\n")
    with pytest.raises(ConfigurationError, match="is not valid TOML"):
        load_recipe(broken)


def test_a_recipe_file_outside_the_recipes_folder_loads_by_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text('algorithm = "dqn"\n[env]\nid = "CartPole-v1"\n')
    recipe = load_recipe(path)
    assert recipe.name == "mine" and recipe.algorithm == "dqn"
    assert recipe.dqn.hidden_dims == [256, 256]  # defaults fill what the file leaves out


def test_recipes_installed_with_a_wheel_are_found_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A wheel puts the shipped recipes under <prefix>/share/emote/recipes (pyproject data-files).
    installed = tmp_path / "prefix" / "share" / "emote" / "recipes"
    installed.mkdir(parents=True)
    (installed / "wheel_only.toml").write_text('algorithm = "dqn"\n[env]\nid = "CartPole-v1"\n')
    monkeypatch.setattr("sys.prefix", str(tmp_path / "prefix"))
    monkeypatch.chdir(tmp_path)
    assert "wheel_only" in available_recipes()
    assert load_recipe("wheel_only").algorithm == "dqn"
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    data_files = pyproject["tool"]["setuptools"]["data-files"]
    assert data_files == {"share/emote/recipes": ["recipes/*.toml"]}


BEFORE_PLUGINS = sorted((Path(__file__).parent / "data").glob("*_as_written_before_plugins.toml"))


@pytest.mark.parametrize("path", BEFORE_PLUGINS, ids=lambda p: p.name)
def test_run_recipes_written_before_algorithms_plugged_in_still_load(path: Path) -> None:
    """Run directories kept a recipe.toml with both [sac] and [dqn] tables (the schema had both)."""
    name = path.name.removesuffix("_as_written_before_plugins.toml")
    old = load_recipe(path)
    shipped = load_recipe(name)
    assert old.algorithm == shipped.algorithm and old.config == shipped.config
    assert set(old.sections) == {"sac", "dqn"}
    # Evaluation while training came later: those runs evaluate only at the end. Storing live
    # episodes became the default later too; their recipe.toml says what they did.
    assert (old.env, old.memory, old.training, old.eval) == (
        shipped.env, replace(shipped.memory, store_episodes=old.memory.store_episodes),
        shipped.training, replace(shipped.eval, interval=0),
    )  # fmt: skip


def test_recipe_tables_written_before_plugins_are_all_here() -> None:
    assert len(BEFORE_PLUGINS) == 2


@pytest.mark.parametrize(
    "content",
    [b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", b'algorithm = "sac"\x00\n', b"\xff\xfe\x00a"],
)
def test_a_binary_file_is_not_a_toml_recipe_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "policy.bin"
    path.write_bytes(content)
    with pytest.raises(ConfigurationError) as caught:
        load_recipe(path)
    assert not isinstance(caught.value, UsageError)
    assert str(caught.value).startswith(f"'{path}' is not a TOML recipe file")
    assert "sac_pendulum" in str(caught.value)  # names what would work


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("sac.learning_rate=nan", "'sac.learning_rate' must be a number; got nan"),
        ("sac.learning_rate=-3e-4", "'sac.learning_rate' is a learning rate and must be a finite"),
        ("sac.learning_rate=0", "must be a finite number above 0 (such as 3e-4); got 0.0"),
        ("sac.learning_rate=inf", "got inf"),
        ("sac.tau=nan", "'sac.tau' must be a number; got nan"),
        ("eval.min_return=nan", "'eval.min_return' must be a number; got nan"),
    ],
)
def test_learning_rates_are_finite_and_positive_and_no_number_is_nan(
    override: str, message: str
) -> None:
    with pytest.raises(UsageError) as caught:
        load_recipe("sac_pendulum", [override])
    assert str(caught.value).startswith(f"`overrides={override!r}`: ")
    assert message in str(caught.value)
    assert load_recipe("sac_pendulum", ["eval.min_return=-inf"]).eval.min_return == float("-inf")


@dataclasses.dataclass
class _Critic:
    critic_lr: float = 1e-3


@dataclasses.dataclass
class _Table:
    actor_learning_rate: float = 3e-4
    critic: _Critic = dataclasses.field(default_factory=_Critic)
    lr_decay: float = 0.0  # not a learning rate: only the name's end counts


def test_learning_rates_of_plug_in_tables_are_found_by_name_nested_tables_included() -> None:
    assert [is_learning_rate(n) for n in ("lr", "learning_rate", "critic_lr", "lr_decay")] == [
        True, True, True, False,
    ]  # fmt: skip
    recipe = load_recipe("sac_pendulum")
    recipe.sections["mine"] = _Table()  # a table the plug-in's own validate knows nothing of
    validate_recipe(recipe, "mine.toml")  # defaults are fine, lr_decay = 0 included
    recipe.sections["mine"] = _Table(critic=_Critic(critic_lr=-1.0))
    with pytest.raises(ConfigurationError, match=r"mine.toml: 'mine.critic.critic_lr' is a lea"):
        validate_recipe(recipe, "mine.toml")


def test_overrides_that_the_recipe_refuses_are_usage_errors_the_file_s_are_not(
    tmp_path: Path,
) -> None:
    with pytest.raises(UsageError, match="did you mean sac_pendulum"):
        load_recipe("sac_pendulm")
    with pytest.raises(UsageError, match=r"^`overrides='training\.bp_step=1'`: unknown key"):
        load_recipe("sac_pendulum", ["training.bp_step=1"])
    path = tmp_path / "zero.toml"
    path.write_text("[training]\nbp_steps = 0\n")
    with pytest.raises(ConfigurationError) as caught:
        load_recipe(path, ["seed=3"])
    assert not isinstance(caught.value, UsageError)
    assert str(caught.value).startswith(f"{path}: 'training.bp_steps' must be at least 1")
    assert load_recipe(path, ["training.bp_steps=5"]).training.bp_steps == 5


def test_prioritized_replay_is_chosen_and_tuned_from_the_memory_table() -> None:
    recipe = load_recipe(
        "sac_pendulum",
        ["memory.sampler='prioritized'", "memory.priority_alpha=0.5", "memory.priority_beta=0.3",
         "memory.priority_beta_final=0.9", "memory.priority_epsilon=0.01"],
    )  # fmt: skip
    memory = recipe.memory
    assert memory.sampler is SamplerKind.PRIORITIZED
    assert (memory.priority_alpha, memory.priority_beta) == (0.5, 0.3)
    assert (memory.priority_beta_final, memory.priority_epsilon) == (0.9, 0.01)
    assert recipe_from_dict(tomllib.loads(recipe_to_toml(recipe))) == recipe
    assert load_recipe("sac_pendulum").memory.sampler is SamplerKind.UNIFORM


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("memory.priority_beta=1.5", "'memory.priority_beta' must be in [0.0, 1.0]; got 1.5"),
        ("memory.priority_beta_final=-0.1", "'memory.priority_beta_final' must be in [0.0, 1.0]"),
        ("memory.priority_alpha=-1", "'memory.priority_alpha' must be finite and >= 0.0; got -1"),
        ("memory.priority_alpha=inf", "'memory.priority_alpha' must be finite and >= 0.0; got inf"),
        ("memory.priority_epsilon=0", "'memory.priority_epsilon' must be above 0"),
    ],
)
def test_prioritized_replay_settings_out_of_range_are_refused(override: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        load_recipe("sac_pendulum", ["memory.sampler='prioritized'", override])
    assert message in str(caught.value)


def test_more_environments_than_one_process_steps_are_refused_with_the_reason(
    tmp_path: Path,
) -> None:
    from emote_core.recipes.schema import MAX_NUM_ENVS

    assert load_recipe("sac_pendulum", [f"env.num_envs={MAX_NUM_ENVS}"]).env.num_envs == 4096
    path = tmp_path / "many.toml"
    path.write_text('algorithm = "sac"\n[env]\nnum_envs = 100_000\n')
    with pytest.raises(ConfigurationError) as caught:
        load_recipe(path)
    assert str(caught.value) == (
        f"{path}: env.num_envs = 100,000 is more than 4,096, the most environments one process "
        "steps together (one after another: more add memory, not speed); lower env.num_envs "
        "(emote collect --workers N spreads collection over processes)"
    )
    with pytest.raises(
        UsageError, match=r"^`overrides='env\.num_envs=4097'`: env\.num_envs = 4,097 is"
    ):
        load_recipe("sac_pendulum", ["env.num_envs=4097"])


def test_a_recipe_that_is_a_pipe_or_a_device_is_refused_unread(tmp_path: Path, no_hang) -> None:
    import os

    from emote_core.errors import FormatError

    pipe = tmp_path / "pipe.toml"
    os.mkfifo(pipe)  # reading it would wait for a writer forever
    with pytest.raises(FormatError, match=r"pipe\.toml' is not a file \(mode p"):
        load_recipe(pipe)
    device = tmp_path / "zero.toml"
    device.symlink_to("/dev/zero")  # reading it would never end
    with pytest.raises(FormatError, match=r"zero\.toml' is not a file \(mode c"):
        load_recipe(device)
