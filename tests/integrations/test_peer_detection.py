"""Telling peer files apart by content, without unpickling anything."""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest

from emote_core.errors import FormatError
from emote_core.integrations.detect import detect_peer_format, read_peer_file

UPSTREAM = Path(__file__).parent / "upstream" / "data" / "emote-rl-23-legacy-numpy1.26.zip"


@pytest.mark.parametrize(
    ("name", "format"),
    [
        ("sb3_sac_pendulum_wrapped.pkl", "sb3-replay-buffer"),
        ("sb3_sac_dict_2envs.pkl", "sb3-replay-buffer"),
        ("skrl2_sac_pendulum.pt", "skrl-memory"),
        ("skrl2_sac_pendulum.npz", "skrl-memory"),
        ("skrl1_memory_2envs.csv", "skrl-memory"),
        # skrl's PPO (no next observations): recognised, so the reader can say why it refuses.
        ("skrl2_ppo_pendulum.pt", "skrl-memory"),
        ("skrl2_ppo_pendulum.npz", "skrl-memory"),
        ("skrl2_ppo_pendulum.csv", "skrl-memory"),
        ("tmrl_pendulum.data.pkl", "tmrl-dataset"),
        ("sb3_dqn_cartpole_2envs.record.npz", None),  # an npz, but not a memory
    ],
)
def test_real_files_are_recognised(data_file, name, format):
    assert detect_peer_format(data_file(name)) == format


def test_content_decides_not_the_extension(data_file, tmp_path):
    renamed = tmp_path / "buffer.bin"
    renamed.write_bytes(data_file("skrl1_memory_2envs.npz").read_bytes())
    assert detect_peer_format(renamed) == "skrl-memory"
    assert len(read_peer_file(renamed).episodes) == 8


def test_emote_and_other_files_are_not_peer_files(tmp_path):
    legacy_dump = tmp_path / "dump.pickle"
    legacy_dump.write_bytes(pickle.dumps({"obs": np.zeros((1, 1, 1, 3))}))
    other_zip = tmp_path / "other.zip"
    with zipfile.ZipFile(other_zip, "w") as archive:
        archive.writestr("version", "1")
    empty = tmp_path / "empty.pkl"
    empty.write_bytes(b"")
    text = tmp_path / "notes.csv"
    text.write_text("a,b\n1,2\n")
    for path in (legacy_dump, other_zip, empty, text, tmp_path / "missing.pkl"):
        assert detect_peer_format(path) is None, path
    if UPSTREAM.is_file():
        assert detect_peer_format(UPSTREAM) is None


def test_undetectable_files_name_the_formats_and_the_fix(tmp_path):
    path = tmp_path / "notes.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(FormatError, match="name its format with `format`"):
        read_peer_file(path)
    with pytest.raises(FormatError, match="unknown peer format 'minari'"):
        read_peer_file(path, "minari")


def test_detection_does_not_run_a_pickle(tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            import os

            return os.system, (f"touch {marker}",)

    path = tmp_path / "x.pkl"
    path.write_bytes(pickle.dumps({"buffer": Payload()}))
    assert detect_peer_format(path) is None
    assert not marker.exists()


def test_detection_allocates_nothing_a_pickle_declares(tmp_path):
    import tracemalloc

    from emote_core.integrations.upstream import read_table_file

    declared = tmp_path / "declares.pkl"  # BINBYTES8 of 1 GiB, then 3 bytes
    declared.write_bytes(b"\x80\x04\x8e" + (1 << 30).to_bytes(8, "little") + b"abc.")
    tracemalloc.start()
    try:
        assert detect_peer_format(declared) is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{peak:,} bytes allocated to look at a 16-byte file"
    with pytest.raises(FormatError, match=r"^legacy dump '.*declares.pkl': the data is not a"):
        read_table_file(declared)


def test_detection_inflates_at_most_a_mebibyte_of_a_torch_pickle(tmp_path):
    import tracemalloc

    bomb = tmp_path / "memory.pt"  # a torch.save-like zip whose data.pkl inflates to 256 MiB
    with (
        zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive,
        archive.open("memory/data.pkl", "w") as member,
    ):
        member.write(b"\x80\x04\x8e" + (256 << 20).to_bytes(8, "little"))
        block = bytes(1 << 20)
        for _ in range(256):
            member.write(block)
    assert bomb.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        assert detect_peer_format(bomb) is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{peak:,} bytes allocated to look at a {bomb.stat().st_size:,}-byte zip"
