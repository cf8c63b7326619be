"""The one error hierarchy of emote.

Every error emote raises on purpose derives from :class:`EmoteError`. Messages state the rule, the
value received and the fix, so the CLI can print them as a single line.
"""

from __future__ import annotations


class EmoteError(Exception):
    """Base class of every error emote raises deliberately."""


class ConfigurationError(EmoteError, ValueError):
    """A value given by the user (argument, recipe field, option) is invalid."""


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


class TestCheckFailed(EmoteError):
    """A training-time check (final loss or reward) did not reach its threshold."""

    __test__ = False  # not a pytest test class despite the name
