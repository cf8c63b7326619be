"""Who made a store: the provenance record of one writing session, and where stores keep it.

A store's root keeps ``env_id``; each shard keeps a ``provenance`` list of :class:`Provenance`
records, one per writing session, each with ``first_episode`` (the shard's episode count when
the session began). Both attributes are optional: readers take their absence as "unknown".
This module holds, hashes and (de)serialises the records; the caller fills them. A store's root
may also keep its :class:`ReferenceReturns` (what a random and an expert policy score on its
environment), the scale of the normalised score.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from emote_core import __version__
from emote_core.errors import ConfigurationError, FormatError

ENV_ID = "env_id"
"""Root attribute: the environment id the store was made on (absent: unknown)."""
PROVENANCE = "provenance"
"""Shard attribute: the list of writing sessions' records (absent: none recorded)."""
FIRST_EPISODE = "first_episode"
"""Key of a shard's session record: the shard's episode count when the session began."""
REFERENCE_RETURNS = "reference_returns"
"""Root attribute: ``{"random", "expert", "source"}`` (absent: none recorded)."""


class PolicyKind(StrEnum):
    """What acted while a session collected."""

    RANDOM = "random"
    """Uniformly random actions."""
    CHECKPOINT = "checkpoint"
    """A training checkpoint (``path`` is the checkpoint file)."""
    ONNX = "onnx"
    """An exported ONNX policy (``path`` is the ``.onnx`` file)."""
    TRAINING = "training"
    """The policy being trained by the run at ``path`` (random during warm-up)."""


def file_sha256(path: str | os.PathLike[str], *, chunk_bytes: int = 1 << 20) -> str:
    """The sha256 hex digest of a file, read in chunks (checkpoints can be large).

    Raises:
        FormatError: If the file cannot be read.
    """
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as file:
            while chunk := file.read(chunk_bytes):
                digest.update(chunk)
    except OSError as error:
        raise FormatError(f"cannot read '{os.fspath(path)}' to hash it ({error})") from error
    return digest.hexdigest()


@dataclass(frozen=True)
class PolicyRecord:
    """The policy a session acted with.

    Attributes:
        kind: A :class:`PolicyKind` (another text when read from a newer emote).
        path: The checkpoint, ONNX file or run directory (``None`` for random actions).
        sha256: The sha256 of the checkpoint or ONNX file (``None`` where there is no file).
    """

    kind: str
    path: str | None = None
    sha256: str | None = None

    @classmethod
    def of_file(cls, kind: str, path: str | os.PathLike[str]) -> PolicyRecord:
        """A checkpoint or ONNX policy, with its absolute path and its file's sha256."""
        return cls(kind, str(Path(path).absolute()), file_sha256(path))

    def to_attrs(self) -> dict[str, Any]:
        return {"kind": str(self.kind), "path": self.path, "sha256": self.sha256}

    @classmethod
    def from_attrs(cls, document: Mapping[str, Any]) -> PolicyRecord:
        return cls(
            kind=str(document.get("kind", "unknown")),
            path=_text(document.get("path")),
            sha256=_text(document.get("sha256")),
        )


@dataclass(frozen=True)
class Provenance:
    """Who wrote a shard's episodes in one session.

    Attributes:
        command: The command line that ran the session (``sys.argv``), or empty when unknown.
        emote_version: The emote that wrote it.
        time: When the session began (ISO 8601, UTC).
        env_id: The environment's gymnasium id or entry point (``None``: not collected from an
            environment).
        env: How the environment was made (:func:`emote_core.env.making.env_record`: id or
            entry point, kwargs, the user's module files and their sha256), as JSON data.
        recipe_name: The recipe's name.
        recipe_toml: The resolved recipe as TOML (it rebuilds the environment and the policy).
        seed: The run's seed (the recipe's, or ``--seed``).
        env_seeds: The seed of each environment's first reset.
        policy: What acted.
        source: For converted stores: the source's ``format``, ``path`` and ``sha256``.
    """

    command: tuple[str, ...] = ()
    emote_version: str = __version__
    time: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    env_id: str | None = None
    env: dict[str, Any] | None = None
    recipe_name: str | None = None
    recipe_toml: str | None = None
    seed: int | None = None
    env_seeds: tuple[int, ...] = ()
    policy: PolicyRecord | None = None
    source: dict[str, Any] | None = None

    def to_attrs(self) -> dict[str, Any]:
        """The record as a JSON-compatible dict (every key present; unknown values ``None``)."""
        return {
            "command": list(self.command),
            "emote_version": self.emote_version,
            "time": self.time,
            "env_id": self.env_id,
            "env": dict(self.env) if self.env is not None else None,
            "recipe_name": self.recipe_name,
            "recipe_toml": self.recipe_toml,
            "seed": self.seed,
            "env_seeds": list(self.env_seeds),
            "policy": self.policy.to_attrs() if self.policy is not None else None,
            "source": dict(self.source) if self.source is not None else None,
        }

    @classmethod
    def from_attrs(cls, document: Mapping[str, Any], *, where: str = "store") -> Provenance:
        """Reads a record written by :meth:`to_attrs`; keys it lacks read as unknown.

        Raises:
            FormatError: If the record is not a JSON object or a value has the wrong type.
        """
        if not isinstance(document, Mapping):
            raise FormatError(f"{where}: a provenance record is not an object: {document!r}")
        try:
            policy = document.get("policy")
            seed = document.get("seed")
            return cls(
                command=tuple(str(part) for part in document.get("command") or ()),
                emote_version=str(document.get("emote_version") or "unknown"),
                time=str(document.get("time") or ""),
                env_id=_text(document.get("env_id")),
                env=dict(document["env"]) if isinstance(document.get("env"), Mapping) else None,
                recipe_name=_text(document.get("recipe_name")),
                recipe_toml=_text(document.get("recipe_toml")),
                seed=int(seed) if seed is not None else None,
                env_seeds=tuple(int(s) for s in document.get("env_seeds") or ()),
                policy=PolicyRecord.from_attrs(policy) if isinstance(policy, Mapping) else None,
                source=dict(document["source"]) if document.get("source") else None,
            )
        except (TypeError, ValueError) as error:
            raise FormatError(f"{where}: a provenance record is malformed ({error})") from error


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def shard_sessions(
    attributes: Mapping[str, Any], *, where: str = "store"
) -> list[tuple[int, Provenance]]:
    """A shard's recorded sessions as ``(first_episode, record)``, oldest first (none: empty).

    Raises:
        FormatError: If the shard's ``provenance`` attribute is malformed.
    """
    recorded = attributes.get(PROVENANCE)
    if recorded is None:
        return []
    if not isinstance(recorded, list):
        raise FormatError(f"{where}: the provenance attribute is not a list: {recorded!r}")
    sessions = []
    for entry in recorded:
        record = Provenance.from_attrs(entry, where=where)
        try:
            first = int(entry.get(FIRST_EPISODE, 0))
        except (TypeError, ValueError) as error:
            raise FormatError(f"{where}: a provenance record is malformed ({error})") from error
        sessions.append((first, record))
    return sessions


def with_session(
    attributes: Mapping[str, Any], record: Provenance, first_episode: int
) -> list[dict[str, Any]]:
    """A shard's ``provenance`` attribute with one more session appended (what a writer stores
    in the same write as the session's first commit)."""
    recorded = attributes.get(PROVENANCE)
    earlier = list(recorded) if isinstance(recorded, list) else []
    return [*earlier, {**record.to_attrs(), FIRST_EPISODE: int(first_episode)}]


def recorded_env_ids(
    root_attributes: Mapping[str, Any], shard_attributes: Sequence[Mapping[str, Any]]
) -> list[str]:
    """Every environment id a store records, at its root and in its shards' sessions, in the
    order first met (empty: the store does not say)."""
    found: list[str] = []
    candidates = [root_attributes.get(ENV_ID)]
    for attributes in shard_attributes:
        recorded = attributes.get(PROVENANCE)
        if isinstance(recorded, list):
            candidates += [e.get("env_id") for e in recorded if isinstance(e, Mapping)]
    for env_id in candidates:
        if isinstance(env_id, str) and env_id and env_id not in found:
            found.append(env_id)
    return found


@dataclass(frozen=True)
class ReferenceReturns:
    """The mean episode returns that anchor the normalised score of an environment.

    Attributes:
        random: What a uniformly random policy scores (normalised score 0).
        expert: What an expert policy scores (normalised score 100).
        source: One line saying how the two were measured.
    """

    random: float
    expert: float
    source: str

    def __post_init__(self) -> None:
        for name in ("random", "expert"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigurationError(
                    f"the reference return '{name}' must be a number; got {value!r}"
                )
            if not math.isfinite(value):
                raise ConfigurationError(
                    f"the reference return '{name}' must be finite; got {value!r} — pass the "
                    "measured mean return"
                )
            object.__setattr__(self, name, float(value))
        if self.random == self.expert:
            raise ConfigurationError(
                f"the reference returns 'random' and 'expert' are both {self.random!r}; they must "
                "differ to scale a score — pass the returns of a random and of an expert policy"
            )
        if not isinstance(self.source, str) or not self.source.strip() or "\n" in self.source:
            raise ConfigurationError(
                f"the reference returns' 'source' must be one line saying how they were "
                f"measured; got {self.source!r}"
            )

    def normalised_score(self, mean_return: float) -> float:
        """``100 * (mean_return - random) / (expert - random)``: 0 scores as the random policy,
        100 as the expert (D4RL's normalised score)."""
        return 100.0 * (float(mean_return) - self.random) / (self.expert - self.random)

    def to_attrs(self) -> dict[str, Any]:
        return {"random": self.random, "expert": self.expert, "source": self.source}

    @classmethod
    def from_attrs(cls, document: Any, *, where: str = "store") -> ReferenceReturns:
        """Reads what :meth:`to_attrs` wrote.

        Raises:
            FormatError: If it is not ``{"random", "expert", "source"}`` with valid values.
        """
        if not isinstance(document, Mapping):
            raise FormatError(
                f"{where}: the '{REFERENCE_RETURNS}' attribute is not an object: {document!r} — "
                "the store is damaged; set it again with set_reference_returns"
            )
        try:
            return cls(
                random=document["random"], expert=document["expert"], source=document["source"]
            )
        except (KeyError, ConfigurationError) as error:
            raise FormatError(
                f"{where}: the '{REFERENCE_RETURNS}' attribute is malformed ({error}) — the "
                "store is damaged; set it again with set_reference_returns"
            ) from error


def set_reference_returns(
    url: str | os.PathLike[str], *, random: float, expert: float, source: str
) -> None:
    """Records a store's reference returns in its root attributes, replacing any recorded.

    The root's metadata is rewritten in one atomic write with every other attribute as it was.

    Args:
        url: An emote-memory store (a path or fsspec URL).
        random: The mean return of a random policy on the store's environment.
        expert: The mean return of an expert policy there.
        source: One line saying how the two were measured.

    Raises:
        ConfigurationError: If a value is not finite, ``random == expert``, or ``source`` is
            not one line.
        FormatError: If there is no emote-memory store at ``url``.
    """
    from emote_core.stores.zarr_store.groups import open_group
    from emote_core.stores.zarr_store.layout import check_format

    record = ReferenceReturns(random=random, expert=expert, source=source)
    location = os.fspath(url)
    group = open_group(location, "r+")
    check_format(dict(group.attrs), location)
    group.attrs.update({REFERENCE_RETURNS: record.to_attrs()})


def reference_returns(store_or_url: Any) -> ReferenceReturns | None:
    """A store's reference returns (``None`` when it records none).

    Args:
        store_or_url: An open ``MemoryStore``, or a store's path or URL.

    Raises:
        FormatError: If there is no emote-memory store there, or its record is malformed.
    """
    attributes = getattr(store_or_url, "attributes", None)
    if isinstance(store_or_url, str | os.PathLike) or attributes is None:
        from emote_core.stores.zarr_store.groups import open_group
        from emote_core.stores.zarr_store.layout import check_format

        location = os.fspath(store_or_url)
        attributes = dict(open_group(location, "r").attrs)
        check_format(attributes, location)
        where = f"store '{location}'"
    else:
        where = f"store '{getattr(store_or_url, 'url', '?')}'"
    recorded = attributes.get(REFERENCE_RETURNS)
    if recorded is None:
        return None
    return ReferenceReturns.from_attrs(recorded, where=where)


__all__ = [
    "ENV_ID",
    "FIRST_EPISODE",
    "PROVENANCE",
    "REFERENCE_RETURNS",
    "PolicyKind",
    "PolicyRecord",
    "Provenance",
    "ReferenceReturns",
    "file_sha256",
    "recorded_env_ids",
    "reference_returns",
    "set_reference_returns",
    "shard_sessions",
    "with_session",
]
