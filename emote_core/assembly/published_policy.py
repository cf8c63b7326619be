"""Following the policy a learner publishes: ``RUN_DIR/exports/latest.onnx``, reloaded when it
changes.

A learner publishes by writing the new file next to the old one and renaming it over
``latest.onnx`` (``os.replace``), so the path always names a whole file: either the old one or
the new one. :class:`PublishedPolicy` looks at the path's ``stat`` (modification time in ns,
size, inode) at most once a :data:`POLL_INTERVAL_S` and loads the file only when that changed,
as an :class:`~emote_core.onnx.agent.OnnxAgentProxy` checked against the environment's spaces.
A file that does not load or does not fit is logged once and the policy in use is kept.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from emote_core.assembly.compatibility import onnx_collect_agent
from emote_core.errors import ConfigurationError, EmoteError
from emote_core.recipes.schema import Recipe
from emote_core.runs import RunDirectory
from emote_core.spaces import MDPSpace
from emote_core.stores.provenance import PolicyRecord

__all__ = ["LATEST_POLICY", "POLL_INTERVAL_S", "PublishedPolicy", "published_policy_path"]

log = logging.getLogger(__name__)

LATEST_POLICY = "latest.onnx"
"""The file name a learner publishes its newest policy under, in the run's ``exports/``."""
POLL_INTERVAL_S = 1.0
"""The most often the published file's ``stat`` is looked at."""

Signature = tuple[int, int, int]


def published_policy_path(run_dir: str | os.PathLike[str]) -> Path:
    """``RUN_DIR/exports/latest.onnx``: where a run publishes its newest policy."""
    return RunDirectory(Path(run_dir)).exports / LATEST_POLICY


def _signature(path: Path) -> Signature | None:
    try:
        found = path.stat()
    except FileNotFoundError:
        return None
    return (found.st_mtime_ns, found.st_size, found.st_ino)


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
        self.poll_interval = poll_interval
        self.training_steps: list[int] = []
        """The training step of every policy acted with, in the order they were loaded."""
        self.record: PolicyRecord | None = None
        """The first policy loaded (what the store's provenance names)."""
        self._loaded: Signature | None = None
        self._refused: Signature | None = None
        self._looked_at = float("-inf")

    @property
    def training_step(self) -> int | None:
        """The training step of the policy in use (``None`` before one is loaded)."""
        return self.training_steps[-1] if self.training_steps else None

    def first(self, *, wait: bool, should_stop: Callable[[], bool] | None = None) -> Any | None:
        """The policy published now; without one, waits for it (``wait``) or refuses.

        Args:
            wait: Wait (with a message on stderr) until a loadable policy is published.
            should_stop: Asked about once a second while waiting; ``True`` ends the wait.

        Returns:
            The agent, or ``None`` when ``should_stop`` ended the wait.

        Raises:
            ConfigurationError: Without ``wait``, if no policy is published yet.
            EmoteError: Without ``wait``, if the published file does not load or fit.
        """
        if not wait:
            if _signature(self.path) is None:
                raise ConfigurationError(
                    f"no policy is published at '{self.path}' yet; start the learner that "
                    "publishes it, or leave out --no-wait to wait for one"
                )
            self._looked_at = time.monotonic()
            self._loaded = _signature(self.path)
            return self._load()
        told = False
        while True:
            agent = self.poll(force=True)
            if agent is not None:
                return agent
            if not told:
                log.info("waiting for a policy to be published at %s (Ctrl-C stops)", self.path)
                told = True
            if should_stop is not None and should_stop():
                return None
            time.sleep(self.poll_interval)

    def poll(self, *, force: bool = False) -> Any | None:
        """A newly published policy, if the file changed since it was last looked at.

        Looks at the file at most once a ``poll_interval`` (unless ``force``); a file that does
        not load or fit is logged once and ``None`` returned, so the policy in use is kept.

        Returns:
            The new agent, or ``None`` when there is none to switch to.
        """
        now = time.monotonic()
        if not force and now - self._looked_at < self.poll_interval:
            return None
        self._looked_at = now
        signature = _signature(self.path)
        if signature is None or signature in (self._loaded, self._refused):
            return None
        try:
            agent = self._load()
        except EmoteError as error:
            self._refused = signature
            log.warning("kept the policy in use: the published %s is refused: %s", self.path, error)
            return None
        self._loaded = signature
        return agent

    def _load(self) -> Any:
        agent, record = onnx_collect_agent(
            self.path, self.recipe, self.spaces, seed=self.seed + len(self.training_steps)
        )
        step = int(agent.metadata.training_step)
        if self.record is None:
            self.record = record
        self.training_steps.append(step)
        log.info("acting with the policy of training step %d from %s", step, self.path)
        return agent
