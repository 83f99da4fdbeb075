"""``gradwatch import-tb DIR``: TensorBoard event files in as runs, through the normal ingest path.

Each directory holding event files becomes one run (named by its path under DIR: scalars, histograms,
images), read with TensorBoard's own ``EventAccumulator`` and sent by the real client (``gradwatch.Run``) over the
ingest websocket, with each point's original step and wall time.
"""

from __future__ import annotations

import shutil
import struct
import sys
import tempfile
from pathlib import Path

from gradwatch.contract import MAX_KEY_LEN, MAX_STEP
from gradwatch.media import Histogram, Image, limits, route
from gradwatch_server.cli.source import Progress, SourceError, printable

EVENTS_GLOB = "events.out.tfevents.*"
MEDIA = "\x00media"  # where a step's histograms and images wait beside its scalars (no tag starts with NUL)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "import-tb",
        help="bring TensorBoard event files in as runs",
        description="Every directory under DIR holding TensorBoard event files becomes a run named by "
        "its path, with every scalar, histogram and image at its original step and wall time.",
    )
    p.add_argument("dir", help="a TensorBoard log directory")
    p.add_argument("--project", default="tensorboard", help="project of the new runs [tensorboard]")
    p.add_argument("--server", help="server address [$GRADWATCH_SERVER or http://127.0.0.1:8765]")
    p.add_argument("--token", help="the server's token [$GRADWATCH_TOKEN]")


def run_dirs(root: Path) -> list[Path]:
    """Directories under (and including) root that hold event files, sorted."""
    return sorted({p.parent for p in root.rglob(EVENTS_GLOB) if p.is_file()})


MAX_RECORD_BYTES = 256 << 20  # a record header claiming more is corrupt (TensorBoard would try to allocate it)


def readable_length(path: Path) -> int | None:
    """Where a file's records stop being readable: the offset of the first record whose header claims
    more than ``MAX_RECORD_BYTES`` or more than the file holds; None when every header is sane."""
    size = path.stat().st_size
    pos = 0
    with open(path, "rb") as f:
        while pos + 12 <= size:
            f.seek(pos)
            (length,) = struct.unpack("<Q", f.read(8))
            if length > MAX_RECORD_BYTES or pos + 16 + length > size:
                return pos
            pos += 16 + length  # length, its CRC, the data, the data's CRC
    return None


def read_scalars(directory: Path, problems: list | None = None) -> dict:
    """{step: (wall_time, {tag: value})} of every scalar in a directory's event files (last write of a step
    wins). What cannot be read or sent is skipped and described in ``problems``."""
    problems = [] if problems is None else problems
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        raise SourceError("import-tb reads event files with the tensorboard package: pip install tensorboard") from None
    with tempfile.TemporaryDirectory() as spare:
        source = _readable_copy(directory, Path(spare), problems)
        acc = EventAccumulator(str(source), size_guidance={"scalars": 0, "tensors": 0, "histograms": 0, "images": 0})
        acc.Reload()
    points: dict = {}
    skipped = {"tag": 0, "step": 0}

    def put_media(tag, step, wall, value):  # a histogram or an image: kept beside the step's scalars
        if not isinstance(tag, str) or not 0 < len(tag) <= MAX_KEY_LEN or not 0 <= int(step) <= MAX_STEP:
            skipped["step" if 0 < len(str(tag)) <= MAX_KEY_LEN else "tag"] += 1
            return
        wall0, values = points.setdefault(int(step), (wall, {}))
        points[int(step)] = (min(wall0, wall), values)
        values.setdefault(MEDIA, {})[tag] = value

    def put(tag, step, wall, value):
        if not isinstance(tag, str) or not 0 < len(tag) <= MAX_KEY_LEN:
            skipped["tag"] += 1
            return
        if not 0 <= int(step) <= MAX_STEP:
            skipped["step"] += 1
            return
        wall0, values = points.setdefault(int(step), (wall, {}))
        points[int(step)] = (min(wall0, wall), values)
        values[tag] = float(value)

    tags = acc.Tags()
    for tag in tags.get("scalars", []):
        for ev in acc.Scalars(tag):
            put(tag, ev.step, ev.wall_time, ev.value)
    for tag in tags.get("tensors", []):  # TF2 writers store scalars as 0-d tensors
        from tensorboard.util import tensor_util

        for ev in acc.Tensors(tag):
            value = tensor_util.make_ndarray(ev.tensor_proto)
            if value.size == 1 and value.dtype.kind in "fiu":
                put(tag, ev.step, ev.wall_time, value.reshape(()).item())
    _read_media(acc, tags, put_media)
    if skipped["tag"]:
        problems.append(f"{skipped['tag']} points skipped: tag longer than {MAX_KEY_LEN} characters")
    if skipped["step"]:
        problems.append(f"{skipped['step']} points skipped: step negative or over 2^63-1")
    return points


def _read_media(acc, tags: dict, put) -> None:
    """TensorBoard's histograms ("Distributions") and images, as gradwatch Histogram and Image values."""
    for tag in tags.get("histograms", []):
        for ev in acc.Histograms(tag):
            put(tag, ev.step, ev.wall_time, _histogram(ev.histogram_value))
    for tag in tags.get("images", []):
        for ev in acc.Images(tag):
            put(tag, ev.step, ev.wall_time, [Image(ev.encoded_image_string)])


def _histogram(h) -> Histogram:
    """A TensorBoard HistogramValue (bucket i counts values up to bucket_limit[i]) as uneven-edged bins."""
    counts, ends = list(h.bucket), list(h.bucket_limit)
    edges = [min(h.min, ends[0]) if ends else h.min] + [min(end, h.max) for end in ends]
    while len(counts) > limits.MAX_BINS:  # merge neighbours until it fits
        counts = [sum(counts[i : i + 2]) for i in range(0, len(counts), 2)]
        edges = edges[::2] + ([edges[-1]] if len(edges) % 2 == 0 else [])
    for i in range(1, len(edges)):  # clamping to max can leave equal neighbours: keep them increasing
        edges[i] = max(edges[i], edges[i - 1])
    return Histogram(np_histogram=(counts, edges))


def _readable_copy(directory: Path, spare: Path, problems: list) -> Path:
    """``directory`` itself, or when one of its event files has a corrupt record header, a copy in
    ``spare`` with each such file cut before that record."""
    files = sorted(p for p in directory.glob(EVENTS_GLOB) if p.is_file())
    cuts = {p: readable_length(p) for p in files}
    if all(cut is None for cut in cuts.values()):
        return directory
    for p, cut in cuts.items():
        if cut is None:
            shutil.copyfile(p, spare / p.name)
            continue
        problems.append(f"{p.name}: record header at byte {cut:,} is corrupt; the rest of the file skipped")
        with open(p, "rb") as src, open(spare / p.name, "wb") as dst:
            left = cut
            while left:
                chunk = src.read(min(left, 1 << 20))
                dst.write(chunk)
                left -= len(chunk)
    return spare


def import_dir(
    directory: Path, points: dict, name: str, project: str, server: str | None, token: str | None, progress
) -> tuple:
    """Send one directory's scalars (``read_scalars``) as a run; returns (run id, points sent)."""
    import gradwatch

    if not points:
        return None, 0
    first_wall = min(wall for wall, _ in points.values())
    run = gradwatch.Run(
        project,
        name,
        {"imported_from": str(directory), "tensorboard_start_time": first_wall},
        server=server,
        token=token,
        tags=["tensorboard"],
    )
    sent = 0
    for step in sorted(points):
        wall, values = points[step]
        scalars = dict(values)  # tags and steps checked by read_scalars: nothing here is refused
        media = scalars.pop(MEDIA, None)
        # Recorded like a watcher's capture, with the event's wall time instead of now (log() stamps the present).
        if scalars:
            run.recorder.put_record(step, scalars, {}, wall=wall)
        if media:
            route.put(run.recorder, step, media, wall=wall)
        sent += len(scalars) + len(media or ())
        progress.step(len(scalars) + len(media or ()))
    run.finish("finished")
    return run.id, sent


def run_import(args) -> int:
    root = Path(args.dir)
    if not root.is_dir():
        raise SourceError(f"{root} is not a directory")
    dirs = run_dirs(root)
    if not dirs:
        raise SourceError(f"no TensorBoard event files ({EVENTS_GLOB}) under {root}")
    problems: dict = {d: [] for d in dirs}
    loaded = [(d, read_scalars(d, problems[d])) for d in dirs]
    progress = Progress(f"import-tb {len(dirs)} run(s): points", sum(len(v) for _, p in loaded for _, v in p.values()))
    for d, points in loaded:
        name = str(d.relative_to(root)) if d != root else root.resolve().name
        run_id, sent = import_dir(d, points, name, args.project, args.server, args.token, progress)
        print(
            printable(
                f"gradwatch: {d}: {'no scalars' if run_id is None and not sent else f'{sent:,} points -> run {run_id}'}"
            ),
            file=sys.stderr,
        )
        for problem in problems[d]:
            print(printable(f"gradwatch: {d}: {problem}"), file=sys.stderr)
    return 0
