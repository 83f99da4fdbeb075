"""What a slowdown of the training loop comes from, read from the run's own counters before anyone is blamed.

The throughput rule (throughput.py) asks ``of_slowdown`` once a slowdown is sustained. In order: a torch
DataLoader whose fetches (``perf/loader_wait``, capture/loader_wait.py) grew and now take a larger share
of the step; GPU clocks throttled for heat or power (NVML throttle reasons, nothing else says "thermal");
then the machine: other processes taking the CPU (``contended``) are information, not the run's problem
(None: no alert); a process that slowed on a machine that is not busy is. Without any system counter the
cause is unknown and nothing is raised either.

The machine's counters are averages over the time since their last sample (psutil, every few seconds), so a
sample taken in the slowdown's first seconds is mostly the time before it: the machine's verdict waits for
two samples taken after the slowdown began (``DEFER`` until then), and GPU throttle reasons (the clocks' state
when read) for one. The DataLoader's fetch times are per step and are read at once. Counters that stopped
coming (none for STALE_INTERVALS sample intervals) leave the slowdown unexplained: a note, no alert.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

from gradwatch.contract import keys
from gradwatch_server.health.common import fmt

LOADER, LOAD, STEAL = keys.LOADER_WAIT, keys.LOAD_PER_CORE, keys.CPU_STEAL
CPU, SHARE, RAM = keys.CPU_PERCENT, keys.PROCESS_CPU, keys.RAM_PERCENT
MAX_GPUS = 16
THROTTLES = tuple(keys.gpu_key(i, keys.THROTTLE_SUFFIX) for i in range(MAX_GPUS))
READS = frozenset({LOADER, LOAD, STEAL, CPU, SHARE, RAM, *THROTTLES})
# NVML clock throttle reasons that mean heat or power (nvmlClocksThrottleReason*): SW power cap, HW slowdown,
# SW thermal, HW thermal, HW power brake. Idle, application clocks and sync boost are not slowdowns.
HEAT_OR_POWER = {
    0x4: "power cap",
    0x8: "hardware slowdown",
    0x20: "thermal",
    0x40: "thermal (hardware)",
    0x80: "power brake",
}
OTHERS_BUSY = 30.0  # percent of the machine's CPU used by other processes: the CPU is shared
OTHERS_LOAD = 0.5  # runnable tasks per core beyond this process's own share: they queue for a core
STEAL_BUSY = 5.0  # percent of CPU time a hypervisor gave to other guests
SHARE_FELL = 0.8  # this process's CPU share below this x its earlier median: it got less of the CPU
LOADER_SHARE = 0.1  # the loader's share of the slowdown beyond its share of a usual step, to be the cause
FRESH = 2  # system samples after a slowdown's first step before the machine is judged (the first is partly before)
DEFER = "defer"  # of_slowdown's answer while the machine's counters still describe the time before the slowdown
STALE_INTERVALS = 4  # sample intervals a slowdown waits for fresh counters before they count as stopped ...
STALE_STEPS = FRESH + 2  # ... and at least this many slow steps (samples are tagged with the step they follow)
STALE_SECONDS = 60.0  # ... or, with fewer than two samples ever, this long


def _st(state: dict) -> dict:
    st = state.get("cause")
    if st is None:
        st = state["cause"] = {
            "loader": deque(maxlen=20),
            "loader_base": deque(maxlen=200),
            "shares": deque(maxlen=50),
            "sampled": [],
        }
    return st


def observe(state: dict, step: int, scalars: dict, th: dict) -> None:
    """Keep the latest counters of one record at ``step`` (loader fetches per step, system samples, throttle reasons)."""
    st = _st(state)
    for key in READS.intersection(scalars):
        value = scalars[key]
        if not math.isfinite(value):  # NaN, inf: not a reading
            continue
        if key == LOADER:
            if st["loader"].maxlen != int(th["throughput_drop.patience"]):
                st["loader"] = deque(st["loader"], maxlen=int(th["throughput_drop.patience"]))
            st["loader"].append(value)
            continue
        _sampled(st, step, state.get("clock", 0.0))
        if key in THROTTLES:
            st.setdefault("throttle", {})[key] = (step, int(value))
        else:
            if key == SHARE:
                st["shares"].append((step, value))
            st[key] = value
            st["measured"] = True


def _sampled(st: dict, step: int, clock: float) -> None:
    """Keep the newest FRESH system samples' (step, seconds of steps so far), in arrival order."""
    got = st["sampled"]
    if got and step < got[-1][0]:
        _forget(st)
    if not got or got[-1][0] != step:
        got.append((step, clock))
        del got[:-FRESH]


def stepped(state: dict, step: int, clock: float) -> None:
    """Step ``step`` ended ``clock`` seconds of steps in: a sample tagged with it counts from there (its counters may
    come before its step time, as in a replay, or after it, as the client sends them)."""
    got = _st(state)["sampled"]
    if got and got[-1][0] == step:
        got[-1] = (step, clock)


def rewound(state: dict) -> None:
    """The steps went back (a run resumed from a checkpoint, a new process): what was sampled before says nothing
    about the time after, nor is it "before" its steps."""
    _forget(_st(state))


def _forget(st: dict) -> None:
    st["sampled"].clear()
    st["shares"].clear()
    st.pop("throttle", None)
    for key in (LOAD, STEAL, CPU, SHARE, RAM, "measured"):
        st.pop(key, None)


def healthy(state: dict) -> None:
    """One step at the run's usual pace: its loader fetch time is part of the baseline."""
    st = _st(state)
    if st["loader"]:
        st["loader_base"].append(st["loader"][-1])


def of_slowdown(state: dict, now: float, base: float, slow=(), onset: int = -1) -> str | None:
    """The cause of a step time ``now`` against the usual ``base`` when it is the run's own, None when it is not
    (or nothing measured says), ``DEFER`` while the machine's counters predate the slowdown, which began at step
    ``onset`` (``slow``: the step times of the recent window that are slow, when only some are)."""
    st = _st(state)
    loader = _loader(st, now, base, slow)
    if loader:
        return loader
    # NVML's throttle reasons are the clocks' state when read: one reading in the slowdown says
    readings = [v for step, v in st.get("throttle", {}).values() if step >= onset]
    heat = sorted({name for v in readings for bit, name in HEAT_OR_POWER.items() if v & bit})
    if heat:
        return (
            f"The GPU is throttling its clocks (NVML throttle reasons: {', '.join(heat)}): check its cooling, "
            "power limit (nvidia-smi -q -d PERFORMANCE) and the other jobs on the device."
        )
    got = st["sampled"]
    st["stale"] = False
    if st.get("measured") and not (len(got) == FRESH and got[0][0] >= onset):
        gap = got[-1][1] - got[-2][1] if len(got) == FRESH else 0.0
        limit = max(STALE_INTERVALS * gap if gap > 0 else STALE_SECONDS, STALE_STEPS * now)
        if state.get("clock", 0.0) - got[-1][1] < limit:  # the last sample came recently: more are coming
            return DEFER
        st["stale"] = True  # the counters stopped coming: nothing measured says why (a note, no alert)
        return None
    if not st.get("measured") or contended(st):
        return None  # another process's doing, or nothing measured to tell: information, not an alert
    share, before = st.get(SHARE), _share_before(st, onset)
    if share is not None and before and share < SHARE_FELL * before:
        return (
            f"This process's CPU share fell from {before:.0f}% to {share:.0f}% of the machine while the machine is not "
            "busy: the loop waits on something other than the CPU or a DataLoader (I/O, a lock, the device, a pause "
            "in the script)."
        )
    ram = st.get(RAM)
    return (
        "The process uses as much CPU as before: each step needs more work (larger inputs, a longer sequence, more "
        "work per step)" + (f", or memory is short (RAM {ram:.0f}% used: swapping)" if ram and ram >= 90 else "") + "."
    )


def _loader(st: dict, now: float, base: float, slow) -> str | None:
    if not st["loader"]:
        return None
    wait = statistics.median(st["loader"])
    if 0 < len(slow) < len(st["loader"]):
        # A window still half at the usual pace (the slowdown's first steps, or one late step beside them):
        # its median fetch is a usual one. Compare the slow steps with as many of the longest fetches.
        wait, now = statistics.median(sorted(st["loader"])[-len(slow) :]), statistics.median(slow)
    usual = statistics.median(st["loader_base"]) if st["loader_base"] else 0.0
    # The loader's part of the slowdown must exceed its part of a usual step: a uniform slowdown (the CPU
    # shared with other processes) slows the fetches in proportion and is not the loader's doing.
    if wait - usual < min(0.9, max(0.5, usual / base + LOADER_SHARE)) * (now - base):
        return None
    return (
        f"The DataLoader is the difference: fetching a batch takes {fmt(wait)} s of each step against {fmt(usual)} s "
        "before. More DataLoader workers (num_workers), pin_memory, or faster storage or preprocessing."
    )


def _share_before(st: dict, onset: int) -> float | None:
    shares = [v for step, v in st["shares"] if step < onset]  # the samples before the slowdown's
    return statistics.median(shares) if shares else None


def contended(st: dict) -> bool:
    """Other processes take the CPU: the machine busy beyond this process, a queue for the cores, or steal."""
    share = st.get(SHARE) or 0.0
    cpu, load, steal = st.get(CPU), st.get(LOAD), st.get(STEAL)
    return bool(
        (cpu is not None and cpu - share >= OTHERS_BUSY)
        or (load is not None and load - share / 100.0 >= OTHERS_LOAD)
        or (steal is not None and steal >= STEAL_BUSY)
    )


def verdict(state: dict) -> dict:
    """Why a slowdown raised nothing: {"cause": "contention" | "unmeasured", "evidence": counters, "message"}."""
    st = _st(state)
    evidence = {k: st[k] for k in (CPU, SHARE, LOAD, STEAL) if st.get(k) is not None}
    if st.get("stale"):
        return {
            "cause": "unmeasured",
            "evidence": evidence,
            "message": f"The loop slowed, and the run's system counters stopped coming (the last at step "
            f"{st['sampled'][-1][0]}): nothing measured says why; not raised as an alert.",
        }
    if not st.get("measured"):
        return {
            "cause": "unmeasured",
            "evidence": evidence,
            "message": "The loop slowed, and no counter of the run says why (no system metrics: pip install "
            "gradwatch[system]); not raised as an alert.",
        }
    parts = [f"the machine's CPU {evidence[CPU]:.0f}% busy" if CPU in evidence else None]
    parts.append(f"this process {evidence[SHARE]:.0f}%" if SHARE in evidence else None)
    parts.append(f"load {evidence[LOAD]:.2g} per core" if LOAD in evidence else None)
    parts.append(f"steal {evidence[STEAL]:.0f}%" if evidence.get(STEAL) else None)
    return {
        "cause": "contention",
        "evidence": evidence,
        "message": "Other processes are taking the CPU (" + ", ".join(p for p in parts if p) + "): the run "
        "slowed because the machine is shared, not because of the run.",
    }
