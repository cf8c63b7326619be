"""Following the policy a learner publishes: ``RUN_DIR/exports/latest.onnx``, reloaded when it
changes.

A learner publishes by writing the new file next to the old one and renaming it over
``latest.onnx`` (``os.replace``), so the path always names a whole file: either the old one or
the new one. :class:`PublishedFile` looks at the path's ``stat`` (modification time in ns,
size, inode) at most once a :data:`POLL_INTERVAL_S` and loads the file only when that changed;
a file that does not load is logged once and the one in use is kept; while none is in use yet,
such a file ends the wait for a first one with its error. :class:`PublishedPolicy`
loads it as an :class:`~emote_core.onnx.agent.OnnxAgentProxy` checked against the environment's
spaces; the driver of ``emote collect --workers`` loads its bytes to relay them to its workers
(:mod:`emote_core.scale.policy_relay`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

from emote_core.assembly.compatibility import onnx_collect_agent
from emote_core.errors import ConfigurationError, EmoteError
from emote_core.onnx.publishing import LATEST_POLICY
from emote_core.recipes.schema import Recipe
from emote_core.runs import RunDirectory
from emote_core.spaces import MDPSpace
from emote_core.stores.provenance import PolicyRecord

__all__ = [
    "LATEST_POLICY",
    "POLL_INTERVAL_S",
    "PublishedFile",
    "PublishedPolicy",
    "published_policy_path",
]

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 1.0
"""The most often the published file's ``stat`` is looked at."""

Signature = tuple[int, int, int]
T = TypeVar("T")


def published_policy_path(run_dir: str | os.PathLike[str]) -> Path:
    """``RUN_DIR/exports/latest.onnx``: where a run publishes its newest policy."""
    return RunDirectory(Path(run_dir)).exports / LATEST_POLICY


def _signature(path: Path) -> Signature | None:
    try:
        found = path.stat()
    except FileNotFoundError:
        return None
    return (found.st_mtime_ns, found.st_size, found.st_ino)


class PublishedFile(Generic[T]):
    """A published file, loaded again whenever it is replaced.

    Args:
        path: The file (``RUN_DIR/exports/latest.onnx``).
        load: Loads the file at the path it is given; an :class:`~emote_core.errors.EmoteError`
            refuses it (logged once; the file in use is kept).
        poll_interval: The most often the file's ``stat`` is looked at, in seconds.
    """

    def __init__(
        self, path: Path, load: Callable[[Path], T], *, poll_interval: float = POLL_INTERVAL_S
    ) -> None:
        self.path = path
        self.load = load
        self.poll_interval = poll_interval
        self._loaded: Signature | None = None
        self._refused: Signature | None = None
        self._looked_at = float("-inf")

    def first(self, *, wait: bool, should_stop: Callable[[], bool] | None = None) -> T | None:
        """What is published now; without a loadable file, waits for one (``wait``) or refuses.

        Args:
            wait: Wait (with a message on stderr) until a loadable file is published.
            should_stop: Asked about once a second while waiting; ``True`` ends the wait.

        Returns:
            What ``load`` returned, or ``None`` when ``should_stop`` ended the wait.

        Raises:
            ConfigurationError: Without ``wait``, if no file is published yet.
            EmoteError: If the published file does not load (nothing is in use to keep).
        """
        told = False
        while True:
            found = self._look(force=True, keep=False)
            if found is not None:
                return found
            if not wait:
                raise ConfigurationError(
                    f"no policy is published at '{self.path}' yet; start the learner that "
                    "publishes it, or leave out `wait_for_policy=False` to wait for one"
                )
            if not told:
                log.info("waiting for a policy to be published at %s (Ctrl-C stops)", self.path)
                told = True
            if should_stop is not None and should_stop():
                return None
            time.sleep(self.poll_interval)

    def poll(self, *, force: bool = False) -> T | None:
        """The newly published file, loaded, if it changed since it was last looked at.

        Looks at the file at most once a ``poll_interval`` (unless ``force``); a file that does
        not load is logged once and ``None`` returned, so the one in use is kept.

        Returns:
            What ``load`` returned, or ``None`` when there is nothing new to switch to.
        """
        return self._look(force=force, keep=True)

    def _look(self, *, force: bool, keep: bool) -> T | None:
        """:meth:`poll`; a file that does not load raises its error unless ``keep``."""
        now = time.monotonic()
        if not force and now - self._looked_at < self.poll_interval:
            return None
        self._looked_at = now
        signature = _signature(self.path)
        if signature is None or signature in (self._loaded, self._refused):
            return None
        try:
            found = self.load(self.path)
        except EmoteError as error:
            self._refused = signature
            if not keep or self._loaded is None:
                error.add_note(
                    "no policy is in use yet, so there is none to keep: publish one that loads "
                    "there (the learner's next export replaces it) and run the command again"
                )
                raise
            log.warning("kept the policy in use: the published %s is refused: %s", self.path, error)
            return None
        self._loaded = signature
        return found


class PublishedPolicy:
    """The newest policy a run has published, reloaded when the learner publishes another.

    Args:
        run_dir: The learner's run directory.
        recipe: The collect's recipe (the policy must fit its environment).
        spaces: The environment's spaces.
        seed: Seeds the agents' noise; the k-th policy loaded gets ``seed + k``.
        poll_interval: The most often the file's ``stat`` is looked at, in seconds.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        recipe: Recipe,
        spaces: MDPSpace,
        *,
        seed: int,
        poll_interval: float = POLL_INTERVAL_S,
    ) -> None:
        self.path = published_policy_path(run_dir)
        self.recipe = recipe
        self.spaces = spaces
        self.seed = seed
        self.training_steps: list[int] = []
        """The training step of every policy acted with, in the order they were loaded."""
        self.record: PolicyRecord | None = None
        """The first policy loaded (what the store's provenance names)."""
        self._file = PublishedFile(self.path, self._load, poll_interval=poll_interval)

    @property
    def training_step(self) -> int | None:
        """The training step of the policy in use (``None`` before one is loaded)."""
        return self.training_steps[-1] if self.training_steps else None

    def first(self, *, wait: bool, should_stop: Callable[[], bool] | None = None) -> Any | None:
        """The agent of the policy published now (:meth:`PublishedFile.first`).

        Raises:
            ConfigurationError: Without ``wait``, if no policy is published yet.
            EmoteError: If the published file does not load or fit.
        """
        return self._file.first(wait=wait, should_stop=should_stop)

    def poll(self, *, force: bool = False) -> Any | None:
        """The agent of a newly published policy, or ``None`` (:meth:`PublishedFile.poll`): a
        file that does not load or fit is logged once, and the policy in use kept."""
        return self._file.poll(force=force)

    def _load(self, path: Path) -> Any:
        agent, record = onnx_collect_agent(
            path, self.recipe, self.spaces, seed=self.seed + len(self.training_steps)
        )
        step = int(agent.metadata.training_step)
        if self.record is None:
            self.record = record
        self.training_steps.append(step)
        log.info("acting with the policy of training step %d from %s", step, self.path)
        return agent
