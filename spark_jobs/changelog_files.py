"""The change log's files, written by executors: one Parquet file per change record, i.e.
per part of a transaction's changes, at a path named by (batch, txn, part), replaced
atomically.

    <changelog>/batch=<B>/txn-<T>-part-<K>.parquet   columns part, seq, txn, table, key, value, deleted

(a record of the format before, one per batch and engine partition, at
<changelog>/batch=<B>/partition-<P>-part-<K>.parquet). A file is a pure function of its
record, which the engine emits identically every time and at every partition count, so
writing it again (a replayed micro-batch, a record the engine re-emitted, a rebuild at
another layout) leaves the log as it was: idempotent by construction, with no staging folder to
rename per partition. Parts without changes get no file. A reader never sees a half-written file (write to a hidden temporary
file, then rename over the final name; Spark ignores names starting with '.').

The output must be a filesystem path the executors share with the driver (local, NFS, a
mounted volume) or a URI pyarrow.fs understands (s3://, hdfs://, gs://), where one PUT
replaces an object atomically. Depends on pyarrow and the standard library only.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator


def _schema():
    import pyarrow as pa

    return pa.schema(
        [
            ("part", pa.int32()),
            ("seq", pa.int32()),
            ("txn", pa.int32()),
            ("table", pa.string()),
            ("key", pa.string()),
            ("value", pa.string()),
            ("deleted", pa.bool_()),
        ]
    )


def record_path(changelog: str, record: dict) -> str:
    if record["txn"] is None:
        name = f"partition-{record['partition']}-part-{record['part']:05d}"
    else:
        name = f"txn-{record['txn']:06d}-part-{record['part']:05d}"
    return f"{changelog.rstrip('/')}/batch={record['batch']}/{name}.parquet"


def _write(path: str, table) -> None:
    import pyarrow.parquet as pq

    if "://" in path:
        import pyarrow.fs as pafs

        fs, inner = pafs.FileSystem.from_uri(path)
        fs.create_dir(inner.rsplit("/", 1)[0], recursive=True)
        pq.write_table(table, inner, filesystem=fs)
        return
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    temporary = os.path.join(folder, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    try:
        pq.write_table(table, temporary)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


def write_records(changelog: str):
    """A mapInArrow function: (batch, txn, partition, part, changes) rows in, one file written
    per row with changes; yields (table, changes) counts."""

    def write(batches: Iterator) -> Iterator:
        import pyarrow as pa

        schema = _schema()
        counts: dict[str, int] = {}
        for record_batch in batches:
            for record in record_batch.to_pylist():
                changes = record["changes"] or []
                if not changes:
                    continue
                table = pa.table(
                    {
                        "part": [record["part"]] * len(changes),
                        "seq": list(range(len(changes))),
                        "txn": [c["txn"] for c in changes],
                        "table": [c["table"] for c in changes],
                        "key": [c["key"] for c in changes],
                        "value": [c["value"] for c in changes],
                        "deleted": [bool(c["deleted"]) for c in changes],
                    },
                    schema=schema,
                )
                _write(record_path(changelog, record), table)
                for change in changes:
                    counts[change["table"]] = counts.get(change["table"], 0) + 1
        if counts:
            names = sorted(counts)
            yield pa.RecordBatch.from_pydict(
                {"table": names, "changes": [counts[n] for n in names]},
                schema=pa.schema([("table", pa.string()), ("changes", pa.int64())]),
            )

    return write
