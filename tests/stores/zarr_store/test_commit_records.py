"""Commit records edited by hand: a record of the wrong types, negative or not whole, or whose
counts disagree with each other or with the episode table, is damage to every reader and writer
(verify, inspect, loading for training, following, appending): one line naming the shard and
its file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from emote_cli.app import app
from emote_core.errors import FormatError
from emote_core.stores.follow import StoreFollower
from emote_core.stores.zarr_store import MemoryStore, ShardWriter, create_store, store_columns
from emote_core.stores.zarr_store.tables import load_table
from tests.stores.test_follow import table

EDITS = {
    "negative episodes": ("episodes", -3, "'episodes' is -3"),
    "episodes as text": ("episodes", "many", "'episodes' is 'many'"),
    "fractional episodes": ("episodes", 2.5, "'episodes' is 2.5"),
    "episodes as a boolean": ("episodes", True, "'episodes' is True"),
    "rows as text": ("rows", "x", "'rows' is 'x'"),
    "sequence as text": ("sequence", "a", "'sequence' is 'a'"),
    "inflated rows": ("rows.obs", 10**12, "'rows.obs' is 1000000000000"),
    "inflated transitions": ("transitions", 10**12, "'rows.obs' is"),
    "a missing column count": ("rows.actions", None, "no count for column 'actions'"),
}


def edited_store(kit, tmp_path: Path, field: str, value: object) -> str:
    """A store with shards 'main' (episodes 0-9) and 'other' (100-104), 'main''s commit record
    edited: ``field`` set to ``value`` (``rows.<column>``: that column's count; ``None``:
    removed)."""
    url = str(tmp_path / "s.zarr")
    create_store(url, columns=store_columns(kit.schemas, kit.make(1), "rewards"),
                 length_key="rewards")  # fmt: skip
    for shard, identities in (("main", range(10)), ("other", range(100, 105))):
        with ShardWriter(url, shard=shard) as writer:
            writer.append([kit.make(k) for k in identities])
    path = Path(url) / "shards" / "main" / "zarr.json"
    document = json.loads(path.read_text())
    commit = document["attributes"]["commit"]
    record, key = (commit["rows"], field[5:]) if field.startswith("rows.") else (commit, field)
    if value is None:
        del record[key]
    else:
        record[key] = value
    path.write_text(json.dumps(document))
    return url


@pytest.mark.parametrize("edit", list(EDITS), ids=list(EDITS))
def test_a_damaged_commit_record_is_damage_to_every_reader_and_writer(
    kit, tmp_path, runner, edit
) -> None:
    field, value, said = EDITS[edit]
    url = edited_store(kit, tmp_path, field, value)
    named = "shard 'main': the commit record in shards/main/zarr.json is damaged"

    verified = runner.invoke(app, ["memory", "verify", url, "--json"])
    assert verified.exit_code == 1, verified.output
    report = json.loads(verified.stdout)
    assert not report["ok"] and any(named in p and said in p for p in report["problems"])
    assert report["episodes"] == 5  # the other shard is still checked
    plain = runner.invoke(app, ["memory", "verify", url])
    assert plain.exit_code == 1 and "Traceback" not in plain.output
    assert len(plain.stderr.strip().splitlines()) == 1 and said in plain.stderr

    inspected = runner.invoke(app, ["memory", "inspect", url, "--json"])
    assert inspected.exit_code == 0, inspected.output
    assert named in json.loads(inspected.stdout)["damaged_shards"]["main"]

    memory = table()
    with pytest.raises(FormatError, match=f"{named}.*`skip_damaged=True`"):
        load_table(memory, [url])
    load_table(memory, [url], skip_damaged=True)  # only the intact shard
    assert sorted(int(data["obs"][0, 0]) for _, data, _ in memory.episodes()) == list(
        range(100, 105)
    )

    with pytest.raises(FormatError, match=f"{named}.*`skip_damaged=True`"):
        StoreFollower(table(), [url]).fill()
    follower = StoreFollower(table(), [url], skip_damaged=True)
    assert follower.fill().episodes == 5

    before = (Path(url) / "shards" / "main" / "zarr.json").read_bytes()
    with pytest.raises(FormatError, match=f"{named}.*will not append"):
        ShardWriter(url, shard="main")
    assert (Path(url) / "shards" / "main" / "zarr.json").read_bytes() == before


def test_a_commit_record_that_disagrees_with_the_episode_table_is_damage(kit, tmp_path) -> None:
    url = edited_store(kit, tmp_path, "episodes", 10)  # as it was; inflated below
    path = Path(url) / "shards" / "main" / "zarr.json"
    document = json.loads(path.read_text())
    commit = document["attributes"]["commit"]
    commit["transitions"] += 7  # consistent with itself, not with the episodes' lengths
    commit["rows"] = {name: count + 7 for name, count in commit["rows"].items()}
    path.write_text(json.dumps(document))

    said = "'transitions' is 62, but the last committed episode .* ends at transition 55"
    assert re.search(said, MemoryStore(url).damaged_shards["main"])
    with pytest.raises(FormatError, match=said):
        load_table(table(), [url])
    with pytest.raises(FormatError, match=f"shards/main/zarr.json is damaged.*{said}"):
        ShardWriter(url, shard="main")
    with pytest.raises(FormatError, match=f"shards/main/zarr.json is damaged.*{said}"):
        StoreFollower(table(), [url]).fill()
