"""The client's outbox: bounded memory, spill to disk, ack, reload."""

from gradwatch.outbox import Outbox


def test_spills_oldest_batches_past_the_budget_and_reads_them_back(tmp_path):
    box = Outbox(tmp_path, max_memory_bytes=100)
    for seq in range(1, 11):
        box.add(seq, bytes([seq]) * 30)
    assert box.spilled_total > 0 and len(list(tmp_path.glob("*.json"))) == box.spilled_total
    assert [box.get(s) for s in box.seqs_from(1)] == [bytes([s]) * 30 for s in range(1, 11)]
    box.ack(5)
    assert box.seqs_from(0) == [6, 7, 8, 9, 10] and box.first() == 6
    assert all(int(p.stem) > 5 for p in tmp_path.glob("*.json"))


def test_spill_all_and_reload_for_sync(tmp_path):
    box = Outbox(tmp_path)
    box.add(1, b"a")
    box.add(2, b"b")
    assert box.spill_all() == 2
    again = Outbox.load(tmp_path)
    assert again.seqs_from(0) == [1, 2] and again.get(2) == b"b"
