from __future__ import annotations

import gc
import inspect
import warnings

import pytest

from emote_core.errors import ConfigurationError
from emote_core.utils import WeakReference, deprecated
from emote_core.utils.compat import upstream_alias


@deprecated("use add_three instead", version="0.2")
def add(a: int, b: int = 1) -> int:
    """Add two numbers.

    Args:
        a: First.
        b: Second.
    """
    return a + b


class Agent:
    @deprecated("use act instead")
    def step(self, x: int) -> int:
        """Take a step."""
        return x * 2

    @deprecated("use make instead")
    @classmethod
    def build(cls) -> Agent:
        return cls()

    @staticmethod
    @deprecated("use helper2 instead")
    def helper() -> str:
        return "ok"


@deprecated("use NewBuffer instead", version="0.3")
class OldBuffer:
    """An old buffer."""

    def __init__(self, size: int) -> None:
        self.size = size


@deprecated("use Nothing instead")
class NoInit:
    pass


def test_function_warns_at_caller_and_still_works() -> None:
    with pytest.warns(DeprecationWarning, match=r"add is deprecated since version 0\.2") as record:
        call_line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
        assert add(2, b=3) == 5
    assert len(record) == 1
    # Attributed to this caller's line, not to the decorator's wrapper.
    assert (record[0].filename, record[0].lineno) == (__file__, call_line)


def test_warns_once_per_call() -> None:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(3):
            add(1)
    assert [w.category for w in record] == [DeprecationWarning] * 3


def test_metadata_and_docstring_note() -> None:
    assert add.__name__ == "add"
    assert add.__qualname__ == "add"
    assert add.__module__ == __name__
    assert str(inspect.signature(add)) == "(a: 'int', b: 'int' = 1) -> 'int'"
    assert add.__doc__ is not None
    assert add.__doc__.startswith("Add two numbers.")
    assert "    a: First." in add.__doc__
    assert add.__doc__.endswith("Deprecated:\n    Since version 0.2: use add_three instead")
    assert Agent.helper.__doc__ == "Deprecated:\n    use helper2 instead"


def test_methods_classmethods_and_staticmethods() -> None:
    agent = Agent()
    with pytest.warns(DeprecationWarning, match=r"Agent\.step is deprecated: use act instead"):
        assert agent.step(4) == 8
    with pytest.warns(DeprecationWarning, match=r"Agent\.build is deprecated"):
        assert isinstance(Agent.build(), Agent)
    with pytest.warns(DeprecationWarning, match=r"Agent\.helper is deprecated"):
        assert Agent.helper() == "ok"


def test_class_warns_on_instantiation_and_stays_a_class() -> None:
    with pytest.warns(DeprecationWarning, match=r"OldBuffer is deprecated since version 0\.3"):
        buffer = OldBuffer(4)
    assert isinstance(buffer, OldBuffer)
    assert buffer.size == 4
    assert OldBuffer.__name__ == "OldBuffer"
    assert OldBuffer.__doc__ == (
        "An old buffer.\n\nDeprecated:\n    Since version 0.3: use NewBuffer instead"
    )
    with pytest.warns(DeprecationWarning, match="NoInit is deprecated"):
        NoInit()


def test_class_warning_points_at_the_caller() -> None:
    with pytest.warns(DeprecationWarning) as record:
        call_line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
        OldBuffer(1)
    assert (record[0].filename, record[0].lineno) == (__file__, call_line)


def test_bare_decorator_is_rejected() -> None:
    with pytest.raises(ConfigurationError, match="non-empty reason string"):

        @deprecated  # type: ignore[arg-type]
        def f() -> None:
            pass

    with pytest.raises(ConfigurationError, match="got ''"):
        deprecated("")


def test_non_callable_is_rejected() -> None:
    with pytest.raises(ConfigurationError, match="decorates functions, methods and classes"):
        deprecated("x")(42)


def test_weak_reference_returns_the_object_until_it_is_collected() -> None:
    class Policy:
        pass

    policy = Policy()
    collected: list[object] = []
    reference = WeakReference[Policy](policy, collected.append)
    assert reference() is policy
    assert isinstance(reference, WeakReference)
    del policy
    gc.collect()
    assert reference() is None
    assert collected == [reference]


def test_an_argument_is_taken_under_either_name_but_not_both() -> None:
    assert upstream_alias("Loader", ("run_dir", "runs/a"), ("run_root", None)) == "runs/a"
    assert upstream_alias("Loader", ("run_dir", None), ("run_root", "runs/b")) == "runs/b"
    assert upstream_alias("Loader", ("run_dir", None), ("run_root", None)) is None
    with pytest.raises(ConfigurationError, match="Loader: got both run_dir= and run_root="):
        upstream_alias("Loader", ("run_dir", "runs/a"), ("run_root", "runs/b"))
