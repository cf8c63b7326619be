"""How an environment is made: by gymnasium id, ``module:EnvId`` or ``module:callable``.

An :class:`EnvSource` says what to make and where the user's modules are looked for;
:func:`env_factory` turns it into a callable giving one env (a ``gymnasium.Env``, or a PettingZoo
``ParallelEnv`` as it is); :func:`env_record` writes down how it was made (the user's module files
and their sha256), which :meth:`EnvSource.from_record` checks and rebuilds from.

Modules are looked for on ``sys.path`` (so ``PYTHONPATH``), then in the source's
``search_paths`` (the recipe file's directory, the current directory). Those directories are put
at the front of ``sys.path`` only while emote imports or makes env code, and taken away again;
modules imported stay imported for the process.

``entry_point`` wins over ``id`` when a source has both (a recipe always has an id: its default).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import hashlib
import importlib
import importlib.util
import logging
import math
import re
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import gymnasium

from emote_core.errors import ConfigurationError
from emote_core.utils.dependencies import EXTRAS, dependency_error

log = logging.getLogger(__name__)

RECORD_VERSION = 1
"""The version of :func:`env_record`'s layout (``record_version``)."""
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_ENTRY_POINT = re.compile(rf"({_NAME}(?:\.{_NAME})*):({_NAME}(?:\.{_NAME})*)$")
_OWN_PACKAGES = ("gymnasium", "emote_core")  # envs of these are not the user's code to record


@dataclass(frozen=True)
class EnvSource:
    """What env to make and where the user's modules are found.

    Args:
        id: A registered gymnasium id, or ``module:EnvId`` (the module is imported first).
        entry_point: ``package.module:callable``, a class or factory called with ``kwargs``;
            wins over ``id`` when both are given.
        kwargs: Keyword arguments of the env's constructor (``gymnasium.make``'s for ids).
        imports: Modules imported first (those that register ids).
        max_episode_steps: Episodes are cut (truncated) at this many steps.
        search_paths: Directories where modules are looked for after ``sys.path``.
    """

    id: str | None = None
    entry_point: str | None = None
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    imports: tuple[str, ...] = ()
    max_episode_steps: int | None = None
    search_paths: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """The entry point, else the id: how messages and records name the env."""
        return self.entry_point or self.id or "?"

    @property
    def kind(self) -> str:
        """``"entry_point"`` or ``"id"``."""
        return "entry_point" if self.entry_point else "id"

    @classmethod
    def from_record(
        cls, record: Mapping[str, Any], *, search_paths: Sequence[str] = ()
    ) -> EnvSource:
        """The source a :func:`env_record` describes, its modules' directories searched first.

        Checks the record against the files now (:func:`check_env_record`).

        Raises:
            ConfigurationError: If the record is malformed or a recorded module file is gone.
        """
        check_env_record(record)
        kind = record.get("kind")
        value = record.get(kind) if kind in ("id", "entry_point") else None
        if not isinstance(value, str):
            raise ConfigurationError(
                f"env record kind {kind!r} names no id or entry point ({_short(record)}); the "
                "run's env record is damaged — pass the env again (`env` or `recipe`)"
            )
        kwargs = record.get("kwargs") or {}
        imports = record.get("imports") or []
        steps = record.get("max_episode_steps")
        return cls(
            id=value if kind == "id" else None,
            entry_point=value if kind == "entry_point" else None,
            kwargs=dict(kwargs) if isinstance(kwargs, Mapping) else {},
            imports=tuple(str(name) for name in imports),
            max_episode_steps=steps if isinstance(steps, int) else None,
            search_paths=tuple(dict.fromkeys([*recorded_search_paths(record), *search_paths])),
        )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


@contextlib.contextmanager
def searching(paths: Sequence[str]) -> Iterator[None]:
    """Puts the directories of ``paths`` missing from ``sys.path`` at its front, then takes them
    away again (imports done meanwhile stay in ``sys.modules``)."""
    added = [p for p in dict.fromkeys(str(Path(p)) for p in paths if p) if p not in sys.path]
    sys.path[:0] = added
    try:
        yield
    finally:
        for path in added:
            with contextlib.suppress(ValueError):
                sys.path.remove(path)


def _where(paths: Sequence[str]) -> str:
    shown = [p for p in dict.fromkeys(str(Path(p)) for p in paths if p)]
    return "PYTHONPATH" + (f", {', '.join(shown)}" if shown else "")


def import_module(name: str, paths: Sequence[str], *, role: str) -> Any:
    """Imports ``name`` with ``paths`` searched after ``sys.path``.

    Raises:
        ConfigurationError: If it is not found there (naming where it was looked for), or its
            import fails (with the error's first line).
    """
    with searching(paths):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name is not None and error.name.split(".")[0] in EXTRAS:
                # a package one of emote's extras installs (pettingzoo, mpe2, mujoco, ...)
                raise dependency_error(f"{role} module '{name}'", error.name) from error
            if (
                error.name is not None
                and name != error.name
                and not name.startswith(f"{error.name}.")
            ):  # the module was found, but something it imports is not
                raise ConfigurationError(
                    f"{role} module '{name}' imports '{error.name}', which is not installed; "
                    "install it, or fix the import"
                ) from error
            raise ConfigurationError(
                f"{role} module '{name}' is not importable: not found on {_where(paths)}; put "
                "the file beside the recipe or in the current directory, or add its directory to "
                "PYTHONPATH"
            ) from error
        except ConfigurationError:
            raise
        except Exception as error:
            first = (str(error).splitlines() or [""])[0]
            raise ConfigurationError(
                f"{role} module '{name}' failed to import: {type(error).__name__}: {first}; fix "
                "the module (run it with python to see the traceback)"
            ) from error


def _parse_entry_point(text: str) -> tuple[str, str]:
    match = _ENTRY_POINT.match(text.strip())
    if match is None:
        raise ConfigurationError(
            f"env entry point must be 'package.module:callable' (such as 'myenv:PointEnv'); got "
            f"{text!r}"
        )
    return match.group(1), match.group(2)


def is_entry_point_text(text: str) -> bool:
    """Whether ``text`` reads as an entry point (``module:callable``, the part after ``:`` a
    dotted Python name) rather than an id (``module:EnvId-v0``, or a plain id)."""
    return _ENTRY_POINT.match(text.strip()) is not None


def _resolve_callable(source: EnvSource) -> Callable[..., Any]:
    assert source.entry_point is not None
    module_name, attribute = _parse_entry_point(source.entry_point)
    target: Any = import_module(module_name, source.search_paths, role="env entry point")
    for part in attribute.split("."):
        if not hasattr(target, part):
            names = [n for n in dir(target) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ConfigurationError(
                f"env entry point '{source.entry_point}': module '{module_name}' has no "
                f"attribute '{attribute}'{hint}"
            )
        target = getattr(target, part)
    if not callable(target):
        raise ConfigurationError(
            f"env entry point '{source.entry_point}' is a value of type "
            f"{type(target).__name__}, not callable; name a class or a function that returns an env"
        )
    return target


def _import_all(source: EnvSource) -> None:
    for name in source.imports:
        import_module(name, source.search_paths, role="env.imports")


def resolve_id(source: EnvSource) -> str:
    """The registered id of an id source, its ``module:`` imported first (and ``imports``).

    Raises:
        ConfigurationError: If a module does not import or the id is not registered, suggesting
            the closest registered ids.
    """
    import emote_core.env  # noqa: F401 - registers emote's own environments

    assert source.id is not None
    _import_all(source)
    module_name, colon, env_id = source.id.rpartition(":")
    if colon:
        import_module(module_name, source.search_paths, role="env id")
    else:
        env_id = source.id
    if env_id in gymnasium.registry:
        return env_id
    if colon:
        own = [i for i, spec in gymnasium.registry.items() if _creator_module(spec) == module_name]
        close = difflib.get_close_matches(env_id, own, n=3, cutoff=0.0)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ConfigurationError(
            f"module '{module_name}' imports but registers no gymnasium id '{env_id}'{hint} "
            "(register it with gymnasium.register, or name a class with entry_point)"
        )
    close = difflib.get_close_matches(env_id, list(gymnasium.registry), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise ConfigurationError(f"'{source.id}' is not a registered gymnasium environment{hint}")


def check_source(source: EnvSource) -> None:
    """Imports what ``source`` names and checks the id is registered or the entry point is a
    callable, without making an env.

    Raises:
        ConfigurationError: For each way it cannot be made (see :func:`env_factory`).
    """
    if source.entry_point:
        _import_all(source)
        _resolve_callable(source)
    else:
        resolve_id(source)


class EnvFactory:
    """Makes one env of a source per call: ``factory(render_mode=None)``.

    Observations and step results are checked on every call (see :class:`CheckedEnv`).
    """

    def __init__(self, source: EnvSource) -> None:
        self.source = source
        check_source(source)

    def __call__(self, render_mode: str | None = None) -> Any:
        source = self.source
        with searching(source.search_paths):
            if source.entry_point:
                env = self._from_entry_point(render_mode)
            else:
                env = self._from_id(render_mode)
        return env

    def _from_entry_point(self, render_mode: str | None) -> Any:
        source = self.source
        kwargs = dict(source.kwargs)
        if render_mode is not None:
            kwargs["render_mode"] = render_mode
        made = _call_user(_resolve_callable(source), kwargs, source.name)
        if is_parallel_env(made):
            return made
        if not isinstance(made, gymnasium.Env):
            raise ConfigurationError(
                f"env entry point '{source.entry_point}' returned a value of type "
                f"{type(made).__name__}, not a gymnasium.Env or a PettingZoo ParallelEnv; make it "
                "return an env (subclass gymnasium.Env)"
            )
        env: Any = CheckedEnv(made, name=source.name)
        if source.max_episode_steps is not None:
            env = gymnasium.wrappers.TimeLimit(env, source.max_episode_steps)
        return env

    def _from_id(self, render_mode: str | None) -> Any:
        from gymnasium.envs.registration import load_env_creator

        source = self.source
        env_id = resolve_id(source)
        _warn_if_outdated(env_id)  # what gymnasium.make says of an id, not of a spec
        spec = gymnasium.spec(env_id)
        creator = spec.entry_point
        if isinstance(creator, str):
            creator = load_env_creator(creator)
        checked = _CheckedCreator(creator, source.name)
        kwargs = dict(source.kwargs)
        if source.max_episode_steps is not None:
            kwargs["max_episode_steps"] = source.max_episode_steps
        if render_mode is not None:
            kwargs["render_mode"] = render_mode
        spec = dataclasses.replace(spec, entry_point=checked)
        made = _call_user(lambda **kw: gymnasium.make(spec, **kw), kwargs, source.name)
        return made


def _warn_if_outdated(env_id: str) -> None:
    """gymnasium's deprecation warning for an id with a newer version registered, which
    ``gymnasium.make`` gives for an id but not for a spec; raised as gymnasium's (its rule)."""
    from gymnasium.envs import registration

    namespace, name, version = registration.parse_env_id(env_id)
    latest = registration.find_highest_version(namespace, name)
    if version is not None and latest is not None and latest > version:
        warnings.warn_explicit(
            f"The environment {env_id} is out of date. You should consider upgrading to "
            f"version `v{latest}`.",
            DeprecationWarning,
            filename=registration.__file__,
            lineno=0,
            module=registration.__name__,
        )


def _call_user(make: Callable[..., Any], kwargs: dict[str, Any], name: str) -> Any:
    """Calls a user's env constructor; a keyword it does not take is a one-line error."""
    try:
        return make(**kwargs)
    except TypeError as error:
        if "argument" not in str(error):
            raise
        raise ConfigurationError(f"env '{name}' rejected env.kwargs: {error}") from error


class _CheckedCreator:
    """A gymnasium env creator whose envs come wrapped in :class:`CheckedEnv`, the innermost
    wrapper, so a wrong step result is caught before gymnasium's wrappers unpack it."""

    def __init__(self, creator: Callable[..., Any], name: str) -> None:
        self.creator = creator
        self.name = name
        meta = getattr(creator, "metadata", None)
        if isinstance(meta, dict):
            self.metadata = meta

    def __call__(self, **kwargs: Any) -> Any:
        made = self.creator(**kwargs)
        if is_parallel_env(made):
            return made
        return CheckedEnv(made, name=self.name)


def _nonfinite(observation: Any) -> str | None:
    """Where ``observation`` holds NaN or inf (``None``: nowhere)."""
    import numpy as np

    if isinstance(observation, np.ndarray):
        if observation.dtype.kind == "f" and not np.isfinite(observation).all():
            index = np.argwhere(~np.isfinite(observation))[0]
            return f"at index {list(map(int, index))}"
        return None
    if isinstance(observation, float):
        return "" if not math.isfinite(observation) else None
    if isinstance(observation, Mapping):
        for key, value in observation.items():
            where = _nonfinite(value)
            if where is not None:
                return f"in '{key}' {where}".rstrip()
    if isinstance(observation, tuple):
        for k, value in enumerate(observation):
            where = _nonfinite(value)
            if where is not None:
                return f"in item {k} {where}".rstrip()
    return None


class CheckedEnv(gymnasium.Wrapper):  # type: ignore[misc]
    """Checks every reset and step of an env: the tuple's length and finite observations.

    Raises:
        ConfigurationError: On a result of the wrong length, or NaN/inf in an observation.
    """

    def __init__(self, env: Any, *, name: str) -> None:
        super().__init__(env)
        self._name = name

    def reset(self, **kwargs: Any) -> Any:
        result = self.env.reset(**kwargs)
        if not isinstance(result, tuple) or len(result) != 2:
            raise ConfigurationError(
                f"env '{self._name}': reset() returned {_arity(result)}; gymnasium envs return "
                "(observation, info) — return both"
            )
        self._check_observation(result[0], "reset()")
        return result

    def step(self, action: Any) -> Any:
        result = self.env.step(action)
        if not isinstance(result, tuple) or len(result) != 5:
            raise ConfigurationError(
                f"env '{self._name}': step() returned {_arity(result)}; gymnasium envs return 5: "
                "(observation, reward, terminated, truncated, info) — the old gym API's 4 "
                "(done) is not supported"
            )
        self._check_observation(result[0], "step()")
        return result

    def _check_observation(self, observation: Any, call: str) -> None:
        where = _nonfinite(observation)
        if where is not None:
            raise ConfigurationError(
                f"env '{self._name}': {call} returned an observation with NaN or inf "
                f"{where}".rstrip()
                + "; fix the env's state (emote cannot learn from it)"
            )


def _arity(result: Any) -> str:
    if isinstance(result, tuple):
        return f"a tuple of {len(result)} values"
    return f"a {type(result).__name__}, not a tuple"


def env_factory(source: EnvSource) -> EnvFactory:
    """A callable ``make(render_mode=None)`` giving one env of ``source`` per call: a
    ``gymnasium.Env`` (ids through ``gymnasium.make``; entry points called with the kwargs, then
    ``TimeLimit`` when ``max_episode_steps`` is set) or a PettingZoo ``ParallelEnv`` as it is.

    Imports the modules the source names now (with its search paths), so what cannot be made
    fails here.

    Raises:
        ConfigurationError: If an entry point is not ``module:callable``, a module is not
            importable, an attribute is missing or not callable, or an id is not registered.
    """
    return EnvFactory(source)


def is_parallel_env(obj: Any) -> bool:
    """Whether ``obj`` is a PettingZoo ``ParallelEnv`` (``False`` without pettingzoo, and for
    gymnasium envs, for which pettingzoo is never imported)."""
    if isinstance(obj, gymnasium.Env):
        return False
    try:
        from pettingzoo.utils.env import ParallelEnv
    except ImportError:
        return False
    return isinstance(obj, ParallelEnv)


def _module_names(source: EnvSource) -> list[str]:
    """The user's modules that ``source`` makes its env from, in order, without repeats."""
    names: list[str] = list(source.imports)
    if source.entry_point:
        names.append(_parse_entry_point(source.entry_point)[0])
    elif source.id is not None:
        module_name, colon, _ = source.id.rpartition(":")
        if colon:
            names.append(module_name)
        spec_module = _spec_module(source)
        if spec_module is not None:
            names.append(spec_module)
    return [n for n in dict.fromkeys(names) if n.split(".")[0] not in _OWN_PACKAGES]


def _creator_module(spec: Any) -> str | None:
    """The module of a registered spec's entry point."""
    entry = spec.entry_point
    if isinstance(entry, str):
        return entry.partition(":")[0]
    return getattr(entry, "__module__", None)


def _spec_module(source: EnvSource) -> str | None:
    try:
        spec = gymnasium.spec(resolve_id(source))
    except (ConfigurationError, gymnasium.error.Error):
        return None
    return _creator_module(spec)


def sha256_file(path: Path) -> str:
    """The sha256 of a file's bytes, in hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _distribution(name: str, file: Path) -> tuple[str | None, str | None]:
    """The installed distribution (and version) whose files hold ``file``, for module ``name``."""
    top = name.split(".")[0]
    for dist_name in metadata.packages_distributions().get(top, []):
        try:
            dist = metadata.distribution(dist_name)
            root = Path(str(dist.locate_file(""))).resolve()
        except Exception:  # a broken distribution's metadata: no version to record
            continue
        if file.resolve().is_relative_to(root):
            return dist_name, dist.version
    return None, None


def _module_entry(name: str) -> dict[str, Any]:
    module = sys.modules.get(name)
    file = getattr(module, "__file__", None)
    if not file:
        return {"name": name, "file": None, "sha256": None, "distribution": None, "version": None}
    path = Path(file).resolve()
    dist, version = _distribution(name, path)
    return {
        "name": name,
        "file": str(path),
        "sha256": sha256_file(path),
        "distribution": dist,
        "version": version,
    }


def env_record(source: EnvSource) -> dict[str, Any]:
    """How the env of ``source`` is made, JSON-ready: ``kind``, the id or entry point, kwargs,
    imports, ``max_episode_steps`` and, per user module, its name, absolute ``file``, ``sha256``
    and the ``distribution`` and ``version`` it is installed from (``None`` for loose files).

    Raises:
        ConfigurationError: If the source cannot be resolved (see :func:`check_source`).
    """
    check_source(source)
    record: dict[str, Any] = {
        "record_version": RECORD_VERSION,
        "kind": source.kind,
        source.kind: source.name,
        "kwargs": _json_ready(dict(source.kwargs)),
        "imports": list(source.imports),
        "max_episode_steps": source.max_episode_steps,
        "modules": [_module_entry(name) for name in _module_names(source)],
    }
    return record


def _json_ready(value: Any) -> Any:
    import json

    return json.loads(json.dumps(value, default=str))


def recorded_search_paths(record: Mapping[str, Any]) -> list[str]:
    """The directories a record's loose (not installed) modules are imported from."""
    paths: list[str] = []
    for entry in _recorded_modules(record):
        file, name = entry.get("file"), entry.get("name")
        if entry.get("version") or not isinstance(file, str) or not isinstance(name, str):
            continue
        root = Path(file).parent
        if Path(file).name == "__init__.py":
            root = root.parent
        for _ in range(name.count(".")):
            root = root.parent
        paths.append(str(root))
    return list(dict.fromkeys(paths))


def _recorded_modules(record: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    modules = record.get("modules") or []
    if not isinstance(modules, list):
        return []
    return [m for m in modules if isinstance(m, Mapping)]


_WARNED: set[str] = set()
"""The changed module files already warned about in this process."""


def check_env_record(record: Mapping[str, Any]) -> None:
    """Checks a record's modules against the files now: a loose module's file must still be
    where it was (a changed sha256 is a warning); an installed one's version may differ (a
    warning).

    Raises:
        ConfigurationError: If a recorded module file moved or vanished, naming the module and
            the recorded path.
    """
    for entry in _recorded_modules(record):
        name, file, digest = entry.get("name"), entry.get("file"), entry.get("sha256")
        if not isinstance(name, str) or not isinstance(file, str):
            continue
        version = entry.get("version")
        if version:
            now = _installed_version(entry.get("distribution"))
            if now is not None and now != version:
                log.warning(
                    "env module '%s' was recorded from %s %s; %s is installed now",
                    name, entry.get("distribution"), version, now,
                )  # fmt: skip
            continue
        path = Path(file)
        if not path.is_file():
            raise ConfigurationError(
                f"env module '{name}' was recorded at '{file}', which no longer exists (moved or "
                "deleted); put the file back there to rebuild the run's env"
            )
        if isinstance(digest, str) and sha256_file(path) != digest and file not in _WARNED:
            _WARNED.add(file)  # one warning per file and process, however often it is checked
            log.warning(
                "env module file '%s' changed since the run recorded it (sha256 differs); the "
                "env may not be the one the policy was trained on",
                file,
            )


def _installed_version(distribution: Any) -> str | None:
    if not isinstance(distribution, str):
        return None
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


__all__ = [
    "RECORD_VERSION",
    "CheckedEnv",
    "EnvFactory",
    "EnvSource",
    "check_env_record",
    "check_source",
    "env_factory",
    "env_record",
    "import_module",
    "is_entry_point_text",
    "is_parallel_env",
    "recorded_search_paths",
    "resolve_id",
    "searching",
    "sha256_file",
]
