"""Caps on what one batch may make the server do for a run's alerts: events per batch, alerts per run.

The rest of a batch is stored; what is over a cap is counted in the batch's problems, so the client
sees it in the ack's ``refused`` and the run's ``data_refused`` alert (docs/security.md).
"""

from __future__ import annotations

from gradwatch import contract


def cap_alert_events(events: list, known: dict, problems: list) -> list:
    """``events`` without the client alert events past the per-batch and per-run caps.

    ``known`` maps the (kind, key, layer) of the run's stored alerts to them (``AlertBook.rows``): a
    recurrence of one of those only bumps its count, so it is let through even at the per-run cap.
    """
    kept, alerts, over_batch, over_run = [], 0, 0, 0
    room = contract.MAX_ALERTS_PER_RUN - len(known)
    fresh: set = set()
    for ev in events:
        if not (isinstance(ev, dict) and ev.get("type") == "alert"):
            kept.append(ev)
            continue
        alerts += 1
        if alerts > contract.MAX_ALERT_EVENTS_PER_BATCH:
            over_batch += 1
            continue
        ident = _ident(ev)
        if ident not in known and ident not in fresh:
            if len(fresh) >= room:
                over_run += 1
                continue
            fresh.add(ident)
        kept.append(ev)
    if over_batch:
        problems.append(
            f"{over_batch} alert events over the limit of {contract.MAX_ALERT_EVENTS_PER_BATCH} per batch not stored"
        )
    if over_run:
        problems.append(f"{over_run} new alerts not stored: the run holds {contract.MAX_ALERTS_PER_RUN} already")
    return kept


def _ident(ev: dict) -> tuple:
    """The (kind, key, layer) an alert event is stored under (as apply's event handling cuts them)."""

    def short(value):
        return None if value is None else str(value)[: contract.MAX_KEY_LEN]

    return (str(ev.get("kind"))[:40], short(ev.get("key")), short(ev.get("layer")))
