"""The chain head file: two slots written in place, the newest that checks out is the head.

A crash can tear the slot being written; the other slot then still holds the head
before it. A file of the earlier format (one JSON object, replaced whole) is read, and
turned into two slots at the first save. Its mode is 0600 in a 0700 folder.
"""

from __future__ import annotations

import stat

import orjson

from storage.chain import GENESIS, Head
from storage.headfile import SLOT, HeadFile


def heads(n: int) -> list[Head]:
    return [Head(i, f"{i:064x}") for i in range(1, n + 1)]


def saved(path, *runs: list[Head]) -> bytearray:
    """The file after each run of saves (a HeadFile each, closed: a restart between runs)."""
    for run in runs:
        f = HeadFile(path)
        for head in run:
            f.save(head)
        f.close()
    return bytearray(path.read_bytes())


def slot_of(data: bytearray, seq: int) -> int:
    """Where the slot holding head ``seq`` starts."""
    return 0 if orjson.loads(bytes(data[:SLOT]))["seq"] == seq else SLOT


def test_the_last_head_saved_is_loaded(tmp_path):
    path = tmp_path / "state" / "head-x.json"
    assert HeadFile(path).load() is None, "a first start has none"
    f = HeadFile(path)
    for head in heads(5):
        f.save(head)
        assert HeadFile(path).load() == head
    f.close()
    assert path.stat().st_size == 2 * SLOT
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_a_torn_slot_leaves_the_head_before_it(tmp_path, caplog):
    path = tmp_path / "head-x.json"
    first, second, third = heads(3)
    data = saved(path, [first, second, third])
    newest = slot_of(data, 3)
    data[newest + 10 : newest + 20] = b"\x00" * 10  # a write cut short by a crash
    path.write_bytes(bytes(data))
    assert HeadFile(path).load() == second
    data[newest : newest + SLOT] = orjson.dumps({"seq": 9, "hash": "f" * 64, "crc": 1}).ljust(SLOT - 1) + b"\n"
    path.write_bytes(bytes(data))
    assert HeadFile(path).load() == second, "a slot whose CRC does not check out is not the head"
    other = SLOT - newest
    data[other : other + SLOT] = b" " * SLOT
    path.write_bytes(bytes(data))
    assert HeadFile(path).load() is None
    assert "neither slot checks out" in caplog.text


def test_after_a_restart_the_first_save_goes_into_the_older_slot(tmp_path):
    """The newest head survives a crash that tears the first write of the next run."""
    path = tmp_path / "head-x.json"
    data = saved(path, heads(3), [Head(4, "d" * 64)])
    newest = slot_of(data, 4)
    data[newest : newest + 20] = b"\x00" * 20
    path.write_bytes(bytes(data))
    assert HeadFile(path).load() == heads(3)[-1]


def test_a_slot_without_its_crc_is_not_the_head(tmp_path):
    path = tmp_path / "head-x.json"
    data = saved(path, heads(2))
    older = slot_of(data, 1)
    data[older : older + SLOT] = orjson.dumps({"seq": 9, "hash": "f" * 64}).ljust(SLOT - 1) + b"\n"
    path.write_bytes(bytes(data))
    assert HeadFile(path).load() == heads(2)[-1]


def test_a_file_of_the_earlier_format_is_read_and_kept_at_the_first_save(tmp_path):
    path = tmp_path / "head-x.json"
    path.write_bytes(orjson.dumps({"seq": 41, "hash": "a" * 64}))
    assert HeadFile(path).load() == Head(41, "a" * 64)
    f = HeadFile(path)
    f.save(Head(42, "b" * 64))
    f.close()
    assert HeadFile(path).load() == Head(42, "b" * 64)
    data = path.read_bytes()
    assert sorted(orjson.loads(data[i : i + SLOT])["seq"] for i in (0, SLOT)) == [41, 42]


def test_a_head_file_that_cannot_be_written_is_said_once_and_tried_again(tmp_path, caplog):
    blocker = tmp_path / "state"
    blocker.write_text("a file where the folder should be")
    f = HeadFile(blocker / "head-x.json")
    f.save(Head(1, GENESIS))
    f.save(Head(2, GENESIS))
    assert caplog.text.count("cannot write") == 1
    blocker.unlink()
    f.save(Head(3, "c" * 64))
    f.close()
    assert HeadFile(blocker / "head-x.json").load() == Head(3, "c" * 64)


def test_a_file_grown_past_two_slots_is_not_read_whole(tmp_path, caplog):
    """A head file someone made huge is refused after reading just past its size."""
    path = tmp_path / "head-x.json"
    path.write_bytes(b" " * (64 * 1024 * 1024))
    assert HeadFile(path).load() is None
    assert "not a head file" in caplog.text
