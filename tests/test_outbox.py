"""The client's outbox: bounded memory, spill to disk, ack, reload, a disk that refuses writes."""

import os
import subprocess
import uuid

import pytest

from gradwatch import protocol
from gradwatch.delivery.outbox import Outbox


def test_spills_oldest_batches_past_the_budget_and_reads_them_back(tmp_path):
    box = Outbox(tmp_path, max_memory_bytes=100)
    for seq in range(1, 11):
        box.add(seq, bytes([seq]) * 30, records=3)
    assert box.spilled_total > 0 and len(list(tmp_path.glob("0*.json"))) == box.spilled_total
    assert [box.get(s) for s in box.seqs_from(1)] == [bytes([s]) * 30 for s in range(1, 11)]
    assert box.ack(5) == 15 and box.pending_records == 15
    assert box.seqs_from(0) == [6, 7, 8, 9, 10] and box.first() == 6 and box.next_after(7) == 8
    assert all(int(p.stem) > 5 for p in tmp_path.glob("0*.json"))


def test_spill_all_and_reload_for_sync(tmp_path):
    box = Outbox(tmp_path, run_info={"uid": "u1"})
    box.add(1, b"a")
    box.add(2, b"b")
    assert box.spill_all() == (2, 0)
    assert (tmp_path / "run.json").is_file()  # written with the first batch file, for sync
    again = Outbox.load(tmp_path)
    assert again.seqs_from(0) == [1, 2] and again.get(2) == b"b"


def test_a_delivered_spool_is_removed_and_an_unused_one_never_created(tmp_path):
    box = Outbox(tmp_path / "run", max_memory_bytes=10, run_info={"uid": "u"})
    box.add(1, b"x" * 20)
    box.add(2, b"y" * 20)
    assert (tmp_path / "run" / "run.json").is_file()
    box.ack(2)
    box.close()
    assert not (tmp_path / "run").exists()
    quiet = Outbox(tmp_path / "never")
    quiet.add(1, b"small")
    quiet.ack(1)
    quiet.close()
    assert not (tmp_path / "never").exists()


def test_unreadable_spool_file_becomes_a_gap_batch_with_the_same_seq(tmp_path):
    box = Outbox(tmp_path, max_memory_bytes=10)
    box.add(1, b"z" * 40, records=7)
    box.add(2, b"w" * 40, records=1)
    (tmp_path / f"{1:012d}.json").unlink()
    batch = protocol.loads(box.get(1))
    assert batch["seq"] == 1 and batch["records"] == []
    assert batch["events"][0]["kind"] == "data_gap" and "7 record" in batch["events"][0]["message"]


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 64 KiB tmpfs (we run as root in CI); skips nothing: fails loudly if it cannot mount."""
    mount = tmp_path / f"tiny-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_full_disk_keeps_memory_bounded_and_says_so(tiny_disk):
    box = Outbox(tiny_disk / "run", max_memory_bytes=20_000, run_info={"uid": "u"})
    seq = 0
    while not box.full() and seq < 200:  # 64 KiB of disk + 20 KB of memory hold ~8 of these
        seq += 1
        box.add(seq, os.urandom(5000).hex().encode()[:10_000], records=10)
    assert box.full() and box.disk_error and "No space" in box.disk_error
    assert seq < 20  # it noticed at once rather than after a long loop
    assert not list((tiny_disk / "run").glob("*.tmp"))  # no half-written file left taking space
    kept, lost = box.spill_all()
    assert kept + lost == seq and lost > 0
    assert [box.get(s) is not None for s in box.seqs_from(0)] == [True] * seq
    box.close()  # releases the spool lock (an open file on the tmpfs)
