"""The runs of one multi-rank job, for the run page's rank selector (documented in docs/api.md)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from gradwatch_server.storage import ranks

router = APIRouter()


@router.get("/api/runs/{run_id}/ranks")
def get_ranks(request: Request, run_id: int) -> dict:
    """Every rank's run of the job this run belongs to (itself alone when it is not grouped)."""
    return request.app.state.services.read(ranks.get_ranks, run_id)
