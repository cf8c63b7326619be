"""Upstream emote's utilities, kept for code ported from it; emote itself uses none of them:
the ``deprecated`` decorator, ``WeakReference``, and :func:`upstream_alias`, which takes an
argument under emote's name or upstream's."""

from __future__ import annotations

import functools
import inspect
import warnings
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

from emote_core.errors import ConfigurationError

__all__ = ["WeakReference", "deprecated", "upstream_alias"]

_Obj = TypeVar("_Obj")
T = TypeVar("T")


class WeakReference(weakref.ReferenceType, Generic[T]):  # type: ignore[type-arg]
    """A weak reference that names the type it points at, as upstream emote's ``WeakReference``.

    Calling it returns the object while something else keeps it alive, and ``None`` once it has
    been collected; it never keeps the object alive itself.

    Args:
        obj: The object to refer to; it must support weak references.
        callback: Called with this reference when the object is about to be collected.
    """

    def __call__(self) -> T | None:
        return super().__call__()


def upstream_alias(owner: str, emote: tuple[str, Any], upstream: tuple[str, Any]) -> Any:
    """The value of an argument that emote and upstream emote name differently; never both.

    Args:
        owner: Names the class or function in the error.
        emote: ``(emote's name, value)``.
        upstream: ``(upstream's name, value)``.

    Returns:
        The value given (``None`` if neither was).

    Raises:
        ConfigurationError: If both names were given.
    """
    (emote_name, emote_value), (upstream_name, upstream_value) = emote, upstream
    if emote_value is not None and upstream_value is not None:
        raise ConfigurationError(
            f"{owner}: got both {emote_name}= and {upstream_name}= (upstream emote's name for "
            f"the same argument); pass only one"
        )
    return emote_value if emote_value is not None else upstream_value


def _with_note(doc: str | None, note: str) -> str:
    """Returns ``doc`` with a Google-style ``Deprecated:`` section appended."""
    section = f"Deprecated:\n    {note}"
    if not doc or not doc.strip():
        return section
    return f"{inspect.cleandoc(doc)}\n\n{section}"


def _wrap_function(func: Callable[..., Any], message: str, note: str) -> Callable[..., Any]:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        return func(*args, **kwargs)

    wrapper.__doc__ = _with_note(func.__doc__, note)
    return wrapper


def _wrap_class(cls: type, message: str, note: str) -> type:
    original_init = cls.__init__
    takes_no_arguments = original_init is object.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        if takes_no_arguments:
            # object.__init__ rejects arguments once __init__ is overridden; the class's own
            # __new__ (if any) already received them.
            original_init(self)
        else:
            original_init(self, *args, **kwargs)

    if not takes_no_arguments:
        functools.update_wrapper(__init__, original_init)
    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = __init__  # type: ignore[misc]
    cls.__doc__ = _with_note(cls.__doc__, note)
    return cls


def deprecated(reason: str, *, version: str | None = None) -> Callable[[_Obj], _Obj]:
    """Mark a function, method or class as deprecated.

    Every call (or instantiation) emits a :class:`DeprecationWarning` at the caller's line; the
    docstring gains a ``Deprecated:`` section. A class stays the same class (only ``__init__`` is
    wrapped).

    Example::

        @deprecated("use sample_batch instead", version="0.2")
        def sample(...): ...

    Args:
        reason: Why it is deprecated and what to use instead; shown in the warning.
        version: The emote version that deprecated it, if known.

    Returns:
        The decorator.

    Raises:
        ConfigurationError: If ``reason`` is not a non-empty string (as with a bare
            ``@deprecated``).
    """
    if not isinstance(reason, str) or not reason.strip():
        raise ConfigurationError(
            f"deprecated() needs a non-empty reason string, got {reason!r}; "
            'write @deprecated("use X instead"), not a bare @deprecated'
        )
    note = f"Since version {version}: {reason}" if version is not None else reason

    def decorator(obj: _Obj) -> _Obj:
        if isinstance(obj, classmethod | staticmethod):
            func = obj.__func__
            qualname = getattr(func, "__qualname__", repr(func))
            message = _message(qualname, reason, version)
            return cast(_Obj, type(obj)(_wrap_function(func, message, note)))
        qualname = getattr(obj, "__qualname__", repr(obj))
        message = _message(qualname, reason, version)
        if isinstance(obj, type):
            return cast(_Obj, _wrap_class(obj, message, note))
        if callable(obj):
            return cast(_Obj, _wrap_function(obj, message, note))
        raise ConfigurationError(
            f"deprecated() decorates functions, methods and classes, got {obj!r} of type "
            f"{type(obj).__name__}; apply it to the underlying function instead"
        )

    return decorator


def _message(qualname: str, reason: str, version: str | None) -> str:
    since = f" since version {version}" if version is not None else ""
    return f"{qualname} is deprecated{since}: {reason}"
