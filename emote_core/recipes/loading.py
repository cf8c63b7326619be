"""Finding, reading, overriding, validating and writing recipes (TOML files)."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import math
import tomllib
import types
import typing
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import Any

from emote_core.algorithms.registry import (
    addon_names,
    algorithm_names,
    find_plugin,
    get_addon,
    get_algorithm,
)
from emote_core.errors import ConfigurationError, UsageError
from emote_core.recipes.locations import RECIPE_SUFFIX, available_recipes, recipe_directories
from emote_core.recipes.schema import Recipe, check_num_envs
from emote_core.utils.files import read_regular_file

RECIPE_LIMIT = 16 << 20
"""The largest recipe file read; hand-written TOML is a few kilobytes."""
_SECTIONS = "sections"  # Recipe's field for plug-in tables; they stand at the top level in TOML
_NOT_TOML = frozenset({_SECTIONS, "env_search_paths"})  # Recipe's fields no TOML key sets


def find_recipe(name_or_path: str | Path) -> Path:
    """The recipe file for a path or a recipe name.

    Raises:
        UsageError: If neither exists, suggesting the closest recipe names.
    """
    candidate = Path(name_or_path)
    if candidate.exists() and not candidate.is_dir():  # a pipe or device: refused when read
        return candidate
    name = candidate.name.removesuffix(RECIPE_SUFFIX)
    for directory in recipe_directories():
        path = directory / f"{name}{RECIPE_SUFFIX}"
        if path.is_file():
            return path
    known = available_recipes()
    close = difflib.get_close_matches(name, known, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; recipes: {', '.join(known)}"
    raise UsageError(f"no recipe file or recipe named '{name_or_path}'{hint}")


def load_recipe(name_or_path: str | Path, overrides: Sequence[str] = ()) -> Recipe:
    """Reads a recipe, applies ``key=value`` overrides and validates every value.

    The recipe remembers its file's directory (``env_search_paths``), where the env's modules
    are looked for.

    Args:
        name_or_path: A TOML file, or the name of one in :func:`recipe_directories`.
        overrides: ``section.key=value`` strings; values use TOML syntax (``3e-4``, ``true``,
            ``[64, 64]``), anything that is not valid TOML is taken as a string.

    Raises:
        UsageError: For a name that names no recipe, and for an override that is not
            ``key=value`` or that the recipe refuses (an unknown key, a wrong type, a value
            that makes no sense): the command line is wrong, the recipe file is not.
        ConfigurationError: For a file that is not UTF-8 TOML text, invalid TOML, unknown keys
            (with the closest known key), wrong-typed values or values that make no sense.
    """
    path = find_recipe(name_or_path)
    text = _recipe_text(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigurationError(f"recipe '{path}' is not valid TOML: {error}") from error
    data.setdefault("name", path.stem)
    states = [copy.deepcopy(data)]  # the file, then the file with each override added
    for override in overrides:
        apply_override(data, override)
        states.append(copy.deepcopy(data))
    try:
        recipe = recipe_from_dict(data, source=str(path))
    except ConfigurationError as error:
        refused = _refused_override(states, overrides)
        if refused is None:
            raise
        raise UsageError(str(refused)) from error
    recipe.env_search_paths = (str(path.resolve().parent),)
    return recipe


def with_env(recipe: Recipe, env: str) -> Recipe:
    """The recipe with its env replaced by ``env`` (a command's ``--env``): an entry point when
    the text after ``:`` is a dotted Python name (``myenv:PointEnv``), else a gymnasium id
    (``Pendulum-v1``, ``myenv:PointEnv-v0``).

    Raises:
        UsageError: If ``env`` is empty.
    """
    from emote_core.env.making import is_entry_point_text

    text = env.strip()
    if not text:
        raise UsageError("`env` takes an env id or an entry point 'module:callable'; got ''")
    if is_entry_point_text(text):
        changed = dataclasses.replace(recipe.env, entry_point=text)
    else:
        changed = dataclasses.replace(recipe.env, id=text, entry_point=None)
    return dataclasses.replace(recipe, env=changed)


def _recipe_text(path: Path) -> str:
    """The text of a recipe file; binary files are refused before TOML sees them.

    Raises:
        ConfigurationError: If the file holds NUL bytes or is not UTF-8 text.
        FormatError: If it is not a regular file (a pipe, a device) or is over RECIPE_LIMIT.
    """
    data = read_regular_file(
        path, limit=RECIPE_LIMIT, rule="a recipe is a TOML text file; pass one or a recipe name"
    )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or "\0" in text:
        raise ConfigurationError(
            f"'{path}' is not a TOML recipe file (it holds binary data, not UTF-8 text); pass a "
            f"recipe file or a recipe name ({', '.join(available_recipes())})"
        )
    return text


def _refused_override(
    states: list[dict[str, Any]], overrides: Sequence[str]
) -> ConfigurationError | None:
    """Why the override that broke a recipe was refused, its message starting with the override.

    ``states[k]`` is the recipe with the first ``k`` overrides applied; the last one is invalid.
    The culprit is the override after the last valid state. ``None`` when no state is valid: the
    file itself is wrong, and the caller's error stands.
    """
    for count in reversed(range(len(overrides))):
        try:
            recipe_from_dict(copy.deepcopy(states[count]))
        except ConfigurationError:
            continue
        try:
            recipe_from_dict(
                copy.deepcopy(states[count + 1]), source=f"`overrides={overrides[count]!r}`"
            )
        except ConfigurationError as error:
            return error
        return None  # not reached: a state after the last valid one is invalid
    return None


def apply_override(data: dict[str, Any], override: str) -> None:
    """Sets ``section.key=value`` in a recipe dict (creating the section when missing).

    Raises:
        UsageError: If the override is not ``key=value``, or sets a key inside a value.
    """
    key, separator, raw = override.partition("=")
    key = key.strip()
    if not separator or not key:
        raise UsageError(
            f"`overrides` takes KEY=VALUE such as training.bp_steps=1000; got '{override}'"
        )
    try:
        value = tomllib.loads(f"value = {raw.strip()}")["value"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    target = data
    *sections, leaf = key.split(".")
    for section in sections:
        node = target.setdefault(section, {})
        if not isinstance(node, dict):
            raise UsageError(f"`overrides={override!r}`: '{section}' is a value, not a table")
        target = node
    target[leaf] = value


def recipe_from_dict(data: dict[str, Any], *, source: str = "recipe") -> Recipe:
    """Builds a :class:`Recipe` from plain data, checking every key and type.

    Tables named after a registered algorithm or add-on (``[sac]``, ...) are read with the
    dataclass that plug-in declares; the recipe's algorithm and add-ons get their defaults when
    their tables are missing.

    Raises:
        ConfigurationError: For unknown keys or tables, wrong types, an algorithm or add-on that
            is not registered, or values that make no sense.
    """
    if not isinstance(data, dict):
        raise ConfigurationError(f"{source}: a recipe must be a table; got {data!r}")
    base = {f.name for f in dataclasses.fields(Recipe)} - _NOT_TOML
    plain = {key: value for key, value in data.items() if key in base}
    tables = {key: value for key, value in data.items() if key not in base}
    recipe = _build(Recipe, plain, source, "", exclude=_NOT_TOML)
    try:  # the algorithm first: a plug-in nobody registered also leaves its table unknown
        plugins = [get_algorithm(recipe.algorithm)] + [get_addon(name) for name in recipe.addons]
    except ConfigurationError as error:
        raise ConfigurationError(f"{source}: {error}") from error
    recipe.sections = {
        name: _plugin_table(name, value, source, base) for name, value in tables.items()
    }
    if len(set(recipe.addons)) != len(recipe.addons):
        raise ConfigurationError(f"{source}: 'addons' names an add-on twice: {recipe.addons}")
    for plugin in plugins:
        if plugin.name in base:
            raise ConfigurationError(
                f"{source}: plug-in '{plugin.name}' is named like the recipe's own '{plugin.name}' "
                "key; register it under another name"
            )
        recipe.sections.setdefault(plugin.name, plugin.default_config())
    validate_recipe(recipe, source)
    return recipe


def _plugin_table(name: str, value: Any, source: str, base: set[str]) -> Any:
    """The typed table ``[name]`` of a registered plug-in."""
    plugin = find_plugin(name)
    if plugin is None:
        known = sorted(base) + algorithm_names() + addon_names()
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigurationError(
            f"{source}: unknown key '{name}'{hint} (known: {', '.join(known)})"
        )
    return _build(plugin.config_class, value, source, name)


def _build(
    cls: type, data: Any, source: str, where: str, exclude: frozenset[str] = frozenset()
) -> Any:
    if not isinstance(data, dict):
        raise ConfigurationError(f"{source}: '{where}' must be a table; got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in exclude}
    hints = typing.get_type_hints(cls)
    unknown = [key for key in data if key not in fields]
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(key, list(fields), n=1)
        hint = f"; did you mean '{_join(where, close[0])}'?" if close else ""
        raise ConfigurationError(
            f"{source}: unknown key '{_join(where, key)}'{hint} (known: {', '.join(fields)})"
        )
    values = {name: _convert(hints[name], value, source, _join(where, name))
              for name, value in data.items()}  # fmt: skip
    return cls(**values)


def _convert(hint: Any, value: Any, source: str, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _convert(option, value, source, where)
            except ConfigurationError as error:
                errors.append(error)
        raise errors[0]
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, source, where)  # type: ignore[arg-type]
    if isinstance(hint, type) and issubclass(hint, Enum):
        members = [m.value for m in hint]
        if value not in members:
            close = difflib.get_close_matches(str(value), [str(m) for m in members], n=1)
            hint_text = f"; did you mean '{close[0]}'?" if close else ""
            raise ConfigurationError(
                f"{source}: '{where}' must be one of {members}; got {value!r}{hint_text}"
            )
        return hint(value)
    if origin is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise _type_error(source, where, "a list", value)
        return [_convert(item, v, source, f"{where}[{k}]") for k, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise _type_error(source, where, "a table", value)
        return dict(value)
    if hint is bool:
        if not isinstance(value, bool):
            raise _type_error(source, where, "true or false", value)
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _type_error(source, where, "an integer", value)
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _type_error(source, where, "a number", value)
        if math.isnan(value):  # TOML has `nan`; no knob of a recipe means anything by it
            raise ConfigurationError(f"{source}: '{where}' must be a number; got nan")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise _type_error(source, where, "a string", value)
        return value
    if hint is object:
        return value
    raise ConfigurationError(f"{source}: '{where}' has an unsupported type {hint!r}")


def _type_error(source: str, where: str, expected: str, value: Any) -> ConfigurationError:
    return ConfigurationError(
        f"{source}: '{where}' must be {expected}; got {value!r} ({type(value).__name__})"
    )


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def validate_recipe(recipe: Recipe, source: str = "recipe") -> None:
    """Checks values that have a valid type but make no sense (a zero batch size, say)."""
    positive = {
        "env.num_envs": recipe.env.num_envs,
        "memory.maxlen": recipe.memory.maxlen,
        "memory.batch_size": recipe.memory.batch_size,
        "memory.rollout_length": recipe.memory.rollout_length,
        "memory.batches_per_sample": recipe.memory.batches_per_sample,
        "training.bp_steps": recipe.training.bp_steps,
        "training.inference_steps_per_batch": recipe.training.inference_steps_per_batch,
        "training.bp_steps_per_inference": recipe.training.bp_steps_per_inference,
        "training.checkpoint_interval": recipe.training.checkpoint_interval,
        "training.log_interval": recipe.training.log_interval,
        "eval.episodes": recipe.eval.episodes,
        "memory.follow_interval": recipe.memory.follow_interval,
    }
    for key, value in positive.items():
        if value < 1:
            raise ConfigurationError(f"{source}: '{key}' must be at least 1; got {value}")
    non_negative = {
        "memory.warmup_steps": recipe.memory.warmup_steps,
        "training.export_interval": recipe.training.export_interval,
        "eval.interval": recipe.eval.interval,
        "eval.seed": recipe.eval.seed,
        "memory.follow_min_seconds": recipe.memory.follow_min_seconds,
        "training.publish_interval": recipe.training.publish_interval or 0,
    }
    for key, value in non_negative.items():
        if value < 0:
            raise ConfigurationError(f"{source}: '{key}' must be >= 0; got {value}")
    if not math.isfinite(recipe.memory.follow_min_seconds):
        raise ConfigurationError(
            f"{source}: 'memory.follow_min_seconds' must be a finite number of seconds; got "
            f"{recipe.memory.follow_min_seconds}"
        )
    clip = recipe.env.observation_clip
    if not (math.isfinite(clip) and clip > 0):
        raise ConfigurationError(
            f"{source}: 'env.observation_clip' bounds normalised observations and must be a "
            f"finite number above 0 (such as 10.0); got {clip}"
        )
    try:
        check_num_envs(recipe.env.num_envs)
    except ConfigurationError as error:
        raise ConfigurationError(f"{source}: {error}") from None
    recipe.memory.check(source)
    if not recipe.logging.wandb_project.strip():
        raise ConfigurationError(
            f"{source}: 'logging.wandb_project' must name a W&B project; got an empty string"
        )
    for name, config in recipe.sections.items():
        _check_learning_rates(config, name, source)
        plugin = find_plugin(name)
        if plugin is not None:
            plugin.validate(config, source=source)


def is_learning_rate(field_name: str) -> bool:
    """Whether a plug-in table's field is a learning rate, by its name: ``learning_rate``,
    ``lr``, or ending in ``_learning_rate`` / ``_lr`` (``critic_lr``)."""
    return field_name in ("learning_rate", "lr") or field_name.endswith(("_learning_rate", "_lr"))


def _check_learning_rates(config: Any, where: str, source: str) -> None:
    """Every learning rate of a plug-in table (nested tables included) is finite and above 0;
    an optimiser given 0, a negative or an infinite rate fails at its first step, or never learns.
    """
    if not dataclasses.is_dataclass(config):
        return
    for field in dataclasses.fields(config):
        value, key = getattr(config, field.name), _join(where, field.name)
        if dataclasses.is_dataclass(value):
            _check_learning_rates(value, key, source)
        elif (
            is_learning_rate(field.name)
            and isinstance(value, int | float)
            and not isinstance(value, bool)
            and not (math.isfinite(value) and value > 0)
        ):
            raise ConfigurationError(
                f"{source}: '{key}' is a learning rate and must be a finite number above 0 "
                f"(such as 3e-4); got {value}"
            )


def recipe_to_dict(recipe: Recipe) -> dict[str, Any]:
    """Plain data of a recipe (enums as their values, plug-in tables at the top level), as
    :func:`recipe_from_dict` reads it."""
    data = json.loads(json.dumps(dataclasses.asdict(recipe), default=str))
    data.pop("env_search_paths", None)
    sections = data.pop(_SECTIONS)
    return data | sections


def recipe_to_toml(recipe: Recipe) -> str:
    """The recipe as TOML that :func:`load_recipe` reads back to an equal recipe."""
    data = recipe_to_dict(recipe)
    lines = [f"{key} = {_toml_value(value)}" for key, value in data.items()
             if not isinstance(value, dict)]  # fmt: skip
    for section, values in data.items():
        if isinstance(values, dict):
            lines += ["", f"[{section}]"]
            lines += [f"{key} = {_toml_value(value)}" for key, value in values.items()
                      if value is not None]  # fmt: skip
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        # TOML has no null: an unset optional key of a nested table is left out, as above.
        items = ", ".join(
            f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items() if v is not None
        )
        return "{" + items + "}"
    raise ConfigurationError(f"cannot write {value!r} to TOML")


__all__ = [
    "apply_override",
    "available_recipes",
    "find_recipe",
    "is_learning_rate",
    "load_recipe",
    "recipe_directories",
    "recipe_from_dict",
    "recipe_to_dict",
    "recipe_to_toml",
    "validate_recipe",
    "with_env",
]
