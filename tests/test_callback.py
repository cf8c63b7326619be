"""Hook definition and by-name injection of training-state values."""

from __future__ import annotations

import pytest

from emote_core.callback import LIFECYCLE_HOOKS, BatchCallback, Callback, Order
from emote_core.errors import CallbackDefinitionError, MissingStateKeyError


def test_unknown_hook_name_fails_at_class_definition() -> None:
    with pytest.raises(CallbackDefinitionError, match="'end_bach', which is not a hook"):

        class Misspelt(Callback):
            def end_bach(self) -> None:
                pass


def test_extra_hooks_are_accepted_and_select_arguments_by_name() -> None:
    class WithExtra(Callback):
        extra_hooks = ("begin_rollout",)

        def begin_rollout(self, observation, scale=2):
            return observation * scale

    callback = WithExtra()
    assert callback.begin_rollout(observation=3, unrelated="ignored") == 6
    assert callback.begin_rollout(observation=3, scale=10, unrelated=1) == 30
    with pytest.raises(MissingStateKeyError, match="hook 'begin_rollout' needs 'observation'"):
        callback.begin_rollout(actions=1)


def test_extra_hook_declared_without_method_is_rejected() -> None:
    with pytest.raises(CallbackDefinitionError, match="defines no method"):

        class Declared(Callback):
            extra_hooks = ("loss",)


def test_extra_hook_cannot_reuse_a_lifecycle_name() -> None:
    with pytest.raises(CallbackDefinitionError, match="need names of their own"):

        class Clash(Callback):
            extra_hooks = ("backward",)

            def backward(self) -> None:
                pass


def test_group_values_come_before_top_level_values() -> None:
    class Reader(Callback):
        def begin_batch(self, rewards, bp_step):
            return {"seen": (rewards, bp_step)}

    state = {"rewards": "top", "bp_step": 7, "default": {"rewards": "group"}}
    assert Reader(data_group="default").call_hook("begin_batch", state) == {"seen": ("group", 7)}
    assert Reader().call_hook("begin_batch", state) == {"seen": ("top", 7)}


def test_missing_key_error_names_callback_hook_key_and_available_keys() -> None:
    class Needy(Callback):
        def backward(self, q_target):
            pass

    state = {"bp_step": 1, "default": {"rewards": 0, "actions": 1}}
    with pytest.raises(MissingStateKeyError) as caught:
        Needy(name="q1", data_group="default").call_hook("backward", state)
    message = str(caught.value)
    for fragment in ("'q1'", "Needy", "'backward'", "'q_target'", "bp_step", "actions", "rewards"):
        assert fragment in message


def test_defaults_fill_parameters_missing_from_the_state() -> None:
    class Defaulted(Callback):
        def end_batch(self, bp_step, scale=3.0):
            return {"scaled": bp_step * scale}

    assert Defaulted().call_hook("end_batch", {"bp_step": 2}) == {"scaled": 6.0}
    assert Defaulted().call_hook("end_batch", {"bp_step": 2, "scale": 1.0}) == {"scaled": 2.0}


def test_var_keyword_hooks_receive_everything_with_group_values_winning() -> None:
    class Everything(Callback):
        def backward(self, **state):
            return {"got": dict(state)}

    state = {"a": 1, "b": 2, "g": {"b": 20, "c": 30}}
    got = Everything(data_group="g").call_hook("backward", state)["got"]
    assert got["a"] == 1 and got["b"] == 20 and got["c"] == 30


def test_batch_callback_requires_get_batch() -> None:
    class NoBatch(BatchCallback):
        pass

    with pytest.raises(TypeError, match="get_batch"):
        NoBatch()

    class Demonstrations(BatchCallback):
        def get_batch(self, observation):
            return {"demo": observation}

    assert Demonstrations().get_batch(observation=1, rewards=2) == {"demo": 1}


def test_overrides_reports_only_implemented_hooks() -> None:
    class OnlyBackward(Callback):
        def backward(self):
            pass

    callback = OnlyBackward()
    assert [h for h in LIFECYCLE_HOOKS if callback.overrides(h)] == ["backward"]


@pytest.mark.parametrize("cycle", [-1, 1.5, True])
def test_invalid_cycle_is_rejected(cycle) -> None:
    with pytest.raises(CallbackDefinitionError, match=f"cycle={cycle!r}"):
        Callback(cycle=cycle)


def test_cycle_zero_means_never_as_upstream() -> None:
    assert Callback(cycle=0).cycle is None


def test_order_constants_are_ascending_in_lifecycle_sense() -> None:
    assert Order.RESTORE < Order.DATA < Order.REWARD < Order.TARGET < Order.DEFAULT
    assert Order.DEFAULT < Order.LOGGING
    assert Order.LOGGING < Order.TERMINATOR < Order.CHECKPOINT < Order.TEST_CHECK
