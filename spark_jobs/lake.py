"""The lake: the engine's change data as Delta Lake tables, exactly once.

    <output>/changelog        every change once, append-only, partitioned by table and batch_range
                              batch, batch_range, batch_time, txn, part, seq, table, key, value, deleted
    <output>/transactions     every change record once (a transaction's changes, or one part of them)
                              batch, batch_time, txn, part, parts, txns, changes
    <output>/batches          every engine batch applied to tables/, in batch order
                              batch, batch_time, txns, changes, applied_at
    <output>/tables/<table>   one engine table as of the last batch in batches/
                              key, value, batch, txn

`key` and `value` are canonical JSON texts (spark_jobs/records.py): a composite key is a JSON
array, a string key a JSON string. `batch_range` is `batch DIV 100000`, for partition
pruning by batch range. Spark, delta-rs (`deltalake`), DuckDB, pandas and polars read every
table as it is; `state_at` gives a table's state as of any engine batch from the change log.

Exactly once, per micro-batch of the change topic (`LakeWriter`, a foreachBatch function),
by what the lake's own tables hold (so a replayed micro-batch, a record the engine published
again after a crash or a rebuild at another offset, or a whole topic consumed again from a
new checkpoint adds nothing):
  1. the records `transactions` holds already are passed over;
  2. the others' changes are appended to `changelog` (less those of records whose changes
     it holds already: a job killed between its two appends), then the records to
     `transactions`;
  3. the batches now complete (every transaction's every part is in `transactions`) that
     follow the last one in `batches` without a gap are applied to `tables/`: the last change
     of each key in them wins, by MERGE, deletes delete; then they are appended to `batches`.
The tables therefore always show the state as of one engine batch, the last in `batches`,
never part of a batch, and a change older than that batch never reaches them again. A
MERGE applies a range of batches idempotently (a row is replaced only by a change at the same
or a later (batch, txn)), so a kill between step 3's MERGEs and its append changes nothing.
Which records the lake holds is known on the driver (every record of an applied batch, and
those of the pending batches), read back from the tables when the job starts; only after a
restart are the records of the batches the change log may hold looked up there. Delta's
txnAppId/txnVersion would add a state reconstruction to every append (three Spark jobs,
1.2 s each on two cores, measured) and would not cover re-publications.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

BATCH_RANGE = 100_000  # batches per batch_range value: about 17 minutes at 10 ms epochs
INTERNAL_PREFIXES = ("stream.", "window.")  # the engine's tables of output streams and windows

CHANGELOG_SCHEMA = (
    "batch BIGINT, batch_range BIGINT, batch_time TIMESTAMP, txn INT, part INT, seq INT, "
    "`table` STRING, key STRING, value STRING, deleted BOOLEAN"
)
TRANSACTIONS_SCHEMA = "batch BIGINT, batch_time TIMESTAMP, txn INT, part INT, parts INT, txns INT, changes INT"
BATCHES_SCHEMA = "batch BIGINT, batch_time TIMESTAMP, txns INT, changes BIGINT, applied_at TIMESTAMP"
STATE_SCHEMA = "key STRING, value STRING, batch BIGINT, txn INT"
TABLE_NAME = "ordo.table"  # a state table's property: the engine table it holds
APPEND_ONLY = {"delta.appendOnly": "true"}


# ---------------------------------------------------------------- layout


def _join(*parts: str) -> str:
    return "/".join(p.rstrip("/") for p in parts)


def changelog_path(output: str) -> str:
    return _join(output, "changelog")


def transactions_path(output: str) -> str:
    return _join(output, "transactions")


def batches_path(output: str) -> str:
    return _join(output, "batches")


def table_folder(table: str) -> str:
    """A table's folder name: its name where that is a plain file name (`account`,
    `stream.report`), else the name made plain with a digest of the real one, so that two
    names never share a folder."""
    plain = re.sub(r"[^A-Za-z0-9_.-]", "_", table)
    if plain == table and not table.startswith("."):
        return table
    return f"{plain.lstrip('.')}-{hashlib.sha256(table.encode()).hexdigest()[:8]}"


def table_path(output: str, table: str) -> str:
    return _join(output, "tables", table_folder(table))


# ---------------------------------------------------------------- the writer


@dataclass
class LakeStats:
    """What the writer has done, updated while it works (the progress line reads it)."""

    micro_batches: int = 0
    read: int = 0  # change records read from the topic
    records: int = 0  # fresh change records written
    changes: int = 0  # fresh changes this job wrote to the change log
    logged_before: int | None = None  # in the change log before this job (known from its first micro-batch)
    repeated: int = 0  # records the lake held already (a replay or an engine's re-publication)
    passed_over: int = 0  # records of the per-partition format before per-transaction records
    seconds: float = 0.0  # inside micro-batches
    applied_batch: int = 0  # tables/ show the state as of this engine batch
    waiting_batches: int = 0  # batches with records in the lake, not complete yet
    tables: set = field(default_factory=set)
    phases: dict = field(default_factory=dict)  # seconds per step, summed over micro-batches
    step: str = ""  # what the writer is doing now

    def add(self, phase: str, since: float) -> float:
        now = time.monotonic()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - since
        return now

    @property
    def logged(self) -> int | None:
        """Changes the change log holds now, where known: before this job, and its own."""
        return None if self.logged_before is None else self.logged_before + self.changes

    @property
    def changes_per_second(self) -> float:
        return self.changes / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class Place:
    """Where a change record belongs: (batch, txn, part) of its batch's txns and its
    transaction's parts, with its count of changes and the batch's time (ms)."""

    batch: int
    txn: int | None
    part: int
    parts: int
    txns: int | None
    changes: int
    time: int | None

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.batch, self.txn or 0, self.part)


def record_places(records) -> list[Place]:
    """The places of decoded change records, on the driver (a few numbers per record)."""
    from pyspark.sql import functions as F

    table = records.select(
        "batch", "txn", "part", "parts", "txns", F.size("changes").alias("changes"), "time"
    ).toArrow()
    return [Place(**row) for row in table.to_pylist()]


@dataclass
class PendingBatch:
    batch: int
    txns: int
    time: int | None = None
    changes: int = 0
    parts: dict = field(default_factory=dict)  # txn -> (parts it has, the parts held)
    epochs: set = field(default_factory=set)  # the micro-batches its records came in (-1: before this run)

    def add(self, place: Place, epoch: int) -> None:
        self.epochs.add(epoch)
        need, held = self.parts.setdefault(place.txn, (place.parts, set()))
        held.add(place.part)
        self.changes += place.changes
        self.time = place.time if place.time is not None else self.time

    def holds(self, place: Place) -> bool:
        return place.part in self.parts.get(place.txn, (0, ()))[1]

    @property
    def complete(self) -> bool:
        return len(self.parts) >= self.txns and all(len(held) >= need for need, held in self.parts.values())


def held_keys(spark, path: str, places: list[Place]) -> set:
    """The (batch, txn, part) of `places` that the Delta table at `path` holds."""
    from pyspark.sql import functions as F

    if not places:
        return set()
    wanted = {p.key for p in places}
    low, high = min(p.batch for p in places), max(p.batch for p in places)
    rows = (
        read_delta(spark, path)
        .where(F.col("batch").between(low, high))
        .select("batch", "txn", "part")
        .distinct()
        .toArrow()
        .to_pylist()
    )
    return {key for key in ((r["batch"], r["txn"], r["part"]) for r in rows) if key in wanted}


def without(spark, records, keys: set):
    """`records` less those of the (batch, txn, part) `keys`."""
    from pyspark.sql import functions as F

    if not keys:
        return records
    return records.join(
        F.broadcast(spark.createDataFrame(sorted(keys), "batch BIGINT, txn INT, part INT")),
        ["batch", "txn", "part"],
        "left_anti",
    )


class Ledger:
    """What the lake holds, kept on the driver between micro-batches: the last batch applied
    to tables/ (every record of it and of the batches before is in `transactions`), and the
    records in `transactions` of the batches after it. Read from the tables when the job
    starts, so it is the lake's own account, never a second one; so is `unlogged`, the
    batches whose changes may be in `changelog` without their records in `transactions` (a
    job killed between its two appends): from the applied batch to the highest the lake held
    when the job started."""

    def __init__(self, applied: int, unlogged: tuple[int, int] = (0, 0)):
        self.applied = applied
        self.unlogged = unlogged  # (after, up to)
        self.batches: dict[int, PendingBatch] = {}

    @classmethod
    def load(cls, spark, output: str) -> Ledger:
        from pyspark.sql import functions as F

        applied = applied_batch(spark, output)
        transactions = read_delta(spark, transactions_path(output))
        highest = transactions.agg(F.coalesce(F.max("batch"), F.lit(0))).first()[0]
        changelog = read_delta(spark, changelog_path(output))
        logged = changelog.where(F.col("batch_range") >= applied // BATCH_RANGE).agg(F.max("batch")).first()[0]
        ledger = cls(applied, (applied, max(highest, logged or 0)))
        rows = (
            transactions.where(F.col("batch") > applied)
            .select("batch", "txn", "part", "parts", "txns", "changes", F.unix_millis("batch_time").alias("time"))
            .toArrow()
            .to_pylist()
        )
        ledger.add([Place(**row) for row in rows])
        return ledger

    def holds(self, place: Place) -> bool:
        pending = self.batches.get(place.batch)
        return place.batch <= self.applied or (pending is not None and pending.holds(place))

    def fresh(self, spark, output: str, places: list[Place]) -> tuple[list[Place], set, set]:
        """The places not in the lake yet (one each); the keys of this micro-batch's records
        that it holds (a replayed micro-batch, the engine publishing again after a crash or a
        rebuild); and of the fresh ones, those whose changes the change log holds already,
        looked up only in the `unlogged` batches."""
        unique = list({p.key: p for p in places}.values())
        held = {p.key for p in unique if self.holds(p)}
        fresh = [p for p in unique if p.key not in held]
        after, upto = self.unlogged
        logged = held_keys(spark, changelog_path(output), [p for p in fresh if after < p.batch <= upto])
        return fresh, held, logged

    def add(self, places: list[Place], epoch: int = -1) -> None:
        for place in places:
            if place.batch <= self.applied:
                continue
            pending = self.batches.get(place.batch)
            if pending is None:
                pending = self.batches[place.batch] = PendingBatch(place.batch, place.txns or 0)
            pending.add(place, epoch)

    def complete_run(self) -> list[PendingBatch]:
        """The complete batches that follow the applied one without a gap, in order."""
        run = []
        batch = self.applied + 1
        while batch in self.batches and self.batches[batch].complete:
            run.append(self.batches[batch])
            batch += 1
        return run

    def applied_through(self, batch: int) -> None:
        for done in [b for b in self.batches if b <= batch]:
            del self.batches[done]
        self.applied = batch


class LakeWriter:
    """The foreachBatch function: one micro-batch of decoded change records into the lake.

    `internal_tables`:
    whether `stream.*` and `window.*` tables get a state table (the change log holds every
    change either way)."""

    def __init__(
        self,
        output: str,
        stats: LakeStats | None = None,
        internal_tables: bool = True,
    ):
        self.output = output
        self.stats = stats or LakeStats()
        self.internal_tables = internal_tables
        self.busy = False
        self._ledger: Ledger | None = None  # read from the lake at its first micro-batch
        self._state_tables: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, df, epoch_id: int) -> None:
        self.busy = True
        try:
            self._write(df, int(epoch_id))
        finally:
            self.busy = False
            self.stats.step = ""

    # -- one micro-batch

    def _write(self, df, epoch: int) -> None:
        from pyspark.sql import functions as F

        spark = df.sparkSession
        started = time.monotonic()
        if self._ledger is None:
            new = create_lake(spark, self.output)
            self._ledger = Ledger(0) if new else Ledger.load(spark, self.output)
            self.stats.logged_before = 0 if new else changelog_size(spark, self.output)
            self.stats.applied_batch = self._ledger.applied
        ledger = self._ledger
        self.stats.step = "reading change records"
        decoded = df.persist()  # read from Kafka and decoded once
        step = started
        try:
            places = record_places(decoded)
            self.stats.read += len(places)
            current = [p for p in places if p.txn is not None]
            self.stats.passed_over += len(places) - len(current)
            fresh, held, logged = ledger.fresh(spark, self.output, current)
            self.stats.repeated += len(current) - len(fresh)
            step = self.stats.add("read", started)
            records = None
            if fresh:
                records = decoded.where(F.col("txn").isNotNull())
                if len(fresh) + len(held) < len(current):  # a record twice in this micro-batch
                    records = records.dropDuplicates(["batch", "txn", "part"])
                records = without(spark, records, held)
                changes = sum(p.changes for p in fresh if p.key not in logged)
                self.stats.step = f"appending {changes:,} changes to the change log"
                self._append(changes_rows(without(spark, records, logged)), changelog_path(self.output))
                step = self.stats.add("changelog", step)
                self.stats.step = f"appending {len(fresh):,} records to transactions"
                self._append(transaction_rows(records), transactions_path(self.output))
                step = self.stats.add("transactions", step)
                ledger.add(fresh, epoch)
                self.stats.records += len(fresh)
                self.stats.changes += changes
            self.stats.step = "applying complete batches to tables"
            self._apply(spark, epoch, step, records)
        finally:
            decoded.unpersist()
        self.stats.micro_batches += 1
        self.stats.seconds += time.monotonic() - started

    def _append(self, rows, path: str) -> None:
        rows.write.format("delta").mode("append").save(path)

    def _apply(self, spark, epoch: int, step: float, records=None) -> None:
        """Apply the complete batches after the last applied one. `records`: this micro-batch's
        fresh records, which hold every change of those batches when each came whole in it
        (the change log is read back otherwise)."""
        from pyspark.sql import functions as F

        ledger = self._ledger
        assert ledger is not None
        after = ledger.applied
        complete = ledger.complete_run()
        self.stats.waiting_batches = len(ledger.batches) - len(complete)
        if not complete:
            return
        upto = complete[-1].batch
        if records is not None and all(b.epochs == {epoch} for b in complete):
            changes = changes_rows(records)
        else:
            changes = read_delta(spark, changelog_path(self.output)).where(F.col("batch_range") >= after // BATCH_RANGE)
        changes = changes.where((F.col("batch") > after) & (F.col("batch") <= upto))
        if not self.internal_tables:
            changes = changes.where(~_internal_column())
        latest = latest_changes(changes).persist()
        try:
            tables = sorted(r["table"] for r in latest.select("table").distinct().collect())
            step = self.stats.add("last changes", step)
            self.stats.step = f"merging batches {after + 1:,}-{upto:,} into {len(tables)} table(s)"
            with ThreadPoolExecutor(max_workers=min(4, max(1, len(tables)))) as pool:
                for done in pool.map(lambda t: self._merge(spark, t, latest.where(F.col("table") == t)), tables):
                    self.stats.tables.add(done)
        finally:
            latest.unpersist()
        step = self.stats.add("merge", step)
        applied = spark.createDataFrame(
            [(b.batch, b.time, b.txns, b.changes) for b in complete],
            "batch BIGINT, time BIGINT, txns INT, changes BIGINT",
        ).select(
            "batch",
            F.timestamp_millis("time").alias("batch_time"),
            "txns",
            "changes",
            F.current_timestamp().alias("applied_at"),
        )
        self._append(applied, batches_path(self.output))
        ledger.applied_through(upto)
        self.stats.applied_batch = upto
        self.stats.add("batches", step)

    def _merge(self, spark, table: str, changes) -> str:
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        path = table_path(self.output, table)
        with self._lock:
            known = table in self._state_tables
        if not known:
            new = not DeltaTable.isDeltaTable(spark, path)
            create_table(
                spark, path, STATE_SCHEMA, "an Ordo engine table as of the last batch in batches/", {TABLE_NAME: table}
            )
            with self._lock:
                self._state_tables.add(table)
            if new:  # nothing to match: the first batches of a table are a plain append, a fraction of a MERGE
                self._append(changes.where(~F.col("deleted")).select("key", "value", "batch", "txn"), path)
                return table
        newer = "(s.batch > t.batch OR (s.batch = t.batch AND s.txn >= t.txn))"
        (
            DeltaTable.forPath(spark, path)
            .alias("t")
            .merge(changes.select("key", "value", "deleted", "batch", "txn").alias("s"), "t.key = s.key")
            .whenMatchedDelete(condition=f"s.deleted AND {newer}")
            .whenMatchedUpdate(
                condition=f"NOT s.deleted AND {newer}", set={"value": "s.value", "batch": "s.batch", "txn": "s.txn"}
            )
            .whenNotMatchedInsert(
                condition="NOT s.deleted",
                values={"key": "s.key", "value": "s.value", "batch": "s.batch", "txn": "s.txn"},
            )
            .execute()
        )
        return table


def _internal_column():
    from pyspark.sql import functions as F

    condition = F.lit(False)
    for prefix in INTERNAL_PREFIXES:
        condition = condition | F.col("table").startswith(prefix)
    return condition


# ---------------------------------------------------------------- pure DataFrame steps


def changes_rows(records):
    """Decoded change records -> change log rows, one per change."""
    from pyspark.sql import functions as F

    return records.select(
        "batch",
        "time",
        "txn",
        "part",
        F.posexplode("changes").alias("seq", "change"),
    ).select(
        "batch",
        (F.col("batch") / BATCH_RANGE).cast("bigint").alias("batch_range"),
        F.timestamp_millis("time").alias("batch_time"),
        "txn",
        "part",
        "seq",
        F.col("change.table").alias("table"),
        F.col("change.key").alias("key"),
        F.col("change.value").alias("value"),
        F.col("change.deleted").alias("deleted"),
    )


def transaction_rows(records):
    from pyspark.sql import functions as F

    return records.select(
        "batch",
        F.timestamp_millis("time").alias("batch_time"),
        "txn",
        "part",
        "parts",
        "txns",
        F.size("changes").alias("changes"),
    )


def latest_changes(changelog):
    """The last change of each (table, key) among `changelog` rows: the greatest (batch,
    txn, part, seq) wins."""
    from pyspark.sql import functions as F

    return (
        changelog.groupBy("table", "key")
        .agg(F.max(F.struct("batch", "txn", "part", "seq", "deleted", "value")).alias("w"))
        .select("table", "key", "w.batch", "w.txn", "w.deleted", "w.value")
    )


def read_delta(spark, path: str):
    return spark.read.format("delta").load(path)


def create_table(
    spark, path: str, schema: str, comment: str, properties: dict | None = None, partitioned_by: tuple = ()
) -> None:
    from delta.tables import DeltaTable

    from pyspark.sql.types import StructType

    columns = StructType.fromDDL(schema)
    builder = DeltaTable.createIfNotExists(spark).location(path).addColumns(columns).comment(comment)
    if partitioned_by:
        builder = builder.partitionedBy(*partitioned_by)
    for name, value in (properties or {}).items():
        builder = builder.property(name, value)
    builder.execute()


def state_tables(spark, output: str) -> dict[str, str]:
    """{engine table: path} of the state tables under tables/."""
    from delta.tables import DeltaTable

    jvm = spark.sparkContext._jvm
    folder = jvm.org.apache.hadoop.fs.Path(_join(output, "tables"))
    fs = folder.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if not fs.exists(folder):
        return {}
    found = {}
    for status in fs.listStatus(folder):
        path = _join(output, "tables", status.getPath().getName())
        if status.isDirectory() and DeltaTable.isDeltaTable(spark, path):
            properties = DeltaTable.forPath(spark, path).detail().first()["properties"] or {}
            if TABLE_NAME in properties:
                found[properties[TABLE_NAME]] = path
    return found


def create_lake(spark, output: str) -> bool:
    """The lake's tables, made once (an existing lake is left as it is); whether it is new."""
    from delta.tables import DeltaTable

    check_layout(spark, output)
    new = not DeltaTable.isDeltaTable(spark, batches_path(output))
    create_table(
        spark,
        changelog_path(output),
        CHANGELOG_SCHEMA,
        "Ordo change data: every change once",
        APPEND_ONLY,
        ("table", "batch_range"),
    )
    create_table(spark, transactions_path(output), TRANSACTIONS_SCHEMA, "Ordo change records landed", APPEND_ONLY)
    create_table(spark, batches_path(output), BATCHES_SCHEMA, "Ordo batches applied to tables/", APPEND_ONLY)
    return new


def changelog_size(spark, output: str) -> int:
    """The changes in the lake's change log (0 where there is no lake yet). Delta answers the
    count from the file statistics of its log, without reading the table's files."""
    from delta.tables import DeltaTable

    path = changelog_path(output)
    return read_delta(spark, path).count() if DeltaTable.isDeltaTable(spark, path) else 0


def applied_batch(spark, output: str) -> int:
    """The engine batch tables/ show the state as of (0: none yet)."""
    from pyspark.sql import functions as F

    return read_delta(spark, batches_path(output)).agg(F.coalesce(F.max("batch"), F.lit(0))).first()[0]


WRITER_LOCK = ".ordo-writer.lock"  # in a local lake's folder: held by the job writing it


class LakeTaken(RuntimeError):
    """Another job writes the lake: two would race to create and MERGE its tables."""


@contextmanager
def only_writer(output: str):
    """Hold the lake's writer lock while the block runs, or raise LakeTaken at once. The
    kernel lets go of it however the holder ends, a SIGKILL included. A lake outside this
    machine's file system (s3a://, hdfs://…) has no lock here: one job per lake is then the
    operator's to keep."""
    folder = _local_folder(output)
    if folder is None:
        yield
        return
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, WRITER_LOCK), "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "its pid not written yet"
            raise LakeTaken(
                f"another job writes into {output} ({holder}): one job writes a lake at a time; stop that one, or "
                f"give this one another --output"
            ) from None
        lock.truncate(0)
        lock.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        lock.flush()
        yield


def _local_folder(output: str) -> str | None:
    if output.startswith("file:"):
        return output.removeprefix("file:").removeprefix("//") or None
    return None if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", output) else output


class OldLayout(RuntimeError):
    """The output holds the Parquet layout of Ordo's releases before Delta Lake."""


def check_layout(spark, output: str) -> None:
    """Stop in one line at the layout before Delta Lake (`changelog/batch=B/*.parquet`,
    `_state/`): its files are no Delta table, and the job would mix the two."""
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(output)
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    old_state = fs.exists(jvm.org.apache.hadoop.fs.Path(_join(output, "_state")))
    changelog = jvm.org.apache.hadoop.fs.Path(changelog_path(output))
    old_changelog = fs.exists(changelog) and not fs.exists(
        jvm.org.apache.hadoop.fs.Path(changelog_path(output) + "/_delta_log")
    )
    if old_state or old_changelog:
        raise OldLayout(
            f"{output} holds the Parquet lake of Ordo's releases before Delta Lake (changelog/batch=*, _state/): "
            f"move it aside and run this job with a new --checkpoint, which rebuilds the lake from the change "
            f"topic (docs/spark.md, 'From the Parquet layout')"
        )


def optimize(spark, output: str, tables: list[str] | None = None) -> list[str]:
    """Compact the lake's small files (Delta's OPTIMIZE: bin-packing, no data change, readers
    unaffected). Returns the paths compacted."""
    from delta.tables import DeltaTable

    paths = [changelog_path(output), transactions_path(output), batches_path(output)]
    paths += [table_path(output, t) for t in (tables or [])]
    done = []
    for path in paths:
        if DeltaTable.isDeltaTable(spark, path):
            DeltaTable.forPath(spark, path).optimize().executeCompaction()
            done.append(path)
    return done


# ---------------------------------------------------------------- reading the lake without Spark


def delta_dataset(path: str):
    """A Delta table as a pyarrow dataset (delta-rs): what DuckDB, pandas and polars read."""
    from deltalake import DeltaTable

    return DeltaTable(path).to_pyarrow_dataset()


def read_table(output: str, table: str) -> dict[Any, Any]:
    """One engine table from tables/, without Spark: {key: value}, JSON decoded."""
    import json

    rows = delta_dataset(table_path(output, table)).to_table(columns=["key", "value"]).to_pylist()
    return {_plain_key(json.loads(r["key"])): json.loads(r["value"]) for r in rows}


STATE_AT_SQL = """
SELECT key, value, batch, txn FROM (
    SELECT key, value, batch, txn, deleted,
           row_number() OVER (PARTITION BY key ORDER BY batch DESC, txn DESC, part DESC, seq DESC) AS newest
    FROM changelog WHERE "table" = $table AND batch <= $batch
) WHERE newest = 1 AND NOT deleted ORDER BY key
"""


def state_at(output: str, table: str, batch: int) -> dict[Any, Any]:
    """One engine table as of engine batch `batch`, from the change log, with DuckDB over
    delta-rs (no Spark): {key: value}, JSON decoded. The same query runs in Spark SQL."""
    import json

    import duckdb

    with duckdb.connect() as db:
        db.register("changelog", delta_dataset(changelog_path(output)))
        rows = db.execute(STATE_AT_SQL, {"table": table, "batch": batch}).fetchall()
    return {_plain_key(json.loads(k)): json.loads(v) for k, v, _, _ in rows}


def _plain_key(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key
