"""The ingest pipeline: a batch decoded, its sequence number claimed, applied, and published once committed.

One object owns the writer-side cache of every run (``RunState``: key ids, chunk tails, rollups,
the health monitor, the last committed seq). The cache lives on the writer thread; whatever
changes a run's rows outside a batch (an edit, a deletion, a failed group commit) calls
``invalidate`` (or ``invalidate_all``) from its own writer job, and the next batch of that run
reloads it from the database. Nothing else touches the cache.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from gradwatch import protocol
from gradwatch.contract import CLIENT_ENDINGS, LINK_MIN_GAP
from gradwatch_server.ingest import apply, hello, run_row, run_states
from gradwatch_server.ingest.activity import Activity
from gradwatch_server.ingest.batch import Batch, decode
from gradwatch_server.ingest.stats import IngestStats, batch_points
from gradwatch_server.ingest.writer import Writer
from gradwatch_server.live.publisher import Publisher

BUSY = 0.5  # the writer's share of time past which clients are asked to batch more (preferred_gap)
MAX_GAP = 0.2  # the longest period of the ticks, in seconds (a gap: at most TICK_SLACK more): a point reaches a page in < 250 ms
FRAME_BUDGET = 50.0  # batches a second all live links may send together before each is asked to wait longer
PHASES = 8  # at most this many groups of runs whose batches are asked to arrive together, spread over the gap
# A client counts the gap from its send, the server from its read of the frame, which comes later when
# many frames arrive at once: so a batch sent at its tick may be read just before it. Read this close
# before a tick, it is taken as on it, and its gap runs to the tick after (at most MAX_GAP + TICK_SLACK:
# the hold is shorter by as much, so a point's way to a page stays within MAX_GAP + MAX_GAP / PHASES).
TICK_SLACK = 0.01
RUNS_PER_PHASE = 32  # ... each of at least this many runs, where there are enough (``phases``)


def phases(links: int) -> int:
    """Groups of runs whose batches ``preferred_gap`` asks to arrive together: one per ``RUNS_PER_PHASE``
    live links, 1 to ``PHASES`` (20 runs: one group, 20 batches back to back; 300: 8 groups of ~37)."""
    return max(1, min(PHASES, links // RUNS_PER_PHASE))


class Pipeline:
    """decode -> claim -> apply (on the writer thread) -> publish (on the event loop), for every run."""

    def __init__(
        self,
        writer: Writer,
        publisher: Publisher,
        activity: Activity,
        stats: IngestStats,
        limits: apply.Limits | None = None,
        alert_overrides: dict | None = None,
        links: Callable[[], int] = lambda: 0,
    ):
        self.writer = writer
        self.publisher = publisher
        self.activity = activity
        self.stats = stats
        self.limits = limits or apply.Limits()
        self.alert_overrides = alert_overrides or {}
        self.links = links  # how many training processes stream to this server process now
        self._states: dict[int, apply.RunState] = {}  # touched only on the writer thread
        self._load = (time.perf_counter(), 0.0, 0.0)  # (when, writer busy seconds then, utilisation)

    # -- the cache -----------------------------------------------------------------------------
    def invalidate(self, run_id: int) -> None:
        """Drop a run's cached state: its rows changed outside a batch. Call from a writer job."""
        self._states.pop(run_id, None)

    def invalidate_all(self) -> None:
        """Drop every run's cached state (a failed group commit rolled back: caches may be ahead)."""
        self._states.clear()

    def cached(self, run_id: int) -> bool:
        """Whether a run's state is cached (for tests and diagnostics)."""
        return run_id in self._states

    # -- a connection's hello ------------------------------------------------------------------
    async def open_run(self, info: dict, resume_from: int | None = None, layouts: dict | None = None) -> dict:
        """Create or resume the run of a checked hello; returns run_id and acked_seq (hello.open_run)."""
        result = await self.writer.submit_here(self._open, info, resume_from, layouts)
        await self.publisher.run_changed(result["run_id"])
        return result

    def _open(self, conn, info: dict, resume_from: int | None, layouts: dict | None) -> dict:
        result = hello.open_run(conn, info, self.alert_overrides, resume_from=resume_from)
        added = hello.ensure_layouts(
            conn, result["run_id"], layouts or {}, self.limits.max_keys, self.limits.max_layers
        )
        if result.get("skipped") or added or not result["created"]:
            self.invalidate(result["run_id"])  # its cached seq / keys may be behind the database now
        return result

    # -- how busy the writer is -----------------------------------------------------------------
    def preferred_gap(self, received: float | None = None, run_id: int = 0) -> float:
        """Seconds a client should leave after the batch it sent at ``received`` (0: send at once), sent in every ack.

        A batch costs the server about the same whatever its size: ~0.2 ms of websocket frame and
        ack alone (measured, docs/benchmarks.md), then its transaction. So the cheapest relief is
        fewer, larger batches, asked for two ways; the larger period wins, at most ``MAX_GAP``:

        - many live links share ``FRAME_BUDGET`` batches a second: each is asked for
          ``links / FRAME_BUDGET`` seconds (5 runs: 0.1 s, 10 or more: 0.2 s). A lone run gets
          nothing beyond its link's own 40 ms, so its points still reach a page at once;
        - past ``BUSY`` of the writer's time over the last half second, the gap grows linearly
          to ``MAX_GAP`` at saturation (a few runs sending huge batches).

        With ``received`` (the batch's arrival, ``time.monotonic()``), the gap runs to the next tick
        of a clock shared by the links, so their next batches arrive together and share one
        transaction, one commit and one fsync (``writer.Writer``'s group commit). The period has
        one tick per group of runs (``run_id % phases(links)``): a few hundred runs arrive in
        groups spread over the period, not all at once, which would queue the last of them; a few
        dozen arrive as one group, run back to back (``hold``).
        """
        now, busy = time.perf_counter(), self.writer.busy_seconds
        then, busy_then, load = self._load
        if now - then >= 0.5:
            load = min(1.0, (busy - busy_then) / (now - then))
            self._load = (now, busy, load)
        links = self.links()
        shared = links / FRAME_BUDGET
        loaded = MAX_GAP * min(1.0, (load - BUSY) / (1.0 - BUSY)) if load > BUSY else 0.0
        period = min(MAX_GAP, max(shared, loaded))
        if period <= LINK_MIN_GAP:
            return 0.0
        if received is None:
            return round(period, 3)
        groups = phases(links)
        gap = period - (received - period * (run_id % groups) / groups) % period  # to its group's next tick
        if gap < TICK_SLACK:  # sent for that tick, read a little early: its next batch goes at the tick after
            gap += period
        elif gap < LINK_MIN_GAP:  # sooner than a link sends anyway: just after the tick
            gap = LINK_MIN_GAP
        return round(gap, 3)

    # -- a batch -------------------------------------------------------------------------------
    @staticmethod
    def decode(text: str) -> Batch:
        """A batch frame as a Batch (ProtocolError when it is not a batch at all)."""
        return decode(protocol.loads(text))

    def submit(self, run_id: int, batch: Batch) -> asyncio.Future:
        """Queue one decoded batch for the writer (group-committed with others waiting).

        The future resolves to the apply result, or to ``{"duplicate": True}``, ``{"expected": seq}``
        (a gap) or ``{"deleted": True}`` (the run is gone); hand a stored result to ``publish``.
        """
        links, hold = self.links(), self.hold()
        # One group of runs (fewer than 2 x RUNS_PER_PHASE links): every live link's batch comes at its tick.
        enough = links if hold and phases(links) == 1 else 0
        return self.writer.submit_here(self.claim_and_apply, run_id, batch, group=True, hold=hold, enough=enough)

    def hold(self) -> float:
        """Seconds a batch may wait for others before the writer takes it (0: at once).

        The writer pays for a batch mostly in code run cold: a lone batch costs it ~1 ms of CPU, one
        run right after another ~0.4 ms (docs/benchmarks.md, "Live path, round 6"). With as many live
        links as make ``preferred_gap`` ask for a gap, batches are held ``period / PHASES`` (at most
        15 ms: 25 less ``TICK_SLACK``; the batches of one group of runs arrive within it) and go to the
        writer together; a lone run's go at once. With one group of runs, they go as soon as every live
        link's batch is held (``submit``).
        """
        period = min(MAX_GAP, self.links() / FRAME_BUDGET)
        return min(period / PHASES, MAX_GAP / PHASES - TICK_SLACK) if period > LINK_MIN_GAP else 0.0

    def claim_and_apply(self, conn, run_id: int, batch: Batch) -> dict:
        """Store a batch if its seq is the run's next (a writer job; see ``submit`` for the results)."""
        # Checked here, in the batch's own transaction, not per connection: after a reconnect the old
        # and the new connection of a run (maybe on two server processes) may both hold the same
        # batch, and only one may store it (run_row.claim_seq).
        # The claim also marks the run's updated_at and last_step (apply_batch's marked): one statement less.
        mark = (time.time(), batch.newest)
        state = self._states.get(run_id)
        if state is None or batch.seq != state.last_seq + 1 or not run_row.claim_seq(conn, run_id, batch.seq, *mark):
            state = self._claim_uncached(conn, run_id, batch.seq, mark)
            if isinstance(state, dict):
                return state
        try:
            result = apply.apply_batch(conn, state, batch, now=mark[0], limits=self.limits, marked=True)
            if run_id in self.activity.stalled:
                result["resumed"] = run_states.resume_stalled(conn, run_id)
        except BaseException:
            self.invalidate(run_id)  # the transaction rolls back; so must the cache
            raise
        if result["status"] in CLIENT_ENDINGS:
            self.invalidate(run_id)  # release per-run state when a run ends
        return result

    def _claim_uncached(self, conn, run_id: int, seq: int, mark: tuple) -> apply.RunState | dict:
        """The claim when the cache is missing or behind: the run's state, reloaded, or why not to store."""
        committed = run_row.committed_seq(conn, run_id)
        if committed is None:
            self.invalidate(run_id)
            return {"deleted": True}
        if seq <= committed:
            return {"duplicate": True}
        if seq != committed + 1:
            return {"expected": committed + 1}
        if not run_row.claim_seq(conn, run_id, seq, *mark):  # another process stored it meanwhile
            committed = run_row.committed_seq(conn, run_id) or 0
            return {"duplicate": True} if seq <= committed else {"expected": committed + 1}
        # Our cache was missing or behind (another process stored batches of this run): reload it.
        state = self._states[run_id] = apply.load_state(conn, run_id)
        state.last_seq = seq - 1
        return state

    def synced(self) -> asyncio.Future | None:
        """None when every batch committed so far is on disk, else a future resolved once it is (``Writer.synced``)."""
        return self.writer.synced()

    def publish(self, run_id: int, result: dict) -> None:
        """Tell open pages (and the webhook) about a stored batch, after its commit."""
        self.stats.add(batch_points(result))
        if result["status"] in CLIENT_ENDINGS:
            self.activity.forget(run_id)
        else:
            self.activity.saw(run_id)
        self.publisher.points(run_id, result["stored"], result["last_step"])
        for alert in result["alerts"]:
            self.publisher.alert(run_id, alert)
        if result["alerts"] or result["status"] or result.get("resumed"):
            asyncio.ensure_future(self.publisher.run_changed(run_id))
        else:
            self.publisher.progress(run_id, result["last_step"])
