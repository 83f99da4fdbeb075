"""The run row's statements of every batch: the seq claim (which marks the run's updated_at and last_step)
and the update of whatever else a batch changed, compiled once and run on the driver (storage/prepared.py)."""

from __future__ import annotations

import functools

from sqlalchemy import bindparam, case, or_, select, update

from gradwatch_server.storage import db
from gradwatch_server.storage.prepared import Prepared


def claim_seq(conn, run_id: int, seq: int, now: float | None = None, newest: int | None = None) -> bool:
    """Take batch ``seq`` of a run for this transaction: true only if the run's committed seq is seq - 1.

    The conditional update locks the run's row until commit, so of two server processes holding the
    same batch (a client that reconnected elsewhere) exactly one stores it; the other sees 0 rows.
    With ``now`` the same statement writes the run's ``updated_at`` (and ``last_step``, when the batch's
    ``newest`` step is larger): what ``apply.apply_batch(..., marked=True)`` then leaves out, one statement less.
    """
    params = {"rid": run_id, "prev": seq - 1, "new_seq": seq}
    if now is None:
        return _CLAIM.run(conn, params).rowcount == 1
    params["now"] = now
    if newest is None:
        return _CLAIM_AT.run(conn, params).rowcount == 1
    params["newest"] = newest
    return _CLAIM_STEP.run(conn, params).rowcount == 1


def _claim(**values):
    return Prepared(
        update(db.runs)
        .where(db.runs.c.id == bindparam("rid"), db.runs.c.last_seq == bindparam("prev"))
        .values(last_seq=bindparam("new_seq"), **values)
    )


_CLAIM = _claim()
_CLAIM_AT = _claim(updated_at=bindparam("now"))
_LARGER = or_(db.runs.c.last_step.is_(None), db.runs.c.last_step < bindparam("newest"))
_CLAIM_STEP = _claim(
    updated_at=bindparam("now"), last_step=case((_LARGER, bindparam("newest")), else_=db.runs.c.last_step)
)


def set_columns(conn, run_id: int, changes: dict) -> None:
    """``UPDATE runs SET <changes> WHERE id = run_id``."""
    _update(tuple(changes)).run(conn, {"rid": run_id, **{f"v_{c}": v for c, v in changes.items()}})


@functools.lru_cache(maxsize=64)
def _update(columns: tuple):
    """``UPDATE runs SET <columns> WHERE id = :rid``, one per set of columns (a handful in practice)."""
    return Prepared(
        update(db.runs).where(db.runs.c.id == bindparam("rid")).values({c: bindparam(f"v_{c}") for c in columns})
    )


def committed_seq(conn, run_id: int) -> int | None:
    """The run's last committed batch, or None when the run no longer exists."""
    return conn.execute(select(db.runs.c.last_seq).where(db.runs.c.id == run_id)).scalar()
