"""Read an offline wandb run back: the records of its ``run-<id>.wandb`` file (a LevelDB-style
log of protobuf ``Record`` messages after a 7-byte header), so a test finds what was logged
without a server."""

from __future__ import annotations

import struct
from pathlib import Path

from wandb.proto import wandb_internal_pb2 as pb

BLOCK = 32768
FULL, FIRST, LAST = 1, 2, 4


def records(path: Path) -> list:
    """Every record of one .wandb file, in the order written."""
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", path
    pos, pending, found = 7, b"", []
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(pending)
            found.append(record)
    return found


def logged_keys(path: Path) -> set[str]:
    """The keys of every history row the run logged."""
    return {item.key or item.nested_key[0] for r in records(path)  # a dict value (a table, an
            if r.WhichOneof("record_type") == "history"            # image) is nested under it
            for item in r.history.item}


def summary_keys(path: Path) -> dict[str, str]:
    """The run's summary as written: key -> its JSON value."""
    return {item.key or "/".join(item.nested_key): item.value_json for r in records(path)
            if r.WhichOneof("record_type") == "summary" for item in r.summary.update}
