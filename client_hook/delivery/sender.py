"""The background thread that batches records and delivers them to the server.

Flow: ``put`` (training thread) appends to a deque; this thread encodes what is queued into
numbered batches in the ``Outbox`` and streams them over one websocket, at most ``WINDOW``
unacked at a time. An idle link sends a record at once; a busy one accumulates records while
a batch is in flight, so batches grow with the load.

Garbage matters here: a full (gen-2) collection triggered inside ``log()`` stalls training for
~100 ms in a process that imported torch. So this thread keeps what it leaves to the cycle
collector small: one connection object at a time, closed when dropped, exceptions never kept
(their tracebacks hold frames), no thread per attempt.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from gradwatch.contract import LINK_MAX_GAP, LINK_MIN_GAP, OUTBOX_MEMORY_BYTES
from gradwatch.delivery.gaps import Gaps
from gradwatch.delivery.link import Link, LinkClosed, Refused
from gradwatch.delivery.outbox import Outbox
from gradwatch.delivery.progress import Patience, Progress
from gradwatch.media.outgoing import Outbound
from gradwatch.values import MAX_FRAME_BYTES, TARGET_BATCH_BYTES, Encoder, item_bytes

WINDOW = 8  # batches sent and not yet acked, at most (flow control)
# An idle link sends a record at once, but not more often than this: a loop logging hundreds of
# steps a second then wakes the sender 25 times a second instead of every step (each wake costs the
# training thread GIL time, and each frame ~1-3 ms of a local server's CPU: docs/benchmarks.md), and
# a point still reaches the server within ~40 ms; a run logging 20 steps a second or fewer is not
# delayed at all (at exactly the gap, jitter would make every other step wait for the one before).
MIN_GAP, MAX_SERVER_GAP = LINK_MIN_GAP, LINK_MAX_GAP  # the contract owns them: the server asks within them
# Hand-off queue bound (estimated bytes). It only fills when the sender is stuck (or a loop logs
# ~1M steps faster than they can be encoded: ~300 MB at peak); past it records are dropped and counted.
MAX_QUEUE_BYTES = 384 << 20
DRAIN_ITEMS = 50000  # items encoded per pass, so acks are read between passes of a backlog


class Sender(threading.Thread):
    """Drains records handed over by ``put`` and sends them in numbered, acked batches.

    ``put`` is a deque append: it never blocks and never raises. The thread reconnects with
    backoff, resends what the server has not acked, and keeps everything (memory, then disk)
    until it is acked; what it cannot keep is counted and reported as a ``data_gap`` alert.
    """

    def __init__(
        self,
        server: str,
        run_info: dict,
        spool_dir: Path,
        *,
        flush_interval: float = 0.2,
        max_memory_bytes: int = OUTBOX_MEMORY_BYTES,
        inspect: Callable | None = None,
        outbox: Outbox | None = None,
        token: str | None = None,
        max_queue_bytes: int = MAX_QUEUE_BYTES,
        notify: Callable | None = None,
        start_seq: int = 0,
    ):
        super().__init__(name="gradwatch-sender", daemon=True)
        self.link = Link(server, run_info, token)
        self.url = self.link.url
        self.server = server
        self.flush_interval = flush_interval
        self.max_queue_bytes = max_queue_bytes
        # run.json also names the server the run was meant for (older runs' spools go only there).
        self.outbox = outbox or Outbox(spool_dir, max_memory_bytes, {**run_info, "server": server})
        self.encoder = Encoder(inspect, Outbound())  # encoder.media: the run's media budget (gradwatch.media.outgoing)
        self.encoder.held.say = lambda text: self.notify("old-server-events", text)
        self.quiet = False  # sync prints its own summary
        self.on_connected = None  # called once, on its own thread, after the first welcome
        self._told: set[str] = set()
        # Written by the training thread only (read here): no lock needed for plain counters.
        self._queue: collections.deque = collections.deque()
        self._put_bytes = self._put_count = self._put_records = 0
        self._idle = False
        self.closed_for_puts = False
        # Written by this thread (or by close() once it stopped).
        self._taken_bytes = self._taken_count = self._taken_records = 0
        self._gaps = Gaps()  # what could not be kept, and events held back (its drop() runs on the training thread)
        self._seq = self.outbox.last() or start_seq  # start_seq: a continued run's last batch number
        self._acked = self._sent_upto = 0
        self.acked_records = 0
        self._last_drain = 0.0
        self._next_connect = self._server_gap = 0.0  # _server_gap: what the server's last ack asked for
        self._backoff = 0.1
        self.hurry = False
        self.failures = 0  # connection attempts that failed
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._drain_lock = threading.Lock()

    # -- state the run reads --------------------------------------------------------------
    run_id = property(lambda self: self.link.run_id)
    connected = property(lambda self: self.link.conn is not None)
    ever_connected = property(lambda self: self.link.ever_connected)
    fatal = property(lambda self: self.link.fatal)
    last_seq = property(lambda self: self._seq)  # the number of the last batch made
    features = property(lambda self: self.link.features)

    @property
    def dropped(self) -> int:
        """Records ``put`` refused because the hand-off queue was full (each reported in a data_gap alert)."""
        return self._gaps.dropped

    def pending_records(self) -> int:
        """Records logged and not yet acked (queued or in the outbox)."""
        return self._put_records - self._gaps.dropped - self.acked_records

    def queued(self) -> int:
        """Items handed over and not yet taken into a batch."""
        return len(self._queue)

    def unacked(self) -> int:
        """Batches sent and not yet acked (at most ``WINDOW``)."""
        return self._sent_upto - self._acked

    # -- called from the training thread ------------------------------------------------
    def put(self, item: tuple) -> None:
        """Hand over ('rec', step, t, scalars, vectors), ('event', dict) or ('layout', key, names)."""
        if self.closed_for_puts:
            return
        size = item_bytes(item)
        if item[0] == "rec":
            self._put_records += 1
            if self._put_bytes - self._taken_bytes + size > self.max_queue_bytes:
                self._gaps.drop(item[1])  # the sender is stuck: count it (reported as a gap), never grow
                return
        self._put_bytes += size
        self._put_count += 1
        self._queue.append(item)
        if self._idle:  # the thread sleeps with nothing to do: send this at once
            self._idle = False
            self._wake.set()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything put so far is acked; True on success."""
        return self.deliver(patience=timeout, grace=timeout, cap=timeout)

    def settle(self, timeout: float = 10.0) -> bool:
        """Wait until everything put so far is acked, or kept on disk while the server cannot be reached.

        Returns True when it got there within ``timeout`` seconds (then nothing put so far can be lost
        by this process dying), False otherwise.
        """
        start = time.monotonic()
        if self.deliver(patience=timeout, grace=min(timeout, 1.0), cap=timeout):
            return True
        if self.connected or self.fatal or not self.is_alive():
            return False
        wanted = self._put_count
        while self._taken_count < wanted and time.monotonic() - start < timeout:  # into batches first
            self._wake.set()
            time.sleep(0.01)
        if self._taken_count < wanted:
            return False
        _kept, lost = self.outbox.spill_all()  # the server is away: on disk, sent from there later
        return lost == 0

    def deliver(self, patience: float, grace: float, cap: float | None = None, progress: bool = False) -> bool:
        """Wait while delivery progresses; True once everything put so far is acked.

        Gives up after ``patience`` s without an ack advancing, ``grace`` s without a connection,
        or ``cap`` s in all. ``progress`` prints a progress line when it takes more than ~2 s.
        """
        wanted, target, failures = self._put_count, None, self.failures
        wait = Patience(patience, grace, cap, self._acked)
        # A run's own finish counts steps; `gradwatch sync` of a spool left on disk counts batches.
        left = self.pending_records if self._put_records else lambda: len(self.outbox)
        meter = Progress(left(), "steps" if self._put_records else "batches") if progress else None
        try:
            while True:
                self._wake.set()
                # All taken into batches (held events and unreported gaps too): wait for the last one's ack.
                if target is None and self._taken_count >= wanted and not self._gaps:
                    target = self._seq
                if target is not None and self._acked >= target:
                    return True
                # Unreachable: not connected although an attempt failed since we began waiting.
                unreachable = not self.connected and self.failures > failures
                if self.fatal or not self.is_alive() or wait.over(self._acked, unreachable):
                    return False
                if meter is not None:
                    meter.show(wait.elapsed(), left())
                time.sleep(0.01)
        finally:
            if meter is not None:
                meter.done()

    def hurry_up(self) -> None:
        """At finish: retry a lost connection at once and every 0.25 s at most."""
        self.hurry = True
        self._backoff = min(self._backoff, 0.25)
        self._next_connect = 0.0
        self._wake.set()

    def say_what_is_left(self, kept: int, lost: int) -> None:
        """After ``close``: tell the user on stderr what is kept on disk (and how to send it) and what is lost."""
        where = self.outbox.spool_dir
        if kept:
            steps = self.pending_records()
            print(
                f"gradwatch: {f'{steps:,} step(s) in ' if steps > 0 else ''}{kept} batch(es) were not delivered to "
                f"{self.server}; they are kept in {where} - send them later with `gradwatch sync {where}`",
                file=sys.stderr,
            )
        if lost:
            print(
                f"gradwatch: {lost} batch(es) could not be written to {where} ({self.outbox.disk_error}) and are lost",
                file=sys.stderr,
            )

    def close(self) -> tuple[int, int]:
        """Stop the thread and keep what is left on disk; returns (batches on disk, batches lost)."""
        self._stopping.set()
        self._wake.set()
        self.join(timeout=3.0)
        if self._drain_lock.acquire(timeout=2.0):  # the thread may be stuck inside a drain
            try:
                self.encoder.held.flush_unknown = True  # never welcomed: the spool keeps them for `gradwatch sync`
                while (self._queue or self.encoder.held.ready(self.features)) and not self.link.deleted:
                    self._drain_locked()
            finally:
                self._drain_lock.release()
        if self.link.deleted:
            return 0, 0
        kept, lost = self.outbox.spill_all()
        self.outbox.close()
        return kept, lost

    # -- the thread ----------------------------------------------------------------------
    def run(self) -> None:
        try:
            while not self._stopping.is_set():
                try:
                    self._cycle()
                except LinkClosed:
                    self._lost_link()
                except Exception as exc:  # never let the thread die: the data is still queued
                    self._lost_link()
                    self.notify(f"error:{type(exc).__name__}", f"gradwatch: sender error (will retry): {exc!r}")
                    del exc  # no traceback (and its frames) left behind
                    self._stopping.wait(0.1)
        finally:
            self.link.close()

    def _cycle(self) -> None:
        now = time.monotonic()
        if self.link.deleted:
            return self._discard_all()
        if self.link.conn is None:
            if not self.fatal and (self._work() or len(self.outbox)) and now >= self._next_connect:
                self._connect()  # before encoding: a welcome may offer the cheaper columnar form
            if self.link.conn is None:
                # Keep the hand-off queue short (it may hold device tensors): encode and spill.
                if self._work() and (now - self._last_drain >= self.flush_interval or self._backlog()):
                    self.drain()
                self._wait(self.flush_interval)
            return
        inflight = self.unacked()
        since = now - self._last_drain
        gap = max(MIN_GAP, self._server_gap)
        if self._work() and ((inflight == 0 and since >= gap) or since >= self.flush_interval or self._backlog()):
            self.drain()
        self._send_window()
        if self.unacked() > 0:
            due = self._last_drain + self.flush_interval - time.monotonic() if self._queue else self.flush_interval
            self._receive(max(0.001, due))
        else:
            self._receive(0)  # a server error or close while idle
            if self._queue:  # records logged within the gap of the last batch: they go when it has passed
                self._wake.wait(max(0.001, self._last_drain + gap - time.monotonic()))
                self._wake.clear()
            else:
                self._wait(self.flush_interval)

    def _work(self) -> bool:
        return bool(self._queue) or bool(self._gaps) or self.encoder.held.ready(self.features)

    def _backlog(self) -> bool:
        return self._put_bytes - self._taken_bytes > TARGET_BATCH_BYTES

    def _wait(self, timeout: float) -> None:
        self._idle = True
        if not self._queue or self.link.conn is None:
            self._wake.wait(timeout)
        self._idle = False
        self._wake.clear()

    def _connect(self) -> None:
        try:
            # The oldest batch still held; with none held, the next one: everything before was acked.
            first = self.outbox.first()
            welcome = self.link.open(
                resume_from=first if first is not None else self._seq + 1, layouts=self.encoder.layouts
            )
        except Refused as refusal:
            if not self.link.deleted:  # a deleted run says so itself (see _discard_all)
                self.notify(refusal.kind, refusal.text.replace("<spool>", str(self.outbox.spool_dir)))
            return
        except LinkClosed as closed:
            reason = closed.reason
            self.failures += 1
            self._next_connect = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, 0.25 if self.hurry else 5.0)
            if not self.ever_connected:  # say it once, early, and where the data goes meanwhile
                self.notify(
                    "unreachable",
                    f"gradwatch: cannot reach the server at {self.link.server} ({reason}); "
                    f"training goes on and the data is kept (in memory, then in {self.outbox.spool_dir}) "
                    "until it answers",
                )
            return
        self._backoff = 0.1
        self.notify("registered", f"gradwatch: run {self.run_id} → {self.link.server}/runs/{self.run_id}")
        if self.on_connected is not None:
            threading.Thread(
                target=_quietly, args=(self.on_connected,), name="gradwatch-older-spools", daemon=True
            ).start()
            self.on_connected = None
        if isinstance(welcome.get("max_frame_bytes"), int):  # split batches to fit what this server accepts
            self.encoder.frame_limit = max(64 << 10, min(MAX_FRAME_BYTES, welcome["max_frame_bytes"] * 3 // 4))
        self._on_ack(int(welcome.get("acked_seq", 0)))
        self._sent_upto = self._acked

    def _lost_link(self) -> None:
        self.link.close()
        self._next_connect = time.monotonic() + self._backoff
        if self.ever_connected and not self.link.deleted:
            self.notify(
                "lost",
                f"gradwatch: lost the connection to {self.link.server}; retrying in the "
                "background (nothing logged is lost meanwhile)",
            )

    def _send_window(self) -> None:
        """Send unsent batches while fewer than WINDOW are unacked."""
        while self.unacked() < WINDOW:
            seq = self.outbox.next_after(self._sent_upto)
            if seq is None:
                return
            data = self.outbox.get(seq)
            if data is not None:
                self.link.send(data)
            self._sent_upto = seq

    def _receive(self, timeout: float) -> None:
        """Handle the server's replies: wait up to ``timeout`` for one, then take what is there."""
        message = self.link.receive(timeout)
        while message is not None:
            self._handle(message)
            message = self.link.receive(0)

    def _handle(self, message: dict) -> None:
        kind = message.get("type")
        if kind == "ack":
            if message.get("refused"):  # stored what it could; the rest is gone for good: say why, once
                self.notify(
                    f"refused:{message['refused']}",
                    "gradwatch: the server could not store part of a "
                    f"batch (the rest is stored; the run shows a data_refused alert): {message['refused']}",
                )
            gap = message.get("gap", 0)  # a busy server asks for fewer, larger batches; no gap: it is not busy
            self._server_gap = min(float(gap), MAX_SERVER_GAP) if isinstance(gap, (int, float)) and gap > 0 else 0.0
            self._on_ack(int(message["seq"]))
        elif kind == "nack":
            expected = int(message["expected"])
            if expected - 1 < self._sent_upto:  # resend from there (later nacks of the same gap add nothing)
                self._sent_upto = max(self._acked, expected - 1)
        elif kind == "error":
            self.link.on_error(message)
            raise LinkClosed(str(message.get("message")))

    def _on_ack(self, seq: int) -> None:
        if seq > self._acked:
            self.acked_records += self.outbox.ack(seq)
            self._acked = seq

    # -- encoding --------------------------------------------------------------------------
    def drain(self) -> None:
        """Move queued items into numbered batches in the outbox (the thread does this; a test may too)."""
        with self._drain_lock:  # close() may drain from the caller's thread while this one still runs
            self._drain_locked()

    def _drain_locked(self) -> None:
        self._last_drain = time.monotonic()
        items = []
        queue = self._queue
        while queue and len(items) < DRAIN_ITEMS:
            items.append(queue.popleft())
        for item in items:
            self._taken_bytes += item_bytes(item)
            self._taken_records += item[0] == "rec"
        try:
            if self.outbox.full():  # the disk refuses writes too: count what cannot be kept, never grow
                self._gaps.discard(items, f"disk full: {self.outbox.disk_error}", self.encoder.layouts)
            else:
                events = self._gaps.events(self.notify)
                try:
                    batches = self.encoder.encode(items, self._seq + 1, self.features, events)
                except Exception:  # one bad record must not take the others with it
                    batches = self.encoder.encode_each(items, self._seq + 1, self.features, events, self._unencodable)
                for seq, text, records in batches:
                    self.outbox.add(seq, text, records)
                    self._seq = seq
        finally:
            self._taken_count += len(items)  # only now: deliver() reads _seq once this covers its items

    def _unencodable(self, item: tuple, why: str) -> None:
        self._gaps.discard([item], why, self.encoder.layouts)

    def _discard_all(self) -> None:
        """The run was deleted on the server: nothing of it is kept or sent any more."""
        self.closed_for_puts = True
        self._queue.clear()
        if len(self.outbox) or self.outbox.spool_dir.exists():
            self.outbox.discard()
        self.notify(
            "deleted",
            f"gradwatch: run {self.run_id} was deleted on the server; nothing more is sent for it (training goes on)",
        )
        self._stopping.wait(0.5)

    def notify(self, kind: str, text: str) -> None:
        """Tell the user something on stderr, once per kind."""
        if kind not in self._told and not self.quiet:
            self._told.add(kind)
            print(text, file=sys.stderr, flush=True)


def _quietly(fn) -> None:
    """Background extras (delivering older spools) never disturb the run."""
    try:
        fn()
    except Exception:  # `gradwatch sync` remains the way to deliver them
        pass
