"""What the sender could not keep (a full disk, its memory bound, a record it could not encode): counted
between batches, then reported once as a ``data_gap`` alert to the server and a line to the user."""

from __future__ import annotations

from .outbox import gap_alert


class Gaps:
    """Records lost since the last report, the steps they span, and why."""

    def __init__(self):
        self.records, self.first, self.last, self.reasons = 0, None, None, set()

    def __bool__(self) -> bool:
        return self.records > 0

    def note(self, records: int, first, last, why: str) -> None:
        self.records += records
        self.first = first if self.first is None else self.first
        self.last = last
        self.reasons.add(why)

    def events(self, notify) -> list:
        """The alert for what was lost since the last call (none when nothing was); tells the user once per reason."""
        if not self.records:
            return []
        records, first, last, why = self.records, self.first, self.last, "; ".join(sorted(self.reasons))
        self.__init__()
        notify(
            f"gap:{why.split(';')[0]}",
            f"gradwatch: {records} record(s) could not be kept: {why} (reported to the server as a data_gap alert)",
        )
        return [gap_alert(records, first, last, why)]
