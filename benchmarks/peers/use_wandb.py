"""wandb in offline mode (WANDB_MODE=offline): log() hands records to the wandb-core process,
which appends them to the run's transaction log, ``wandb/offline-run-*/run-*.wandb``. Offline
there is no query API (that needs a W&B server after ``wandb sync``) and wandb 0.31 ships no
Python reader of that file, so "visible" = the history record is in that file, read here with
wandb's own protobuf ``Record`` over the file's LevelDB-log framing."""

from __future__ import annotations

import struct
import zlib

from .base import Tool as Base

BLOCK, HEADER = 32768, 7  # LevelDB log: 32 KiB blocks, records framed by crc32/len/type headers
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(data: bytes):
    """Payloads of the complete records in a .wandb file (a torn tail is left for the next read)."""
    pos, parts = HEADER, []  # the file opens with its own 7-byte header (":W&B", magic, version)
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # block trailer padding
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        body = data[pos + HEADER:pos + HEADER + length]
        if len(body) < length or kind == 0 or zlib.crc32(bytes([kind]) + body) & 0xFFFFFFFF != crc:
            return  # not written completely yet
        pos += HEADER + length
        parts.append(body)
        if kind in (FULL, LAST):
            yield b"".join(parts)
            parts = []


class Tool(Base):
    name = "wandb"
    visible_means = "the history record is in the offline run's .wandb file (parsed with wandb's protobuf Record)"
    not_applicable = {
        "chart": "offline runs have no reader or query API; charts need a W&B server after `wandb sync`",
        # measured while writing this: the file stays at its 7-byte header for the first ~10 s at 10 steps/s
        "latency": "offline: no live reader; the .wandb file is written in 32 KiB blocks, so a point lands "
                   "there only after ~32 KiB more records or at finish()",
    }

    def version(self) -> str:
        import wandb
        return f"{wandb.__version__} (offline)"

    def open(self, run: str) -> None:
        import wandb
        self.run = wandb.init(project="bench", name=run, dir=str(self.root), mode="offline",
                              settings=wandb.Settings(x_disable_stats=True))  # no system-metrics sampler
        self.path = self.run.settings.sync_file
        self.seen: dict[str, int] = {}
        self.offset = 0

    def log(self, metrics: dict, step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()

    def visible(self, key: str, step: int) -> bool:
        from wandb.proto import wandb_internal_pb2
        with open(self.path, "rb") as f:
            data = f.read()
        for payload in records(data):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(payload)
            if rec.WhichOneof("record_type") == "history":
                for item in rec.history.item:
                    name = item.key or ".".join(item.nested_key)
                    self.seen[name] = max(self.seen.get(name, -1), rec.history.step.num)
        return self.seen.get(key, -1) >= step
