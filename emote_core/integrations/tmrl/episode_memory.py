"""A replay memory with tmrl's ``Memory`` / ``TorchMemory`` interface, kept in an episode table.

:class:`TmrlEpisodeMemory` takes the buffers tmrl's workers send (``append``), answers ``len`` and
yields ``nb_steps`` batches per round, keeping the transitions as whole episodes in a
:class:`~emote_core.memory.builders.DictObsMemoryTable`, cut at ``terminated`` (TERMINAL) or
``truncated`` (INTERRUPTED). The episode being collected is counted and sampled before it ends,
as tmrl does. Files are :class:`~emote_core.integrations.tmrl.memory.TmrlMemory`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from emote_core.errors import ConfigurationError, SamplingError
from emote_core.integrations.tmrl.samples import (
    ArrayLayout,
    ObservationLayout,
    check_crc_sample,
    collate_samples,
)
from emote_core.memory.builders import DictObsMemoryTable
from emote_core.spaces import BoxSpace, DictSpace, MDPSpace
from emote_core.typing import EpisodeState

log = logging.getLogger(__name__)

SamplePreprocessor = Callable[..., tuple[Any, Any, Any, Any, Any, Any]]
"""tmrl's ``sample_preprocessor``: the six fields of a transition in, six fields out."""

Transition = tuple[Any, Any, Any, Any, bool, bool, dict[str, Any]]
"""``(prev_obs, new_act, rew, new_obs, terminated, truncated, info)``."""


@dataclass
class _OpenEpisode:
    """The episode being collected: ``N + 1`` observations, ``N`` actions, rewards and infos."""

    identity: int
    observations: list[Any]
    actions: list[Any] = field(default_factory=list)
    rewards: list[Any] = field(default_factory=list)
    infos: list[dict[str, Any]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.actions)


_STATS = ("stat_train_return", "stat_test_return", "stat_train_steps", "stat_test_steps")
"""What tmrl's trainer logs, sent along with each buffer."""


def _samples_of(buffer: Any) -> list[Sequence[Any]]:
    samples = getattr(buffer, "memory", buffer)
    if not isinstance(samples, Sequence):
        raise ConfigurationError(
            f"append_buffer takes a tmrl Buffer (samples in .memory) or a list of samples; got "
            f"{type(buffer).__name__}"
        )
    for sample in samples:
        if not isinstance(sample, Sequence) or len(sample) != 6:
            raise ConfigurationError(
                f"a tmrl sample is (act, new_obs, rew, terminated, truncated, info); got "
                f"{sample!r:.80} — send samples in this order (a local buffer sample function "
                "must return all six)"
            )
    return list(samples)


class TmrlEpisodeMemory:
    """tmrl's ``TorchMemory`` interface over an emote episode table.

    The first five arguments are tmrl's ``Memory`` in its order; ``crc_debug`` is keyword-only
    because tmrl's ``dataset_path`` sits before it (this class reads no files:
    :class:`~emote_core.integrations.tmrl.memory.TmrlMemory` does).

    Args:
        device: Where collated batches go (tmrl's ``device``).
        nb_steps: Batches per round: how many batches iterating the memory yields.
        sample_preprocessor: Called on the six fields of every sampled transition
            (``prev_obs, new_act, rew, new_obs, terminated, truncated``), returning six fields.
        memory_size: The most transitions kept in the table; whole old episodes are dropped.
        batch_size: Transitions per batch.
        crc_debug: Check each sampled transition against the copy a tmrl worker run with
            ``crc_debug=True`` put in its info (see :func:`check_crc_sample`).
        seed: Seed of the index sampling, for reproducible runs.

    Raises:
        ConfigurationError: If a size is not positive.
    """

    def __init__(
        self,
        device: str | torch.device = "cpu",
        nb_steps: int = 1,
        sample_preprocessor: SamplePreprocessor | None = None,
        memory_size: int | float = 1_000_000,
        batch_size: int = 256,
        *,
        crc_debug: bool = False,
        seed: int | None = None,
    ) -> None:
        for name, value in (("memory_size", memory_size), ("batch_size", batch_size)):
            if int(value) != value or value < 1:
                raise ConfigurationError(f"{name} must be a positive whole number; got {value!r}")
        if int(nb_steps) != nb_steps or nb_steps < 0:
            raise ConfigurationError(f"nb_steps must be a whole number >= 0; got {nb_steps!r}")
        self.device = device
        self.nb_steps = int(nb_steps)
        self.sample_preprocessor = sample_preprocessor
        self.memory_size = int(memory_size)
        self.batch_size = int(batch_size)
        self.crc_debug = crc_debug
        self.rng = np.random.default_rng(seed)
        self.table: DictObsMemoryTable | None = None
        self.observation_layout: ObservationLayout | None = None
        self.action_layout: ArrayLayout | None = None
        self.infos: dict[int, list[dict[str, Any]]] = {}
        self._open: _OpenEpisode | None = None
        self._next_identity = 0
        self._seed = seed
        self._order_cache: tuple[int, np.ndarray, np.ndarray, np.ndarray] | None = None
        # What tmrl's trainer logs; they arrive with each buffer.
        self.stat_test_return = 0.0
        self.stat_train_return = 0.0
        self.stat_test_steps = 0
        self.stat_train_steps = 0

    # Adding.

    def append(self, buffer: Any) -> None:
        """Appends a tmrl ``Buffer`` and takes its return and episode-length statistics."""
        if len(_samples_of(buffer)) == 0:
            return
        for name in _STATS:
            setattr(self, name, getattr(buffer, name, getattr(self, name)))
        self.append_buffer(buffer)

    def append_buffer(self, buffer: Any) -> None:
        """Adds the samples of ``buffer`` (a tmrl ``Buffer`` or a list of samples), in order.

        Episodes end at a sample whose ``terminated`` (TERMINAL) or ``truncated`` (INTERRUPTED) is
        set and go into the table then; the sample after is a reset that starts the next one.

        Raises:
            SchemaError: A sample does not fit the layout of the first one.
            ConfigurationError: A sample is not a six-tuple, or an episode is longer than
                ``memory_size``.
        """
        for act, obs, rew, terminated, truncated, info in _samples_of(buffer):
            if self._open is None:
                self._start(obs)
                if terminated or truncated:  # a done reset holds no transition
                    self._open = None
                continue
            if act is None:
                raise ConfigurationError(
                    "a sample inside an episode has action None; only the sample after a reset "
                    "may (tmrl's placeholder) — send the action that led to the observation"
                )
            assert self.observation_layout is not None  # set by the first reset
            self.observation_layout.columns([obs])  # refuses an observation of another layout
            self._open.observations.append(obs)
            self._open.actions.append(act)
            self._open.rewards.append(rew)
            self._open.infos.append(dict(info) if info is not None else {})
            if terminated or truncated:
                self._close(EpisodeState.TERMINAL if terminated else EpisodeState.INTERRUPTED)

    def _start(self, observation: Any) -> None:
        if self.observation_layout is None:
            self.observation_layout = ObservationLayout.of(observation)
        self.observation_layout.columns([observation])
        self._open = _OpenEpisode(self._next_identity, [observation])
        self._next_identity += 1

    def _close(self, end_state: EpisodeState) -> None:
        episode = self._open
        assert episode is not None
        self._open = None
        if len(episode) > self.memory_size:
            raise ConfigurationError(
                f"episode {episode.identity} has {len(episode)} transitions, more than "
                f"memory_size={self.memory_size}; raise memory_size above the longest episode"
            )
        table = self._table(episode)
        table.add_sequence(episode.identity, self.episode_columns(episode), end_state=end_state)
        self.infos[episode.identity] = episode.infos
        held = set(table.index.slot_of)
        for identity in [i for i in self.infos if i not in held]:
            del self.infos[identity]  # ejected to stay within memory_size

    def _table(self, episode: _OpenEpisode) -> DictObsMemoryTable:
        if self.table is None:
            self.action_layout = ArrayLayout.of(episode.actions[0], "the action")
            layout = self.observation_layout
            assert layout is not None
            parts = zip(layout.keys, layout.parts, strict=True)
            state = DictSpace({key: BoxSpace(p.dtype, p.stored_shape) for key, p in parts})
            spaces = MDPSpace(
                rewards=BoxSpace(np.dtype(np.float32), (1,)),
                actions=BoxSpace(self.action_layout.dtype, self.action_layout.stored_shape),
                state=state,
            )
            self.table = DictObsMemoryTable(spaces=spaces, maxlen=self.memory_size, seed=self._seed)
        return self.table

    def episode_columns(self, episode: _OpenEpisode) -> dict[str, np.ndarray]:
        """An episode's columns as the table stores them."""
        assert self.observation_layout is not None
        action = self.action_layout or ArrayLayout.of(episode.actions[0], "the action")
        columns = self.observation_layout.columns(episode.observations)
        columns["actions"] = action.to_rows(episode.actions, "actions")
        columns["rewards"] = ArrayLayout((), np.dtype(np.float32)).to_rows(
            episode.rewards, "rewards"
        )
        return columns

    @property
    def open_episode(self) -> _OpenEpisode | None:
        """The episode being collected (its transitions are sampled already), if any."""
        return self._open

    # Indexing, as tmrl's Memory.

    def __len__(self) -> int:
        """Transitions held: the table's and those of the episode being collected."""
        held = len(self.table) if self.table is not None else 0
        return held + (len(self._open) if self._open is not None else 0)

    def _order(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Held episodes oldest first: identities, first item of each, lengths."""
        table = self.table
        if table is None:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, empty
        version = table.index.version
        if self._order_cache is None or self._order_cache[0] != version:
            slots = table.live_slots_in_order()
            lengths = table.index.lengths[slots]
            firsts = np.cumsum(lengths) - lengths
            self._order_cache = (version, table.index.ids[slots], firsts, lengths)
        return self._order_cache[1:]

    def transitions(self, items: Iterable[int]) -> list[Transition]:
        """The transitions at ``items`` (``0 <= item < len(self)``, oldest first).

        Raises:
            IndexError: If an item is out of range.
        """
        wanted = np.asarray(list(items), dtype=np.int64).reshape(-1)
        size = len(self)
        if len(wanted) and (wanted.min() < 0 or wanted.max() >= size):
            bad = int(wanted[(wanted < 0) | (wanted >= size)][0])
            raise IndexError(f"transition {bad} is out of range; the memory holds {size}")
        result: list[Transition | None] = [None] * len(wanted)
        identities, firsts, _ = self._order()
        held = len(self.table) if self.table is not None else 0
        in_table = np.flatnonzero(wanted < held)
        if len(in_table):
            position = np.searchsorted(firsts, wanted[in_table], side="right") - 1
            chosen, offsets = identities[position], wanted[in_table] - firsts[position]
            for k, transition in zip(in_table, self._read_table(chosen, offsets), strict=True):
                result[int(k)] = transition
        for k in np.flatnonzero(wanted >= held):
            result[int(k)] = self._read_open(int(wanted[k]) - held)
        return result  # type: ignore[return-value]

    def _read_table(self, identities: np.ndarray, offsets: np.ndarray) -> list[Transition]:
        assert self.table is not None and self.observation_layout is not None
        batch = self.table.sample_by_index(identities, offsets, 1)
        obs = {k: v.cpu().numpy() for k, v in batch["observation"].items()}
        nxt = {k: v.cpu().numpy() for k, v in batch["next_observation"].items()}
        actions, rewards = batch["actions"].cpu().numpy(), batch["rewards"].cpu().numpy()
        dones = batch["dones"].cpu().numpy()[:, 0] > 0
        masks = batch["masks"].cpu().numpy()[:, 0] > 0
        layout, action = self.observation_layout, self.action_layout
        assert action is not None
        return [
            (
                layout.value(obs, k),
                action.value(actions[k]),
                np.float32(rewards[k, 0]),
                layout.value(nxt, k),
                bool(dones[k] and not masks[k]),
                bool(dones[k] and masks[k]),
                self.infos[int(identity)][int(offset)],
            )
            for k, (identity, offset) in enumerate(zip(identities, offsets, strict=True))
        ]

    def _read_open(self, offset: int) -> Transition:
        episode = self._open
        assert episode is not None and self.observation_layout is not None
        columns = self.observation_layout.columns(episode.observations[offset : offset + 2])
        action = self.action_layout or ArrayLayout.of(episode.actions[0], "the action")
        act = action.value(action.to_rows([episode.actions[offset]], "actions")[0])
        return (
            self.observation_layout.value(columns, 0),
            act,
            np.float32(episode.rewards[offset]),
            self.observation_layout.value(columns, 1),
            False,
            False,
            episode.infos[offset],
        )

    def get_transition(self, item: int) -> Transition:
        """tmrl's ``get_transition``: ``(prev_obs, new_act, rew, new_obs, terminated, truncated,
        info)`` for transition ``item``; ``info`` is the one sent with ``new_obs``."""
        return self.transitions([item])[0]

    def _finish(self, transition: Transition) -> tuple[Any, ...]:
        prev_obs, new_act, rew, new_obs, terminated, truncated, info = transition
        if self.crc_debug:
            check_crc_sample((prev_obs, new_act, rew, new_obs, terminated, truncated), info)
        if self.sample_preprocessor is not None:
            prev_obs, new_act, rew, new_obs, terminated, truncated = self.sample_preprocessor(
                prev_obs, new_act, rew, new_obs, terminated, truncated
            )
        # As tmrl: float flags, not bool tensors.
        return prev_obs, new_act, rew, new_obs, np.float32(terminated), np.float32(truncated)

    def __getitem__(self, item: int) -> tuple[Any, ...]:
        """A training sample: the transition, checked (``crc_debug``) and preprocessed."""
        return self._finish(self.get_transition(item))

    # Sampling, as tmrl's TorchMemory.

    def sample_indices(self) -> np.ndarray:
        """``batch_size`` items drawn uniformly (with replacement) from ``range(len(self))``."""
        if len(self) == 0:
            raise SamplingError("cannot sample an empty tmrl memory; append buffers first")
        return self.rng.integers(0, len(self), size=self.batch_size)

    def collate(self, batch: Sequence[Any], device: str | torch.device | None) -> Any:
        """Collates training samples into a tuple of batched tensors on ``device``."""
        return collate_samples(batch, device)

    def sample(self) -> Any:
        """One batch: ``(prev_obs, new_act, rew, new_obs, terminated, truncated)`` tensors."""
        transitions = self.transitions(self.sample_indices())
        return self.collate([self._finish(t) for t in transitions], self.device)

    def __iter__(self) -> Iterator[Any]:
        for _ in range(self.nb_steps):
            yield self.sample()


__all__ = ["SamplePreprocessor", "TmrlEpisodeMemory", "Transition"]
