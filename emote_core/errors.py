"""The one error hierarchy of emote.

Every error emote raises on purpose derives from :class:`EmoteError`. Messages state the rule, the
value received and the fix, so the CLI can print them as a single line. A message names what the
caller can change as a library user writes it: an argument in backticks, as in a call
(```force=True```, ```device```), or a recipe key (``[training] bp_steps``). The command line
prints its flag in place of each argument it maps (``emote_cli._common.ARGUMENT_FLAGS``).
"""

from __future__ import annotations


class EmoteError(Exception):
    """Base class of every error emote raises deliberately."""


class ConfigurationError(EmoteError, ValueError):
    """A value given by the user (argument, recipe field, option) is invalid."""


class UsageError(ConfigurationError):
    """The command line itself is wrong: a recipe name that names no recipe, a ``--set
    KEY=VALUE`` the recipe refuses, a ``--device`` that is not a device (``emote`` exits 2)."""


class CallbackDefinitionError(EmoteError, TypeError):
    """A callback class or instance is defined in a way the training engine cannot run."""


class MissingStateKeyError(EmoteError, KeyError):
    """A hook asked for a training-state key that is not there."""

    def __str__(self) -> str:  # KeyError would quote the message; keep it readable.
        return str(self.args[0]) if self.args else ""


class CheckpointError(EmoteError):
    """A checkpoint cannot be written, found or loaded."""


class StorageError(EmoteError):
    """A stored item (export, checkpoint file, handle) cannot be created, found or parsed."""


class ExportError(EmoteError):
    """A policy cannot be exported, or the exported file does not behave like the policy."""


class TestCheckFailed(EmoteError):
    """A training-time check (final loss or reward) did not reach its threshold."""

    __test__ = False  # not a pytest test class despite the name


class MemoryTableError(EmoteError):
    """A memory table was used in a way it cannot serve (base of the memory errors)."""


class SchemaError(MemoryTableError, ValueError):
    """Data does not match a table's columns: a missing column, a wrong shape, length or dtype."""


class SamplingError(MemoryTableError):
    """A sample cannot be drawn: the table is empty, or no episode is long enough."""


class DuplicateEpisodeError(MemoryTableError, ValueError):
    """An episode identity that the table already holds was added again."""


class EpisodeCollationError(MemoryTableError, ValueError):
    """Steps reached the sequence builder in an order or shape that breaks the episode rules."""


class FormatError(EmoteError):
    """A file is not in the format it claims, is damaged, or has an unsupported version."""


class UnsafePickleError(FormatError):
    """A pickle names a global outside the allowlist; it was refused without running it."""
