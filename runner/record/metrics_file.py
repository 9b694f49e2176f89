"""metrics.jsonl as a flat Arrow table, and the Arrow copy of it that makes reading a sweep fast.

metrics.jsonl is the record: one JSON object per step, appended and flushed
as the job runs, readable by anything. Parsing JSON is what the analysis of a
large sweep spends its time on (about 130 MB/s per core), so when rank 0
closes its logger it also writes metrics.arrow: the same records parsed once
into the flat table below (Arrow IPC, read back in a fraction of a
millisecond), with the JSONL file's size and modification time in its
metadata. A reader uses the copy only while both still match; a JSONL file
edited or appended to later is read itself.

The flat table: nested fields joined by `_` (`comm_all_reduce_calls`,
`loss_comm_seconds`), `grad_sketch` kept as a list column.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.json as pa_json

COPY_SUFFIX = ".arrow"
_SOURCE_KEY = b"source"


def parse_jsonl(path: Path) -> pa.Table | None:
    """The flat table of a metrics.jsonl; None when missing, empty or unreadable."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    try:
        table = pa_json.read_json(path, read_options=pa_json.ReadOptions(use_threads=False))
    except pa.ArrowInvalid:  # NaN inside a list, or a last line cut short by a killed rank: keep the whole lines
        records = []
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break
        if not records:
            return None
        table = pa.Table.from_pylist(records)
    table = table.flatten().flatten()
    return table.rename_columns([c.replace(".", "_") for c in table.column_names])


def _source_stamp(path: Path) -> bytes:
    stat = path.stat()
    return f"{stat.st_size}:{stat.st_mtime_ns}".encode()


def write_arrow_copy(path: Path) -> Path | None:
    """Write `metrics.arrow` beside `path` (a metrics.jsonl); returns it, or None when there is nothing to copy."""
    table = parse_jsonl(path)
    if table is None:
        return None
    copy = path.with_suffix(COPY_SUFFIX)
    stamped = table.replace_schema_metadata({_SOURCE_KEY: _source_stamp(path)})
    tmp = copy.with_suffix(".arrow.tmp")
    feather.write_feather(stamped, tmp, compression="uncompressed")
    tmp.replace(copy)
    return copy


def read_arrow_copy(path: Path) -> pa.Table | None:
    """The flat table of `path` (a metrics.jsonl) from its Arrow copy; None when there is none that matches the file.

    Memory-mapped, without Arrow's own threads: a fraction of a millisecond, so a
    sweep's copies are read one after another, and the columns stay in the page
    cache until the analysis copies them (once, into its steps frame).
    """
    copy = path.with_suffix(COPY_SUFFIX)
    if not (path.exists() and copy.exists()):
        return None
    try:
        table = feather.read_table(copy, memory_map=True, use_threads=False)
    except (OSError, pa.ArrowInvalid):
        return None  # a broken copy: the JSONL file is the record
    if (table.schema.metadata or {}).get(_SOURCE_KEY) != _source_stamp(path):
        return None
    return table.replace_schema_metadata(None)
