"""Malicious pickles shaped like SB3 buffers and tmrl datasets are refused before anything runs."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from emote_core.errors import FormatError, UnsafePickleError
from emote_core.integrations.detect import detect_peer_format, read_peer_file
from emote_core.integrations.sb3.replay_buffer import read_sb3_replay_buffer
from emote_core.integrations.tmrl.dataset import read_tmrl_dataset
from emote_core.stores.safe_pickle import (
    ALLOWED_GLOBALS,
    PeerObject,
    safe_loads,
    upstream_name,
)

PAYLOADS = [
    ("os", "system"),
    ("posix", "system"),
    ("builtins", "eval"),
    ("subprocess", "Popen"),
    ("emote_totally_unknown_module", "run"),
]


def _text(value: str) -> bytes:
    raw = value.encode()
    return b"\x8c" + bytes([len(raw)]) + raw  # SHORT_BINUNICODE


def _sb3_shaped(module: str, name: str, argument: str) -> bytes:
    """``ReplayBuffer()`` whose ``observations`` attribute is ``module.name(argument)``."""
    return (
        b"\x80\x04"
        + _text("stable_baselines3.common.buffers")
        + _text("ReplayBuffer")
        + b"\x93)\x81}"  # STACK_GLOBAL, EMPTY_TUPLE, NEWOBJ, EMPTY_DICT
        + _text("observations")
        + _text(module)
        + _text(name)
        + b"\x93"
        + _text(argument)
        + b"\x85Rsb."  # TUPLE1, REDUCE, SETITEM, BUILD, STOP
    )


def _tmrl_shaped(module: str, name: str, argument: str) -> bytes:
    """Seven lists whose observations list holds ``module.name(argument)``."""
    call = _text(module) + _text(name) + b"\x93" + _text(argument) + b"\x85R"
    lists = b"]" * 1 + b"](" + call + b"e" + b"]" * 5  # actions, [payload], five more lists
    return b"\x80\x04](" + lists + b"e."


@pytest.mark.parametrize(("module", "name"), PAYLOADS)
@pytest.mark.parametrize("shape", ["sb3", "tmrl"])
def test_payload_is_refused_naming_the_global_and_never_runs(tmp_path, module, name, shape):
    marker = tmp_path / "payload-ran"
    build, read = (
        (_sb3_shaped, read_sb3_replay_buffer)
        if shape == "sb3"
        else (
            _tmrl_shaped,
            read_tmrl_dataset,
        )
    )
    path = tmp_path / "data.pkl"
    path.write_bytes(build(module, name, f"touch {marker}"))
    with pytest.raises(UnsafePickleError, match=rf"'{module}\.{name}'"):
        read(path)
    with pytest.raises(UnsafePickleError, match=rf"'{module}\.{name}'"):
        read_peer_file(path)  # detection peeks at opcodes only, then the reader refuses
    assert not marker.exists()


@pytest.mark.parametrize("shape", ["sb3", "tmrl"])
def test_the_same_pickles_with_an_allowed_call_load(tmp_path, shape):
    """The crafted pickles are valid: only the global decides, as the refusals above claim."""
    build = _sb3_shaped if shape == "sb3" else _tmrl_shaped
    loaded = safe_loads(build("builtins", "int", "7"))
    if shape == "sb3":
        assert upstream_name(loaded) == "stable_baselines3.common.buffers.ReplayBuffer"
        assert loaded.observations == 7
    else:
        assert loaded[1] == [7] and len(loaded) == 7


def test_a_real_os_system_pickle_from_pickle_itself_is_refused(tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    lists = [[None], [Payload()], [0.0], [False], [False], [{}], [False]]
    path = tmp_path / "data.pkl"
    path.write_bytes(pickle.dumps(lists))
    assert detect_peer_format(path) == "tmrl-dataset"
    with pytest.raises(UnsafePickleError, match="system"):
        read_tmrl_dataset(path)
    assert not marker.exists()


def test_peer_stand_ins_only_hold_what_was_pickled():
    buffer = safe_loads(_sb3_shaped("torch", "device", "cpu"))
    device = buffer.observations
    assert isinstance(device, PeerObject) and device.constructor_args == ("cpu",)
    assert upstream_name(device) == "torch.device"
    with pytest.raises(TypeError, match="read-only stand-in"):
        pickle.dumps(device)


def test_setting_state_on_a_stand_in_class_is_refused():
    # BUILD aimed at the class itself (GLOBAL, EMPTY_DICT, BUILD) must not touch the class.
    data = b"\x80\x04" + _text("torch") + _text("device") + b"\x93}" + _text("x") + b"K\x01sb."
    with pytest.raises(FormatError):
        safe_loads(data)
    assert not hasattr(ALLOWED_GLOBALS["torch", "device"], "x")


def test_numpy_generators_in_real_spaces_come_back_as_inert_state(data_file):
    buffer = safe_loads(data_file("sb3_dqn_cartpole_2envs.pkl").read_bytes())
    generator = buffer.action_space._np_random
    assert upstream_name(generator) == "numpy.random._pickle.__generator_ctor"
    (bit_generator,) = generator.constructor_args
    state, seed_sequence = bit_generator.pickled_state
    assert state["bit_generator"] == "PCG64"
    assert upstream_name(seed_sequence) == "numpy.random.bit_generator.__pyx_unpickle_SeedSequence"
    assert not isinstance(generator, np.random.Generator)


def test_trusted_loading_is_only_on_request(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "data.pkl"
    path.write_bytes(_tmrl_shaped("os", "system", f"touch {marker}"))
    with pytest.raises(UnsafePickleError):
        read_tmrl_dataset(path)
    assert not marker.exists()
    with pytest.raises(FormatError):  # trusted: the pickle runs (the user vouched), data is junk
        read_tmrl_dataset(path, trust_pickle=True)
    assert marker.exists()
