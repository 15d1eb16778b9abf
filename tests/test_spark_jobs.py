"""The Spark border jobs against the real broker, a real engine and local Spark:
datasets become requests (producer job), change data becomes Parquet (changes job), both
through Spark's own Kafka connector (spark-sql-kafka-0-10, jars from Maven Central).

One SparkSession (local[2]) serves the module; the engine runs in this process (a
Coordinator with in-process partition workers and a SequencerThread)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

from ordo.client import Client
from ordo.embedded import SequencerThread
from ordo.state import records
from ordo.scheduler.coordinator import Coordinator
from ordo.sequencer.sequencer import SequencerConfig
from ordo.broker.topics import ensure_topics
from ordo.spark_jobs import changes_job, lake, producer_job
from ordo.spark_jobs import records as records_codec
from ordo.spark_jobs.records import request_message
from ordo.spark_jobs.samples import BAD_ROWS, SAMPLES_DIR
from tests.helpers import ROOT, ordo_output, topic_reader

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]

PARTITIONS = 2


@pytest.fixture(scope="module")
def spark():
    from ordo.spark_jobs.session import build_session

    session = build_session("ordo-tests", master="local[2]", shuffle_partitions=2)
    yield session
    session.stop()


class Engine:
    """Sequencer and engine of one namespace, on threads of this process."""

    def __init__(self, bootstrap: str, namespace: str, data_dir: str):
        ensure_topics(bootstrap, namespace, request_partitions=2)
        self.bootstrap, self.namespace, self.data_dir = bootstrap, namespace, data_dir
        self.coordinator = Coordinator(bootstrap, namespace, data_dir, "serial", PARTITIONS, runtime="local")
        self._thread = threading.Thread(target=self.coordinator.run, daemon=True)
        self._thread.start()
        self.sequencer = SequencerThread(bootstrap, namespace, SequencerConfig(max_delay_ms=20, max_txns=40)).start()

    def outcomes(self, ids: list[str], timeout: float = 90) -> dict[str, dict]:
        """Every id's outcome, once the engine has applied the batches that hold them."""
        found = Client(self.bootstrap, self.namespace).outcomes(ids, timeout=timeout)
        missing = set(ids) - set(found)
        assert not missing, f"no outcome for {sorted(missing)[:5]}"
        last = max(o["batch"] for o in found.values())
        deadline = time.monotonic() + timeout
        while self.coordinator.stats.last_batch < last:
            assert time.monotonic() < deadline, "engine did not apply every batch"
            time.sleep(0.02)
        return found

    def stop(self) -> None:
        self.sequencer.stop()
        self.coordinator.stop()
        self._thread.join(30)


@pytest.fixture
def engine(broker, namespace, tmp_path):
    running = Engine(broker, namespace, str(tmp_path / "data"))
    yield running
    running.stop()


def sample(name: str) -> str:
    return os.path.join(SAMPLES_DIR, name)


def sample_ids(name: str) -> list[str]:
    with open(sample(name)) as f:
        if name.endswith(".jsonl"):
            return [json.loads(line)["id"] for line in f if line.strip()]
        return [line.split(",", 1)[0] for line in f.read().splitlines()[1:]]


def engine_state(data_dir: str) -> dict:
    """`ordo dump` as {(table, key as canonical JSON): value}."""
    return {
        (r["table"], json.dumps(r["key"], separators=(",", ":"), sort_keys=True)): r["value"] for r in records(data_dir)
    }


def lake_state(spark, output: str) -> dict:
    """The lake's state tables read with Spark, checked against delta-rs reading them without."""
    state = {}
    for table in changes_job.current_tables(spark, output):
        for row in changes_job.load_table(spark, output, table).collect():
            key = (table, row["key"])
            assert key not in state, f"two current rows for {key}"
            state[key] = json.loads(row["value"])
        without_spark = {
            (table, json.dumps(list(k) if isinstance(k, tuple) else k, separators=(",", ":"))): v
            for k, v in lake.read_table(output, table).items()
        }
        assert without_spark == {k: v for k, v in state.items() if k[0] == table}
    return state


def changelog_rows(spark, output: str) -> list[tuple]:
    return sorted(
        tuple(r)
        for r in changes_job.load_changelog(spark, output)
        .select("batch", "part", "seq", "txn", "table", "key", "value", "deleted")
        .collect()
    )


def topic_changes(bootstrap: str, namespace: str, last_batch: int, timeout: float = 60):
    """The change records on <ns>.changes of batches 1..last_batch, read with kafka-python
    (no code shared with the source under test): (raw messages, exploded rows of the
    distinct (batch, txn, part) records)."""
    consumer = topic_reader(
        bootstrap, f"{namespace}.changes", consumer_timeout_ms=500, isolation_level="read_committed"
    )
    messages, by_record, parts, txns = [], {}, {}, {}

    def complete() -> bool:  # every part of every transaction of every batch
        return len(txns) == last_batch and len(parts) == sum(txns.values()) and len(by_record) == sum(parts.values())

    deadline = time.monotonic() + timeout
    while not complete() and time.monotonic() < deadline:
        for message in consumer:
            messages.append(message)
            record = json.loads(message.value)
            by_record.setdefault((record["batch"], record["txn"], record["part"]), record)
            parts[record["batch"], record["txn"]] = record["parts"]
            txns[record["batch"]] = record["txns"]
    consumer.close()
    assert complete(), f"{len(by_record)} change records on the topic, some missing"
    canonical = lambda v: None if v is None else json.dumps(v, separators=(",", ":"), sort_keys=True)  # noqa: E731
    rows = sorted(
        (b, k, seq, t, c["table"], canonical(c["key"]), canonical(c["value"]), bool(c.get("deleted")))
        for (b, t, k), record in by_record.items()
        for seq, c in enumerate(record["changes"])
    )
    return messages, rows


def test_sample_dataset_through_producer_engine_and_consumer_equals_ordo_dump(
    spark, broker, namespace, engine, tmp_path, capsys
):
    # The SL sample as CSV (args as JSON text) plus SL deposits with one column per argument.
    produced = producer_job.produce(spark, broker, namespace, sample("sl.csv"), "csv")
    wide = producer_job.produce(
        spark,
        broker,
        namespace,
        sample("sl_deposits_wide.csv"),
        "csv",
        producer_job.Mapping(args_col=None, args_cols=["*"]),
    )
    ids = sample_ids("sl.csv") + sample_ids("sl_deposits_wide.csv")
    assert produced.rows + wide.rows == len(ids) == 400
    print(
        f"\nproducer (batch, CSV): {produced.rows} rows in {produced.seconds:.2f}s = "
        f"{produced.rows_per_second:,.0f} rows/s"
    )
    outcomes = engine.outcomes(ids)
    statuses = Counter(o["status"] for o in outcomes.values())
    assert statuses["committed"] >= 300 and statuses["rejected"] == 0, statuses
    assert all(outcomes[i]["status"] == "committed" for i in sample_ids("sl_deposits_wide.csv"))

    output, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    started = time.monotonic()
    stats = changes_job.run_consumer(spark, broker, namespace, output, checkpoint, once=True, progress=0.5)
    seconds = time.monotonic() - started
    progress = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ordo-changes: ")]
    assert progress and "change records read" in progress[-1], progress
    print(
        f"consumer (--once): {stats.changes} changes in {stats.micro_batches} micro-batch(es), "
        f"{seconds:.2f}s = {stats.changes / seconds:,.0f} changes/s"
    )
    engine.stop()
    expected = engine_state(engine.data_dir)
    assert expected and lake_state(spark, output) == expected
    assert stats.tables == {"account", "asset"}

    report = changes_job.example_report(spark, output)
    balances = {json.loads(k): v for (t, k), v in expected.items() if t == "account"}
    assert report["top_accounts"][0][1] == max(balances.values())
    assert report["total_assets"] == sum(v for (t, _), v in expected.items() if t == "asset")


def test_consumer_stopped_mid_stream_and_restarted_loses_and_duplicates_nothing(
    spark, broker, namespace, engine, tmp_path
):
    # Requests arrive as files in a folder: the streaming producer (JSON lines) publishes them.
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    with open(sample("micro.jsonl")) as f:
        lines = f.read().splitlines(keepends=True)
    (inbox / "part-1.jsonl").write_text("".join(lines[:150]))
    (inbox / "part-2.jsonl").write_text("".join(lines[150:]))
    query = producer_job.produce_stream(
        spark, broker, namespace, str(inbox), "json", str(tmp_path / "produce-ck"), once=True
    )
    query.awaitTermination(120)
    assert query.exception() is None and producer_job.streamed_rows(query) == 300
    assert "KafkaTable" in query.lastProgress["sink"]["description"]  # Spark's Kafka sink
    outcomes = engine.outcomes(sample_ids("micro.jsonl"))
    assert {o["status"] for o in outcomes.values()} == {"committed"}
    last_batch = engine.coordinator.stats.last_batch
    assert last_batch >= 6

    # First run: a few records per micro-batch, stopped after two micro-batches (a third
    # is usually running and is interrupted).
    output, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    query, stats = changes_job.start_consumer(spark, broker, namespace, output, checkpoint, max_records_per_batch=3)
    deadline = time.monotonic() + 90
    while stats.micro_batches < 2:
        assert query.isActive and time.monotonic() < deadline, query.exception()
        time.sleep(0.05)
    query.stop()
    assert query.lastProgress["sources"][0]["description"] == f"KafkaV2[Subscribe[{namespace}.changes]]"
    first_run = changelog_rows(spark, output)
    messages, expected_rows = topic_changes(broker, namespace, last_batch)
    assert 0 < len(first_run) < len(expected_rows), "the first run should stop mid-stream"
    assert set(first_run) <= set(expected_rows)

    # The engine re-emits outputs after a crash: append copies of records already consumed.
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=broker)
    for message in messages[:3] + messages[-2:]:
        producer.send(f"{namespace}.changes", key=message.key, value=message.value)
    producer.flush()
    producer.close()

    # Second run, from the same checkpoint, to the end of the topic.
    changes_job.run_consumer(spark, broker, namespace, output, checkpoint, once=True)
    assert changelog_rows(spark, output) == expected_rows
    engine.stop()
    assert lake_state(spark, output) == engine_state(engine.data_dir)

    # Consuming everything again from scratch into the same output changes nothing.
    shutil.rmtree(checkpoint)
    changes_job.run_consumer(spark, broker, namespace, output, checkpoint, once=True)
    assert changelog_rows(spark, output) == expected_rows
    assert lake_state(spark, output) == engine_state(engine.data_dir)


def test_bad_rows_are_published_and_rejected_with_clear_errors(spark, broker, namespace, engine):
    produced = producer_job.produce(spark, broker, namespace, sample("bad_rows.csv"), "csv")
    assert produced.rows == len(BAD_ROWS)
    sent = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", broker)
        .option("subscribe", f"{namespace}.requests")
        .load()
        .collect()
    )
    # A row that is not a whole request is answered under its position, not the id it names.
    position = {bytes(m["key"]).decode(): f"@{m['partition']}:{m['offset']}" for m in sent}
    unreadable = ("no-proc", "no-args")
    found = engine.outcomes([position[i] if i in unreadable else i for i, *_ in BAD_ROWS])
    outcomes = {i: found[position[i] if i in unreadable else i] for i, *_ in BAD_ROWS}
    expect = {
        "good-1": ("committed", None),
        "good-2": ("committed", None),
        "no-proc": ("rejected", "missing field(s): proc"),
        "bad-args": ("rejected", "sl_deposit: 'args' must be an object, got string"),
        "unknown-proc": ("rejected", "unknown procedure 'sl_withdraw'"),
        "no-args": ("rejected", "missing field(s): args"),
        "wrong-type": ("rejected", "sl_deposit: argument 'account': expected integer, got string"),
    }
    for request_id, (status, error) in expect.items():
        outcome = outcomes[request_id]
        assert outcome["status"] == status, outcome
        assert (outcome["error"] is None) if error is None else (error in outcome["error"]), outcome

    # The same outcomes through the connector over <ns>.results (a batch read), and the same
    # messages as the hand-made encoding of each row.
    results = changes_job.read_outputs(spark, broker, namespace, "results", stream=False)
    assert {r["id"]: (r["status"], r["error"]) for r in results.collect()} == {
        i: (o["status"], o["error"]) for i, o in found.items()
    }
    assert sorted((bytes(m["key"]) if m["key"] is not None else None, bytes(m["value"])) for m in sent) == sorted(
        request_message(*row) for row in BAD_ROWS
    )


def test_consumer_reads_every_partition_committed_records_only_within_the_read_limit(spark, broker, namespace):
    """<ns>.changes with 3 partitions, written in Kafka transactions as the engine writes it,
    one of them aborted: the connector reads every partition, the committed records only, at
    most maxOffsetsPerTrigger offsets per micro-batch, and reports its offsets per partition."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"{namespace}.changes"
    admin = AdminClient({"bootstrap.servers": broker})
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": broker, "transactional.id": f"{namespace}-test"})
    producer.init_transactions(30)

    def record(batch, p, key):
        return json.dumps(
            {
                "batch": batch,
                "partition": p,
                "part": 0,
                "parts": 1,
                "changes": [{"txn": 0, "table": "t", "key": key, "value": {"b": 2, "a": [1, None]}}],
            }
        )

    sent = set()
    for batch in range(1, 5):
        producer.begin_transaction()
        for p in range(3):
            producer.produce(topic, key=f"{batch}:{p}", value=record(batch, p, [p, f"k{batch}"]), partition=p)
            sent.add((batch, p))
        if batch == 3:
            producer.flush(30)  # on the log, then aborted: an engine that failed mid-batch, never an output
            producer.abort_transaction(30)
            sent -= {(3, p) for p in range(3)}
        else:
            producer.commit_transaction(30)
    expected = {(b, p, p) for b, p in sent}
    everything = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", broker)
        .option("subscribe", topic)
        .option("kafka.isolation.level", "read_uncommitted")
        .load()
        .count()
    )
    assert everything == 12  # the aborted records are on the log

    df = changes_job.read_outputs(spark, broker, namespace, "changes", stream=False)
    rows = df.collect()
    assert {(r["batch"], r["partition"], r["kafka_partition"]) for r in rows} == expected and len(rows) == 9
    assert {r["changes"][0]["key"] for r in rows if r["batch"] == 1} == {'[0,"k1"]', '[1,"k1"]', '[2,"k1"]'}
    assert {r["changes"][0]["value"] for r in rows} == {'{"a":[1,null],"b":2}'}  # canonical JSON
    assert f"KafkaRelation(strategy=Subscribe[{topic}]" in df._jdf.queryExecution().analyzed().toString()

    query = (
        changes_job.read_outputs(spark, broker, namespace, "changes", max_records_per_batch=5)
        .writeStream.format("memory")
        .queryName("ordo_changes_stream")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(90)
    assert query.exception() is None
    streamed = spark.sql("SELECT batch, partition, kafka_partition FROM ordo_changes_stream").collect()
    assert {tuple(r) for r in streamed} == expected and len(streamed) == 9
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert len(sizes) >= 2 and max(sizes) <= 5 and sum(sizes) == 9
    end = query.recentProgress[-1]["sources"][0]["endOffset"]
    # 4 transactions per partition: 4 records and 4 markers (commit or abort) each.
    assert (json.loads(end) if isinstance(end, str) else end) == {topic: {"0": 8, "1": 8, "2": 8}}


def test_the_jobs_run_on_sparks_kafka_connector_from_maven_central(spark):
    """The session carries the connector's jars (fetched through ordo/maven.py, not Ivy) and
    the jobs' reads plan Spark's Kafka relation, not a Python data source."""
    from ordo.maven import cache_dir
    from ordo.spark_jobs.kafka_connector import PROVIDER_CLASS, connector_jars, connector_loaded

    jars = spark.sparkContext.getConf().get("spark.jars").split(",")
    assert any(os.path.basename(j).startswith("spark-sql-kafka-0-10_") for j in jars), jars
    assert any(os.path.basename(j).startswith("kafka-clients-") for j in jars), jars
    assert set(connector_jars()) <= set(jars) and all(
        j.startswith(os.path.join(cache_dir(), "maven")) for j in connector_jars()
    )
    assert not spark.sparkContext.getConf().contains("spark.jars.packages")
    assert not any(os.path.basename(j).startswith(("scala-library", "hadoop-client")) for j in connector_jars())
    assert connector_loaded(spark)
    provider = spark.sparkContext._jvm.java.lang.Class.forName(
        PROVIDER_CLASS, False, spark.sparkContext._jvm.java.lang.Thread.currentThread().getContextClassLoader()
    )
    assert "spark-sql-kafka" in provider.getProtectionDomain().getCodeSource().getLocation().toString()
    # What the changes job reads (decoded by records.py) is a plan over Spark's Kafka relation.
    from ordo.spark_jobs.records import decode_outputs

    raw = spark.read.format("kafka").options(**changes_job.source_options("127.0.0.1:1", "x")).load()
    plan = decode_outputs(raw, "changes")._jdf.queryExecution().analyzed().toString()
    assert "KafkaRelation(strategy=Subscribe[x.changes]" in plan, plan
    # (The streams' source and sink are checked by name in the mid-stream test: KafkaV2, KafkaTable.)


def test_kafka_settings_become_the_java_clients():
    """The user's librdkafka settings as options of the connector's Java client."""
    from ordo.spark_jobs.kafka_connector import java_client_settings, kafka_options

    java, dropped = java_client_settings(
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanisms": "SCRAM-SHA-512",
            "sasl.username": "u",
            "sasl.password": 'p"w',
            "ssl.ca.location": "/ca.pem",
            "ssl.endpoint.identification.algorithm": "none",
            "client.id": "c",
            "request.timeout.ms": "9000",
            "debug": "broker",
            "socket.keepalive.enable": "true",
            "isolation.level": "read_uncommitted",
            "group.id": "g",
        }
    )
    assert java == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required username="u" '
        'password="p\\"w";',
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": "/ca.pem",
        "ssl.endpoint.identification.algorithm": "",
        "client.id": "c",
        "request.timeout.ms": "9000",
    }
    assert dropped == ["debug", "socket.keepalive.enable"]
    java, _ = java_client_settings({"sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "p"})
    assert java["sasl.jaas.config"].startswith("org.apache.kafka.common.security.plain.PlainLoginModule required")
    java, _ = java_client_settings(
        {
            "sasl.mechanism": "GSSAPI",
            "sasl.kerberos.keytab": "/k.tab",
            "sasl.kerberos.principal": "ordo@EXAMPLE",
            "sasl.kerberos.service.name": "kafka",
        }
    )
    assert "useKeyTab=true" in java["sasl.jaas.config"] and java["sasl.kerberos.service.name"] == "kafka"
    java, _ = java_client_settings({"ssl.keystore.location": "/c.p12", "ssl.keystore.password": "x"})
    assert java == {"ssl.keystore.type": "PKCS12", "ssl.keystore.location": "/c.p12", "ssl.keystore.password": "x"}
    options = kafka_options("b:9", {"client.id": "mine", "kafka.linger.ms": "5"}, user={"client.id": "theirs"})
    assert options == {"kafka.client.id": "mine", "kafka.linger.ms": "5", "kafka.bootstrap.servers": "b:9"}


@pytest.fixture(scope="module")
def sasl_broker():
    """A Kafka node with a SASL_PLAINTEXT listener (PLAIN; user `spark`, password `s3cret`)."""
    from ordo.broker.apache_kafka import KafkaCluster, Listener

    listener = Listener(
        "SASL_PLAINTEXT",
        "SASL_PLAINTEXT",
        {
            "listener.name.sasl_plaintext.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule required user_spark="s3cret";',
        },
    )
    with KafkaCluster(listeners=[listener]) as cluster:
        yield cluster


def test_the_users_sasl_settings_reach_the_connector(spark, sasl_broker, namespace, tmp_path, monkeypatch):
    """A --kafka-config file with SASL settings (librdkafka's names) lets both jobs' Kafka
    reads and writes authenticate; a wrong password fails the job."""
    from kafka import KafkaProducer

    from ordo.broker.client_settings import FILE_ENV

    plain = sasl_broker.bootstrap_servers
    secure = sasl_broker.listener_servers("SASL_PLAINTEXT")
    ensure_topics(plain, namespace)
    config = tmp_path / "kafka.properties"
    config.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=spark\nsasl.password=s3cret\n"
    )
    monkeypatch.setenv(FILE_ENV, str(config))
    produced = producer_job.produce(spark, secure, namespace, sample("bad_rows.csv"), "csv")
    assert produced.rows == len(BAD_ROWS)
    producer = KafkaProducer(bootstrap_servers=plain)
    producer.send(
        f"{namespace}.results",
        key=b"r1",
        value=json.dumps(
            {"id": "r1", "status": "committed", "batch": 1, "result": {"z": 1, "a": 2}, "error": None}
        ).encode(),
    )
    producer.flush()
    producer.close()
    results = changes_job.read_outputs(spark, secure, namespace, "results", stream=False).collect()
    assert [(r["id"], r["result"]) for r in results] == [("r1", '{"a":2,"z":1}')]
    sent = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", plain)
        .option("subscribe", f"{namespace}.requests")
        .load()
        .count()
    )
    assert sent == len(BAD_ROWS)

    config.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=spark\nsasl.password=wrong\n"
    )
    with pytest.raises(Exception, match="SaslAuthenticationException"):  # in the connector's Java producer
        producer_job.produce(spark, secure, namespace, sample("bad_rows.csv"), "csv", kafka={"max.block.ms": "15000"})


def test_cli_writes_the_checked_in_samples_and_parses_the_jobs(tmp_path):
    """`ordo spark …` is wired into the ordo CLI (the jobs themselves run in the tests above
    through the same functions); the checked-in samples are what the generator makes."""
    out = ordo_output("spark", "samples", "--out", str(tmp_path))
    written = sorted(os.path.basename(p) for p in out.split())
    assert written == sorted(os.listdir(SAMPLES_DIR))
    for name in written:
        with open(sample(name)) as f:
            assert (tmp_path / name).read_text() == f.read(), name
    for job in ("produce", "changes"):
        usage = ordo_output("spark", job, "--help")
        assert "--bootstrap-servers" in usage and "--kafka-option" in usage and "--progress-seconds" in usage


def test_a_job_says_nothing_on_stderr_but_its_own_lines(broker, namespace):
    """`ordo spark produce` in a process of its own, its JVM started as a user's would be:
    standard error holds the job's progress lines and nothing from Spark or the JVM (no
    level announcement, no incubator-module notice)."""
    ensure_topics(broker, namespace, request_partitions=2)
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ordo.cli",
            "spark",
            "produce",
            "--bootstrap-servers",
            broker,
            "--namespace",
            namespace,
            "--input",
            sample("sl.csv"),
            "--format",
            "csv",
            "--master",
            "local[2]",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"published 300 requests to {namespace}.requests"), done.stdout
    assert [line for line in done.stderr.splitlines() if not line.startswith("ordo-produce: ")] == [], done.stderr


def test_column_mapping_builds_requests(spark):
    """The mapping alone (no Kafka): renamed columns, a constant procedure, struct and
    map arguments, arguments from named columns."""
    df = spark.createDataFrame(
        [("a", "sl_deposit", 1, 2, None), ("b", None, 3, None, "x")],
        "rid string, p string, account int, asset int, note string",
    )
    rows = producer_job.to_requests(
        df, producer_job.Mapping(id_col="rid", proc_col="p", args_col=None, args_cols=["account", "asset"])
    ).collect()
    assert [tuple(r) for r in rows] == [("a", "sl_deposit", '{"account":1,"asset":2}'), ("b", None, '{"account":3}')]
    rows = producer_job.to_requests(
        df.selectExpr("rid", "named_struct('k', account) AS a", "map('m', asset) AS m"),
        producer_job.Mapping(id_col="rid", proc="micro_rmw", args_col="a"),
    ).collect()
    assert [tuple(r) for r in rows] == [("a", "micro_rmw", '{"k":1}'), ("b", "micro_rmw", '{"k":3}')]
    assert request_message("x", "p", '{"a": [1, 2]}') == (b"x", b'{"id":"x","proc":"p","args":{"a":[1,2]}}')
    assert request_message("y", None, "{oops") == (b"y", b'{"id":"y","args":"{oops"}')
    assert request_message(None, "p", None) == (None, b'{"proc":"p"}')
    with pytest.raises(ValueError, match="no column"):
        producer_job.to_requests(df, producer_job.Mapping())
    # The messages Spark's Kafka sink is given: the same bytes, row by row, as request_message.
    rows = [
        ("x", "p", '{"a": [1, 2]}'),
        ("y", None, "{oops"),
        (None, "p", None),
        ("", "p", "5"),
        ('é\n"q', "p", '{"b": 1.0, "a": "\\u00e9"}'),
    ]
    encoded = records_codec.encode_requests(spark.createDataFrame(rows, "id string, proc string, args string"))
    assert [(None if r["key"] is None else bytes(r["key"]), bytes(r["value"])) for r in encoded.collect()] == [
        request_message(*row) for row in rows
    ]
    assert request_message("", "p", "5") == (None, b'{"id":"","proc":"p","args":5}')


def test_parts_deletes_and_late_re_emissions_merge_by_batch_and_txn(spark, broker, namespace, tmp_path):
    """Synthetic change records: a transaction split into two parts, a later delete, and copies of
    older records arriving after newer ones (an engine replay) leave the newest state."""
    from kafka import KafkaProducer

    ensure_topics(broker, namespace)
    put = lambda key, value: {"table": "account", "key": key, "value": value}  # noqa: E731

    def head(batch, txn, txns, part=0, parts=1):
        return {"batch": batch, "txn": txn, "txns": txns, "part": part, "parts": parts}

    records = {
        "1.0.0": {**head(1, 0, 4, 0, 2), "changes": [put(1, 10)]},
        "1.0.1": {**head(1, 0, 4, 1, 2), "changes": [put("k", {"a": 1})]},
        "1.1.0": {**head(1, 1, 4), "changes": [put(2, 20)]},
        "1.2.0": {**head(1, 2, 4), "changes": [put(1, 11)]},
        "1.3.0": {**head(1, 3, 4), "changes": []},
        "2.0.0": {**head(2, 0, 2), "changes": [{"table": "account", "key": 2, "value": None, "deleted": True}]},
        "2.1.0": {**head(2, 1, 2), "changes": [put(3, 30)]},
    }
    producer = KafkaProducer(bootstrap_servers=broker)

    def send(*keys):
        for key in keys:
            producer.send(
                f"{namespace}.changes", key=key.encode(), value=json.dumps(records[key], separators=(",", ":")).encode()
            )
        producer.flush()

    # Batch 2 whole, batch 1 without one part: the tables wait for batch 1, whole.
    send(*[key for key in records if key != "1.0.1"])
    output, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    stats = changes_job.run_consumer(spark, broker, namespace, output, checkpoint, once=True)
    assert (stats.applied_batch, stats.waiting_batches) == (0, 2)
    assert lake_state(spark, output) == {}
    assert len(changelog_rows(spark, output)) == 5

    send("1.0.1")
    stats = changes_job.run_consumer(spark, broker, namespace, output, checkpoint, once=True)
    assert (stats.applied_batch, stats.waiting_batches) == (2, 0)
    expected = {("account", "1"): 11, ("account", '"k"'): {"a": 1}, ("account", "3"): 30}
    assert lake_state(spark, output) == expected
    log = changelog_rows(spark, output)
    # (batch, part, seq, txn): the empty transaction 3 has no rows
    assert [r[:4] for r in log] == [(1, 0, 0, 0), (1, 0, 0, 1), (1, 0, 0, 2), (1, 1, 0, 0), (2, 0, 0, 0), (2, 0, 0, 1)]
    assert log[4][5:] == ("2", None, True)

    send("1.0.1", "1.0.0")  # re-emitted after batch 2: must neither resurrect key 2 nor add rows
    stats = changes_job.run_consumer(spark, broker, namespace, output, checkpoint, once=True)
    producer.close()
    assert stats.repeated == 2 and stats.records == 0
    assert lake_state(spark, output) == expected
    assert changelog_rows(spark, output) == log
    # As of batch 1, from the change log (DuckDB over delta-rs): key 2 was there then.
    assert lake.state_at(output, "account", 1) == {1: 11, 2: 20, "k": {"a": 1}}
    assert lake.state_at(output, "account", 2) == {1: 11, 3: 30, "k": {"a": 1}}


def test_every_table_name_lands_and_the_report_never_fails_the_job(spark, broker, namespace, tmp_path):
    """Engine tables named like an app's output streams and windows (`stream.report`,
    `window.recent`), with composite keys and odd characters, land in tables of their own;
    the job's example report is for show and says so instead of failing."""
    from kafka import KafkaProducer

    ensure_topics(broker, namespace)
    changes = [
        {"table": "stream.report", "key": [1, "a"], "value": {"total": 3}},
        {"table": "window.recent", "key": 7, "value": [1, 2]},
        {"table": "odd name/é", "key": "x", "value": 1},
    ]
    producer = KafkaProducer(bootstrap_servers=broker)
    record = {"batch": 1, "time": 1_764_241_080_123, "txn": 0, "txns": 1, "part": 0, "parts": 1, "changes": changes}
    producer.send(f"{namespace}.changes", key=b"1.0.0", value=json.dumps(record).encode())
    producer.flush()
    producer.close()
    output, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    args = producer_job_args(broker, namespace, output, checkpoint)
    out = io.StringIO()
    assert changes_job.run(args, out=out) == 0
    assert "tables as of batch 1: odd name/é (1 rows), stream.report (1 rows), window.recent (1 rows)" in out.getvalue()
    assert lake_state(spark, output) == {
        ("stream.report", '[1,"a"]'): {"total": 3},
        ("window.recent", "7"): [1, 2],
        ("odd name/é", '"x"'): 1,
    }
    times = lake.delta_dataset(lake.batches_path(output)).to_table().to_pylist()
    assert [(r["batch"], r["batch_time"].timestamp()) for r in times] == [(1, 1_764_241_080.123)]

    hidden = str(tmp_path / "no-internal")
    args = producer_job_args(broker, namespace, hidden, str(tmp_path / "ck2"), "--no-internal-tables")
    assert changes_job.run(args, out=io.StringIO()) == 0
    assert changes_job.current_tables(spark, hidden) == ["odd name/é"]


def producer_job_args(broker, namespace, output, checkpoint, *extra):
    import argparse

    parser = argparse.ArgumentParser()
    changes_job.add_arguments(parser)
    return parser.parse_args(
        ["--bootstrap-servers", broker, "--namespace", namespace, "--output", output, "--checkpoint", checkpoint]
        + ["--once", "--master", "local[2]", "--progress-seconds", "0", *extra]
    )


def test_the_parquet_layout_before_delta_is_refused_in_one_line(spark, broker, namespace, tmp_path):
    ensure_topics(broker, namespace)
    old = tmp_path / "old"
    (old / "changelog" / "batch=1").mkdir(parents=True)
    (old / "_state").mkdir()
    with pytest.raises(lake.OldLayout) as refused:
        changes_job.run_consumer(spark, broker, namespace, str(old), str(tmp_path / "ck"), once=True)
    assert "Parquet lake of Ordo's releases before Delta Lake" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_restarted_job_says_its_own_changes_and_what_the_change_log_holds(spark, broker, namespace, tmp_path):
    """The summary and the progress line count this job's changes, and say the change log's
    total beside them: after a restart the two differ."""
    from kafka import KafkaProducer

    ensure_topics(broker, namespace)
    producer = KafkaProducer(bootstrap_servers=broker)

    def send_batch(batch: int, txns: int) -> None:
        for txn in range(txns):
            change = {"table": "account", "key": batch * 10 + txn, "value": txn}
            record = {"batch": batch, "txn": txn, "txns": txns, "part": 0, "parts": 1, "changes": [change]}
            producer.send(f"{namespace}.changes", key=f"{batch}.{txn}.0".encode(), value=json.dumps(record).encode())
        producer.flush()

    output, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    args = producer_job_args(broker, namespace, output, checkpoint, "--no-report")
    send_batch(1, 3)
    out = io.StringIO()
    assert changes_job.run(args, out=out) == 0
    assert "consumed 3 changes (3 change records) in 1 micro-batch(es) in " in out.getvalue()
    assert f"into {output}, whose change log holds 3 changes; tables as of batch 1" in out.getvalue()

    send_batch(2, 2)
    out = io.StringIO()
    assert changes_job.run(args, out=out) == 0
    assert "consumed 2 changes (2 change records) in 1 micro-batch(es) in " in out.getvalue()
    assert f"into {output}, whose change log holds 5 changes; tables as of batch 2" in out.getvalue()

    send_batch(3, 1)
    stats = changes_job.run_consumer(spark, broker, namespace, output, checkpoint, once=True)
    producer.close()
    assert "1 changes appended to the change log (6 in it), tables at batch 3" in changes_job.describe(stats)

    out = io.StringIO()  # nothing new: no micro-batch, the change log as it was
    assert changes_job.run(args, out=out) == 0
    assert "consumed 0 changes (0 change records) in " in out.getvalue()
    assert "whose change log holds 6 changes" in out.getvalue()
