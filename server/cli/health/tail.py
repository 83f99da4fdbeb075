"""``gradwatch tail RUN``: a live text view of a run (loss and grad-norm sparklines, latest values, incidents).

It polls the server's JSON API (or a database with --db) every ``--interval`` seconds: the run, the last points
of its loss and global gradient norm, its incidents. On a terminal the view is redrawn in place; otherwise a
block is printed each time the run moves. New incidents are printed as they open. Ctrl-C leaves (exit 0).
"""

from __future__ import annotations

import math
import sys
import time

from gradwatch.contract import keys as vocab
from gradwatch_server.cli.health.incidents import brief, line
from gradwatch_server.cli.source import decode, open_source, printable, resolve

BARS = "▁▂▃▄▅▆▇█"
WIDTH = 48  # points in a sparkline
CLEAR = "\x1b[H\x1b[2J"


def add_parser(sub) -> None:
    from gradwatch_server.cli import export

    p = sub.add_parser(
        "tail",
        help="follow a run live in the terminal: loss and grad-norm sparklines, incidents as they open",
        description="A live text view of one run; Ctrl-C to leave.",
    )
    p.add_argument("run", help="a run id, or a name that matches one run")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between polls [1]")
    p.add_argument("--once", action="store_true", help="print the view once and exit")
    export.add_source_arguments(p)


def num(x) -> str:
    """A value as people read it: 4 significant digits, NaN/inf spelled out, '-' for none."""
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("+inf" if x > 0 else "-inf")
    return f"{x:.4g}"


def sparkline(values: list, width: int = WIDTH) -> str:
    """The last ``width`` values as block characters (log scale when they span decades); '!' for NaN/inf or a gap."""
    values = values[-width:]
    fin = [v for v in values if v is not None and math.isfinite(v)]
    if not fin:
        return "!" * len(values)
    log = min(fin) > 0 and max(fin) / min(fin) > 100
    tx = (lambda v: math.log10(v)) if log else (lambda v: v)  # noqa: E731
    lo, hi = tx(min(fin)), tx(max(fin))
    out = []
    for v in values:
        if v is None or not math.isfinite(v):
            out.append("!")
        else:
            out.append(BARS[0] if hi == lo else BARS[min(len(BARS) - 1, int((tx(v) - lo) / (hi - lo) * len(BARS)))])
    return "".join(out)


def _points(source, run_id: int, key: str | None) -> tuple[list, list]:
    """The whole run in at most WIDTH points: the server's min/max envelope, so a spike or NaN anywhere shows."""
    if key is None:
        return [], []
    got = source.series(run_id, key, max_points=WIDTH)
    return got["steps"][-WIDTH:], decode(got["values"])[-WIDTH:]


def view(source, run_id: int) -> tuple[str, list[dict]]:
    """(the text block, the run's incidents in the --json form)."""
    run = source.run(run_id)
    have = source.keys(run_id)
    loss_key = vocab.main_loss_key(have, (run.get("meta") or {}).get("loss_key"))
    if loss_key is None:
        loss_key = next((k for k in have if vocab.is_loss_key(k)), None)
    rows = [f"run {run['id']} {printable(run['name'])!r} ({run['status']})  step {num(run.get('last_step'))}"]
    for label, key in (
        (loss_key or "loss", loss_key),
        ("grad norm", vocab.GLOBAL_NORM if vocab.GLOBAL_NORM in have else None),
    ):
        steps, values = _points(source, run_id, key)
        latest = values[-1] if values else None
        rows.append(f"{printable(label)[:12]:<12} {sparkline(values):<{WIDTH}}  {num(latest)}")
    found = [brief(i, run) for i in source.incidents(run_id)]
    needing = [i for i in found if i["status"] == "open"]
    rows.append(f"incidents: {len(needing)} open of {len(found)}" if found else "incidents: none")
    return "\n".join(rows), found


def run(args) -> int:
    source = open_source(args)
    tty = sys.stdout.isatty()
    seen: set = set()
    last_block = None
    try:
        run_id = resolve(source, args.run)
        while True:
            block, found = view(source, run_id)
            fresh = [i for i in found if i["id"] not in seen]
            seen.update(i["id"] for i in fresh)
            if block != last_block or fresh:
                if tty:  # redrawn in place, with the latest incidents under it
                    shown = "".join("\n" + line(i) for i in found[-10:])
                    sys.stdout.write(CLEAR + block + shown + "\n")
                else:
                    print(block)
                for inc in fresh if last_block is not None or not tty else []:
                    print("new incident: " + line(inc))
                sys.stdout.flush()
                last_block = block
            if args.once:
                return 0
            time.sleep(max(0.1, args.interval))
    except KeyboardInterrupt:
        sys.stdout.write("\n")
        return 0
    finally:
        source.close()
