"""Bounded thread pools, one per kind of blocking work, so one kind cannot starve another (docs/security.md).

Channel tests that wait on a slow receiver, rule replays, session and token checks, big-frame decodes and
the API's reads each have their own threads: six tarpit channel tests leave a login or an ingest frame alone.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from concurrent.futures import ThreadPoolExecutor

SIZES = {"sessions": 4, "replays": 2, "decodes": 4, "notify": 2, "reads": 8}
_pools: dict[str, ThreadPoolExecutor] = {}


def pool(kind: str) -> ThreadPoolExecutor:
    """The pool of one kind of work (KeyError for an unknown kind), made on first use."""
    if kind not in _pools:
        _pools[kind] = ThreadPoolExecutor(SIZES[kind], thread_name_prefix=f"gradwatch-{kind}")
    return _pools[kind]


async def run(kind: str, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` on the ``kind`` pool, awaited (context variables carried, as asyncio.to_thread)."""
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(pool(kind), call)
