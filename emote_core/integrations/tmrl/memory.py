"""The tmrl-interface memory with its files: tmrl's ``dataset_path`` in, datasets and stores out.

:class:`TmrlMemory` takes the arguments of tmrl's memories (``GenericTorchMemory``,
``MemoryTMLidar``): it is :class:`~emote_core.integrations.tmrl.episode_memory.TmrlEpisodeMemory`
started from the dataset in ``dataset_path``, written back as a dataset
(:meth:`TmrlMemory.save_dataset`) or exported to an emote-memory store
(:meth:`TmrlMemory.export_zarr`).
"""

from __future__ import annotations

import logging
import os
import pickle
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from emote_core.errors import StorageError
from emote_core.integrations.tmrl.dataset import DATASET_FILE, load_tmrl_lists
from emote_core.integrations.tmrl.episode_memory import SamplePreprocessor, TmrlEpisodeMemory

log = logging.getLogger(__name__)


class TmrlMemory(TmrlEpisodeMemory):
    """tmrl's memory interface over an emote episode table, starting from tmrl's dataset.

    Arguments after the first three are keyword-only: tmrl's memories order them differently.

    Args:
        memory_size: The most transitions kept; whole old episodes are dropped.
        batch_size: Transitions per batch.
        dataset_path: A folder holding ``data.pkl`` (or the file itself) whose entries fill the
            memory first, as tmrl's memories do; nothing is loaded when it is empty or missing.
        imgs_obs: Accepted for tmrl's configuration; unused (whole observations are kept).
        act_buf_len: Accepted and unused, like ``imgs_obs``.
        nb_steps: Batches per round (iterating the memory yields this many).
        sample_preprocessor: Called on the six fields of every sampled transition.
        crc_debug: Check sampled transitions against what a ``crc_debug`` worker sent.
        device: Where collated batches go.
        seed: Seed of the index sampling.
        trust_pickle: Unpickle ``dataset_path`` without restrictions (runs the file's code).

    Raises:
        FormatError: If ``dataset_path`` holds a ``data.pkl`` that is not a tmrl dataset.
        UnsafePickleError: If it names a global outside the allowlist; nothing ran.
    """

    def __init__(
        self,
        memory_size: int | float = 1_000_000,
        batch_size: int = 256,
        dataset_path: str | os.PathLike[str] = "",
        *,
        imgs_obs: int | None = None,
        act_buf_len: int | None = None,
        nb_steps: int = 1,
        sample_preprocessor: SamplePreprocessor | None = None,
        crc_debug: bool = False,
        device: str | torch.device = "cpu",
        seed: int | None = None,
        trust_pickle: bool = False,
    ) -> None:
        super().__init__(
            device=device, nb_steps=nb_steps, sample_preprocessor=sample_preprocessor,
            memory_size=memory_size, batch_size=batch_size, crc_debug=crc_debug, seed=seed,
        )  # fmt: skip
        if imgs_obs is not None or act_buf_len is not None:
            log.warning(
                "imgs_obs=%s and act_buf_len=%s are not used: this memory keeps whole "
                "observations, so the rollout worker must send them uncompressed (no "
                "get_local_buffer_sample that strips history; crc_debug checks it)",
                imgs_obs,
                act_buf_len,
            )
        self.path = Path(dataset_path)
        if os.fspath(dataset_path) and _has_dataset(self.path):
            lists = load_tmrl_lists(self.path, trust_pickle=trust_pickle)
            self.append_buffer(_entries_as_samples(lists))
            log.info("loaded %d transitions from tmrl dataset '%s'", len(self), self.path)
        else:
            log.info("no data found in '%s', initializing an empty replay memory", self.path)

    def save_dataset(self, path: str | os.PathLike[str]) -> Path:
        """Writes the memory as a tmrl dataset: ``path/data.pkl`` (``path`` a folder, made if
        missing) or ``path`` itself when it ends in ``.pkl``. Replaced atomically.

        The file holds tmrl's seven lists (actions, observations, rewards, terminated, truncated,
        infos, dones), one entry per observation: each episode's reset entry (action ``None``,
        reward 0) and then its steps, the episode being collected last. tmrl's
        ``GenericTorchMemory`` and ``emote memory convert`` read it.

        Returns:
            The file written.

        Raises:
            StorageError: If the file cannot be written.
        """
        target = Path(path)
        if target.suffix != ".pkl":
            target.mkdir(parents=True, exist_ok=True)
            target = target / DATASET_FILE
        lists: list[list[Any]] = [[] for _ in range(7)]
        for observations, actions, rewards, infos, terminated in self._entries():
            for k, observation in enumerate(observations):
                last = k == len(actions)
                done = last and terminated is not None
                entry = (
                    None if k == 0 else actions[k - 1],
                    observation,
                    0.0 if k == 0 else float(rewards[k - 1]),
                    done and bool(terminated),
                    done and not terminated,
                    {} if k == 0 else infos[k - 1],
                    done,
                )
                for values, value in zip(lists, entry, strict=True):
                    values.append(value)
        try:
            handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=".emote-tmp-")
            with os.fdopen(handle, "wb") as file:
                pickle.dump(lists, file)
            os.replace(temporary, target)
        except OSError as error:
            raise StorageError(f"cannot write tmrl dataset '{target}' ({error})") from error
        return target

    def _entries(self) -> Iterator[tuple[list[Any], list[Any], list[Any], list[Any], Any]]:
        """Per episode, oldest first: observations, actions, rewards, infos and how it ended
        (``True`` TERMINAL, ``False`` INTERRUPTED, ``None`` still open)."""
        layout, action = self.observation_layout, self.action_layout
        if self.table is not None and layout is not None and action is not None:
            for identity, columns, end in self.table.episodes():
                rows = len(columns["actions"])
                yield (
                    [layout.value(columns, k) for k in range(rows + 1)],
                    [action.value(columns["actions"][k]) for k in range(rows)],
                    [float(r) for r in columns["rewards"][:, 0]],
                    self.infos[identity],
                    end.name == "TERMINAL",
                )
        if self._open is not None:
            episode = self._open
            yield episode.observations, episode.actions, episode.rewards, episode.infos, None

    def export_zarr(self, url: str | os.PathLike[str], *, overwrite: bool = False) -> int:
        """Writes the memory's finished episodes to a new emote-memory Zarr store.

        The episode being collected is not an episode yet and is left out.

        Returns:
            The number of episodes written.

        Raises:
            FormatError: If a store exists at ``url`` and ``overwrite`` is false.
        """
        from emote_core.stores.zarr_store.tables import save_table

        if self.table is None:
            raise StorageError(
                f"cannot export to '{url}': the memory holds no finished episode yet; append "
                "buffers until an episode ends"
            )
        return save_table(self.table, url, spaces=self.table.spaces.to_json(), overwrite=overwrite)


def _has_dataset(path: Path) -> bool:
    if path.is_dir():
        return (path / DATASET_FILE).is_file()
    return path.is_file()


def _entries_as_samples(lists: list[list[Any]]) -> list[tuple[Any, ...]]:
    """A dataset's entries as worker samples; an entry's done ends its episode even when
    neither flag is set (an interrupted one)."""
    actions, observations, rewards, terminated, truncated, infos, dones = lists
    return [
        (a, o, r, bool(t), bool(u) or (bool(d) and not t), i)
        for a, o, r, t, u, i, d in zip(
            actions, observations, rewards, terminated, truncated, infos, dones, strict=True
        )
    ]


__all__ = ["TmrlMemory"]
