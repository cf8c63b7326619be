"""A column whose array metadata was edited (its chunk shape) reads the same on the local file
system, where zarrs decodes it, and on S3, where zarr-python's own pipeline does: damaged where
zarr-python cannot read the chunks back, to verify, to loading and to a writer appending (one
line, nothing committed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from emote_cli.app import app
from emote_core.errors import FormatError
from emote_core.memory.columns import Column
from emote_core.memory.strategies import FifoEjectionStrategy, UniformSampleStrategy
from emote_core.memory.table import ArrayMemoryTable
from emote_core.stores.zarr_store import ShardWriter, create_store, store_columns
from emote_core.stores.zarr_store.tables import load_table
from emote_core.stores.zarr_store.verify import verify_store


def chunk_edited_store(kit, folder: Path) -> Path:
    """A local store of episodes 0-9 whose ``obs`` column claims larger chunks than it holds
    (its chunk file decodes to fewer rows than one chunk)."""
    url = folder / "s.zarr"
    create_store(url, columns=store_columns(kit.schemas, kit.make(1), "rewards"),
                 length_key="rewards")  # fmt: skip
    with ShardWriter(url) as writer:
        writer.append([kit.make(k) for k in range(10)])
    path = url / "shards" / "main" / "columns" / "obs" / "zarr.json"
    document = json.loads(path.read_text())
    document["chunk_grid"]["configuration"]["chunk_shape"][0] *= 2
    path.write_text(json.dumps(document))
    return url


def placed(kit, tmp_path: Path, where: str, request: pytest.FixtureRequest) -> str:
    local = chunk_edited_store(kit, tmp_path)
    if where == "local":
        return str(local)
    import s3fs

    url = f"{request.getfixturevalue('s3_bucket')}/s.zarr"
    s3fs.S3FileSystem().put(str(local), url.removeprefix("s3://"), recursive=True)
    return url


@pytest.mark.parametrize("where", ["local", "s3"])
def test_an_edited_chunk_shape_is_the_same_damage_locally_and_on_s3(
    kit, tmp_path, request, where
) -> None:
    url = placed(kit, tmp_path, where, request)

    report = verify_store(url)
    assert not report.ok and len(report.damaged_episodes) == 10
    assert any("columns/obs/c/0/0" in problem for problem in report.problems)

    memory = ArrayMemoryTable(
        columns=[Column(s.name, s.shape, s.dtype) for s in kit.schemas],
        maxlen=1000, sampler=UniformSampleStrategy(), ejector=FifoEjectionStrategy(),
        length_key="rewards", seed=0,
    )  # fmt: skip
    with pytest.raises(FormatError, match="10 damaged episodes"):
        load_table(memory, [url])

    with ShardWriter(url) as writer, pytest.raises(FormatError) as refused:
        writer.append([kit.make(10)])
    said = str(refused.value)
    assert "\n" not in said and "column 'obs' cannot be appended to" in said
    assert "shards/main/columns/obs/c/0/0 does not decode" in said
    assert verify_store(url).episodes == 10  # nothing committed, no rows left past the commit


def test_an_appending_collect_on_such_a_store_is_one_error_line(tmp_path, runner) -> None:
    url = tmp_path / "p.zarr"
    collect = ["collect", "sac_pendulum", "--out", str(url), "--steps", "200"]
    assert runner.invoke(app, collect).exit_code == 0
    path = url / "shards" / "main" / "columns" / "obs" / "zarr.json"
    document = json.loads(path.read_text())
    document["chunk_grid"]["configuration"]["chunk_shape"][0] *= 2
    path.write_text(json.dumps(document))
    chunk = url / "shards" / "main" / "columns" / "obs" / "c" / "0" / "0"
    before = chunk.read_bytes()

    result = runner.invoke(app, collect)
    assert result.exit_code == 1, result.output
    last = result.stderr.strip().splitlines()[-1]
    assert "Traceback" not in result.output and last.startswith("error: store ")
    assert "column 'obs' cannot be appended to" in last and "emote memory verify" in last
    assert chunk.read_bytes() == before
    assert json.loads(path.read_text())["shape"][0] == 201  # as committed
