"""torch.distributed jobs: which rank sends, and how every rank's run finds its siblings.

Default: only rank 0 streams; other ranks get a ``NoopRun`` that never connects. With
``init(all_ranks=True)`` every rank streams a run of its own (``name [rank k]``), and all of them
carry the same ``meta.group``; the server lists a group's runs (``/api/runs/{id}/ranks``) and the
run page overlays them with a rank selector. One run per rank, rather than every rank writing
into rank 0's run, because the wire protocol numbers batches per run and per connection: no
rank has to forward another's data, and a rank that dies is visible as its own crashed run.

Never imports torch and never touches CUDA: ranks come from the launcher's environment, or from
an already-initialised ``torch.distributed``.
"""

from __future__ import annotations

import hashlib
import os
import sys
import uuid
import warnings

GROUP_TIMEOUT_S = 60.0
_inits = 0  # all_ranks inits in this process: every rank makes them in the same order


def rank_and_world(environ=None) -> tuple[int, int]:
    """(rank, world size): torch.distributed's when initialised, else the launcher's env, else (0, 1)."""
    dist = _dist()
    if dist is not None:
        return dist.get_rank(), dist.get_world_size()
    environ = os.environ if environ is None else environ
    rank = _int(environ.get("RANK", environ.get("SLURM_PROCID")), 0)
    world = _int(environ.get("WORLD_SIZE", environ.get("SLURM_NTASKS")), 1)
    return rank, max(world, 1)


def _int(value, default: int) -> int:
    return int(value) if value is not None and str(value).strip().isdigit() else default


def _dist():
    """torch.distributed if the script imported and initialised it (never imported here)."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist
    except Exception:
        pass
    return None


def describe(all_ranks: bool, uid: str, project: str, name: str | None) -> dict:
    """What a run records about the job: world size and rank, and (all_ranks) the group it shares."""
    rank, world = rank_and_world()
    if world <= 1:
        return {}
    out = {"world_size": world, "rank": rank}
    if all_ranks:
        out["group"] = group_id(rank, uid, project, name)
    return out


def group_id(rank: int, uid: str, project: str, name: str | None) -> str:
    """One id every rank of this job agrees on, for this init.

    Rank 0's run uid, shared through torch.distributed's own key-value store when it is up (no
    collective, no CUDA); else $GRADWATCH_GROUP, else one derived from the launcher's job id
    (torchrun's TORCHELASTIC_RUN_ID, SLURM_JOB_ID) or, last, MASTER_ADDR:MASTER_PORT.
    """
    global _inits
    _inits += 1
    if os.environ.get("GRADWATCH_GROUP"):
        return f"{os.environ['GRADWATCH_GROUP']}/{_inits}"
    shared = _from_store(rank, uid, f"gradwatch/group/{_inits}")
    if shared:
        return shared
    job = [os.environ.get(v, "") for v in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "MASTER_ADDR", "MASTER_PORT")]
    if not any(job):
        warnings.warn(
            "gradwatch: all_ranks=True but no torch.distributed and no launcher env: this rank's run is "
            "not grouped with the others (set GRADWATCH_GROUP)",
            RuntimeWarning,
            stacklevel=4,
        )
        return uuid.uuid4().hex
    seed = "|".join(job + [project, name or "", str(_inits)])
    return hashlib.sha1(seed.encode()).hexdigest()[:24]


def _from_store(rank: int, uid: str, key: str) -> str | None:
    """Rank 0 publishes its uid in the process group's store; the others wait for it."""
    dist = _dist()
    if dist is None:
        return None
    try:
        from datetime import timedelta

        store = _default_store(dist)
        if rank == 0:
            store.set(key, uid)
            return uid
        store.wait([key], timedelta(seconds=GROUP_TIMEOUT_S))
        return store.get(key).decode()
    except Exception as exc:  # rank 0 did not use all_ranks, or a store without set/get
        warnings.warn(
            f"gradwatch: could not share the run group through torch.distributed ({exc!r})",
            RuntimeWarning,
            stacklevel=5,
        )
        return None


def _default_store(dist):
    """The process group's key-value store, which ``init_process_group`` already connected.

    torch.distributed has no public getter for it; a new ``TCPStore`` would need the rendezvous
    address and port, which the launcher may not have put in the environment.
    """
    return dist.distributed_c10d._get_default_store()


class NoopRun:
    """What ranks other than 0 get by default: the ``Run`` API, doing nothing, never connecting."""

    id = None
    should_stop = False
    diverged = None
    recorder = None  # records nothing: producers (watchers, lr_find, callbacks) skip a run without one

    def __init__(
        self,
        project: str = "default",
        name: str | None = None,
        config=None,
        *,
        rank: int = 0,
        world_size: int = 1,
        **_ignored,
    ):
        self.project, self.name, self.config = str(project), name, dict(config or {})
        self.rank, self.world_size = rank, world_size
        self.uid = None
        self.finished = False
        self._step = 0

    @property
    def url(self) -> str:
        return ""

    @property
    def step(self) -> int:
        return self._step

    def log(self, data, step: int | None = None) -> None:
        self._step = max(self._step, (step if step is not None else self._step) + 1)

    def watch(self, model, optimizer=None, scaler=None, every: int = 1) -> NoopRun:
        return self

    def record_exception(self, exc: BaseException) -> None:
        pass

    def finish(self, status: str = "finished", timeout: float = 30.0) -> None:
        self.finished = True

    def __enter__(self) -> NoopRun:
        return self

    def __exit__(self, *exc) -> None:
        self.finish()
