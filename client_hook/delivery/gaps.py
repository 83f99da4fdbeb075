"""What the sender could not keep (a full disk, its memory bound, a record it could not encode): counted
between batches, then reported once as a ``data_gap`` alert to the server and a line to the user."""

from __future__ import annotations

MAX_HELD_EVENTS = 1000  # run events kept aside while the disk is full
FELL_BEHIND = "the sender fell behind (queue over its memory bound)"


class Gaps:
    """Records lost since the last report (the steps they span, and why), and run events held back.

    ``drop`` is called on the training thread (plain counters, no lock: only it writes them);
    everything else on the sender's thread.
    """

    def __init__(self):
        self._clear()
        self.held: list = []  # run events that waited for the disk; the next batch carries them
        self.dropped = 0  # records refused by put (the hand-off queue was full), in all
        self._dropped_seen = 0
        self._drop_steps: list = [None, None]

    def _clear(self) -> None:
        self.records, self.first, self.last, self.reasons = 0, None, None, set()

    def __bool__(self) -> bool:
        """Something a batch still has to carry."""
        return bool(self.records or self.held or self.dropped > self._dropped_seen)

    def drop(self, step) -> None:
        """Training thread: the record at ``step`` was refused (counted here, reported by the sender)."""
        self.dropped += 1
        if self._drop_steps[0] is None:
            self._drop_steps[0] = step
        self._drop_steps[1] = step

    def note(self, records: int, first, last, why: str) -> None:
        self.records += records
        self.first = first if self.first is None else self.first
        self.last = last
        self.reasons.add(why)

    def discard(self, items: list, why: str, layouts: dict) -> None:
        """Items that cannot be kept now: records are counted, layouts kept (for every hello), events held."""
        for item in items:
            if item[0] in ("rec", "media"):
                self.note(1, item[1], item[1], why)
            elif item[0] == "layout":
                layouts[item[1]] = list(item[2])
            elif len(self.held) < MAX_HELD_EVENTS:
                self.held.append(item[1])

    def events(self, notify) -> list:
        """The events held back, then the alert for what was lost since the last call (training-side drops
        included); tells the user once per reason."""
        dropped = self.dropped - self._dropped_seen
        if dropped:
            self._dropped_seen += dropped
            first, last = self._drop_steps
            self._drop_steps[0] = None
            self.note(dropped, first, last, FELL_BEHIND)
        events, self.held = self.held, []
        if not self.records:
            return events
        records, first, last, why = self.records, self.first, self.last, "; ".join(sorted(self.reasons))
        self._clear()
        notify(
            f"gap:{why.split(';')[0]}",
            f"gradwatch: {records} record(s) could not be kept: {why} (reported to the server as a data_gap alert)",
        )
        return [*events, gap_alert(records, first, last, why)]


def gap_alert(records: int, first_step: int | None, last_step: int | None, why: str) -> dict:
    """The event that tells the server (and the user) what could not be kept."""
    where = f" (steps {first_step}-{last_step})" if first_step is not None else ""
    return {
        "type": "alert",
        "kind": "data_gap",
        "severity": "warning",
        "step": first_step,
        "message": f"gradwatch dropped {records} record(s){where} in the training process: {why}",
    }
