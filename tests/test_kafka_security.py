"""Ordo on a Kafka that authenticates and authorizes: SASL_SSL with SCRAM-SHA-512, ACLs per
role (docs/operations.md, "Security: SASL_SSL and ACLs").

One real Kafka node for the module, with TLS certificates made here (a CA, and one node
certificate for 127.0.0.1/localhost that serves TLS and is the node's own identity on the
controller listener), SCRAM users from `kafka-storage format --add-scram` (and one created
on the running cluster, as `kafka-configs --alter` would), the StandardAuthorizer with
`allow.everyone.if.no.acl.found=false`, and the ACLs of the recipe:

- the sequencer (`ordo sequence`, principal `sequencer`) reads requests and is the only
  writer of `<ns>.log`;
- the engine (`ordo execute`, principal `engine`) reads the log and is the only writer of
  `<ns>.results` and `<ns>.changes`;
- clients (`ordo submit`, principal `client`) write requests and read results.

Nothing unauthenticated is a super user: the inter-broker listener is the SASL_SSL one
(as `admin`), and the controller listener takes only TLS clients with a certificate of the
cluster's CA (the node itself). The launcher's PLAINTEXT listener stays (its readiness
probe reads metadata there), and what comes in on it is User:ANONYMOUS, which no ACL names:
the tests show it refused.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import uuid

import pytest

from tests.helpers import ROOT, stop

pytestmark = pytest.mark.slow

NS = "secure"
PASSWORDS = {
    "admin": "admin-secret",
    "sequencer": "sequencer-secret",
    "engine": "engine-secret",
    "client": "client-secret",
}
NODE_PRINCIPAL = "User:CN=ordo-kafka-node"  # the node's certificate, on the controller listener
FORGED = b"forged-by-client"

# librdkafka's lines about the refusals the tests provoke go nowhere.
QUIET = logging.getLogger("ordo.test.kafka_security")
QUIET.addHandler(logging.NullHandler())
QUIET.propagate = False


# -- certificates, broker, ACLs ---------------------------------------------------------------


def make_certificates(folder) -> dict[str, str]:
    """A CA, and a node key and certificate it signed for 127.0.0.1/localhost (server and
    client use, PKCS#8 key): `ca` for truststores and ssl.ca.location, `node` the PEM
    keystore (key, certificate, CA)."""
    folder = str(folder)

    def openssl(*args: str) -> None:
        done = subprocess.run(["openssl", *args], cwd=folder, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr

    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=ordo-test-ca",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    )
    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "node.key",
        "-out",
        "node.csr",
        "-subj",
        "/CN=ordo-kafka-node",
    )
    with open(os.path.join(folder, "node.ext"), "w") as f:
        f.write(
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n"
            "basicConstraints=CA:FALSE\n"
        )
    openssl(
        "x509",
        "-req",
        "-in",
        "node.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "node.crt",
        "-days",
        "2",
        "-extfile",
        "node.ext",
    )
    paths = {"ca": os.path.join(folder, "ca.pem"), "node": os.path.join(folder, "node.pem")}
    with open(paths["node"], "w") as out:
        for name in ("node.key", "node.crt", "ca.pem"):
            with open(os.path.join(folder, name)) as f:
                out.write(f.read())
    os.chmod(paths["node"], 0o600)
    return paths


def broker_security(certificates: dict[str, str]):
    """The node settings of the recipe, and its SASL_SSL listener."""
    from ordo.broker.apache_kafka import Listener

    settings = {
        # CONTROLLER is TLS with client certificates; PLAINTEXT is the launcher's own.
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:SSL,SASL_SSL:SASL_SSL",
        "inter.broker.listener.name": "SASL_SSL",
        "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": certificates["node"],
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": certificates["ca"],
        "listener.name.controller.ssl.client.auth": "required",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "false",
        "super.users": f"User:admin;{NODE_PRINCIPAL}",
    }
    listener = Listener(
        "SASL_SSL",
        "SASL_SSL",
        {
            "listener.name.sasl_ssl.sasl.enabled.mechanisms": "SCRAM-SHA-512",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="admin" password="{PASSWORDS["admin"]}";',
        },
    )
    return settings, listener


def role_acls(ns: str) -> dict[str, list[tuple[str, str, str, str]]]:
    """Per principal: (resource type, pattern type, name, operation), all ALLOW from any host;
    each one found missing from the error a role stops with without it. The same list is in
    docs/operations.md as kafka-acls commands."""
    return {
        "sequencer": [
            ("TOPIC", "LITERAL", f"{ns}.requests", "READ"),
            ("TOPIC", "LITERAL", f"{ns}.log", "READ"),  # it reads its own past back at start
            ("TOPIC", "LITERAL", f"{ns}.log", "WRITE"),
            ("TOPIC", "LITERAL", f"{ns}.results", "DESCRIBE"),  # it checks that every topic exists
            ("TOPIC", "LITERAL", f"{ns}.changes", "DESCRIBE"),
            ("GROUP", "PREFIXED", f"{ns}.sequencer", "READ"),  # its request offsets, and .catchup
            ("GROUP", "LITERAL", f"{ns}.log.startup", "READ"),  # a restart reads back to a snapshot
            # No transactional id: it appends with an idempotent producer (`ordo upgrade` alone
            # fences the lanes' transactional ids, docs/operations.md).
        ],
        "engine": [
            ("TOPIC", "LITERAL", f"{ns}.log", "READ"),
            ("TOPIC", "LITERAL", f"{ns}.results", "WRITE"),
            ("TOPIC", "LITERAL", f"{ns}.changes", "WRITE"),
            ("TOPIC", "LITERAL", f"{ns}.requests", "WRITE"),  # dependent transactions re-sequenced
            ("GROUP", "PREFIXED", f"{ns}.engine-", "READ"),  # one per partition worker
            ("GROUP", "LITERAL", f"{ns}.log.head-check", "READ"),  # a rebuild from scratch
            ("GROUP", "LITERAL", f"{ns}.sequencer", "DESCRIBE"),  # the requests lag it shows
            ("TOPIC", "LITERAL", f"{ns}.reads", "READ"),  # live reads of the state, and their answers
            ("TOPIC", "LITERAL", f"{ns}.read-answers", "WRITE"),
            ("GROUP", "PREFIXED", f"{ns}.reads-", "READ"),
        ],
        "client": [
            ("TOPIC", "LITERAL", f"{ns}.requests", "WRITE"),
            ("TOPIC", "LITERAL", f"{ns}.results", "READ"),
            ("GROUP", "PREFIXED", "ordo-client-", "READ"),  # the results reader's group
            ("TOPIC", "LITERAL", f"{ns}.reads", "WRITE"),  # live reads, and their answers
            ("TOPIC", "LITERAL", f"{ns}.read-answers", "READ"),
            ("TOPIC", "LITERAL", f"{ns}.log", "DESCRIBE"),  # where it ends: a linearizable read
            ("GROUP", "PREFIXED", "ordo-reads-", "READ"),
        ],
    }


def client_settings(kafka, user: str | None, password: str | None = None) -> dict:
    """librdkafka settings of `user` on the SASL_SSL listener; None: none at all."""
    if user is None:
        return {"bootstrap.servers": kafka.listener_servers("SASL_SSL"), "logger": QUIET}
    return {
        "bootstrap.servers": kafka.listener_servers("SASL_SSL"),
        "logger": QUIET,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": user,
        "sasl.password": password or PASSWORDS[user],
        "ssl.ca.location": kafka.certificates["ca"],
    }


def write_kafka_config(kafka, user: str, password: str | None = None, folder=None) -> str:
    """The `--kafka-config` file a role runs with."""
    path = os.path.join(str(folder or kafka.folder), f"{user}.properties")
    with open(path, "w") as f:
        f.write(
            f"security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.username={user}\n"
            f"sasl.password={password or PASSWORDS[user]}\nssl.ca.location={kafka.certificates['ca']}\n"
        )
    os.chmod(path, 0o600)
    return path


@pytest.fixture(scope="module")
def kafka(tmp_path_factory):
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
        UserScramCredentialUpsertion,
        ScramCredentialInfo,
        ScramMechanism,
    )

    from ordo.broker.apache_kafka import KafkaCluster
    from ordo.broker.topics import ensure_topics

    folder = tmp_path_factory.mktemp("kafka-security")
    certificates = make_certificates(folder)
    settings, listener = broker_security(certificates)
    # admin (the inter-broker user), sequencer and engine at format time; client below,
    # on the running cluster.
    scram = [
        arg
        for user in ("admin", "sequencer", "engine")
        for arg in ("--add-scram", f"SCRAM-SHA-512=[name={user},password={PASSWORDS[user]}]")
    ]
    cluster = KafkaCluster(settings=settings, listeners=[listener], format_args=scram)
    cluster.certificates = certificates
    cluster.folder = str(folder)
    cluster.start()
    try:
        admin = AdminClient(client_settings(cluster, "admin"))
        upsert = UserScramCredentialUpsertion(
            "client", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), PASSWORDS["client"].encode()
        )
        for future in admin.alter_user_scram_credentials([upsert]).values():
            future.result(30)
        bindings = [
            AclBinding(
                getattr(ResourceType, kind),
                name,
                getattr(ResourcePatternType, pattern),
                f"User:{user}",
                "*",
                getattr(AclOperation, operation),
                AclPermissionType.ALLOW,
            )
            for user, acls in role_acls(NS).items()
            for kind, pattern, name, operation in acls
        ]
        for future in admin.create_acls(bindings).values():
            future.result(30)
        # The namespace's topics, made by the admin as `ordo run` would make them.
        config_file = write_kafka_config(cluster, "admin")
        previous = os.environ.get("ORDO_KAFKA_CONFIG")
        os.environ["ORDO_KAFKA_CONFIG"] = config_file
        try:
            ensure_topics(cluster.listener_servers("SASL_SSL"), NS)
        finally:
            if previous is None:
                os.environ.pop("ORDO_KAFKA_CONFIG")
            else:
                os.environ["ORDO_KAFKA_CONFIG"] = previous
        yield cluster
    finally:
        cluster.stop()


# -- helpers ----------------------------------------------------------------------------------


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORDO_")}
    return {**env, "PYTHONUNBUFFERED": "1", "PYTHONPATH": ROOT}


def ordo_cli(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ordo.cli", *args], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout
    )


def read_topic(kafka, topic: str, timeout: float = 30) -> list[tuple[int, bytes | None]]:
    """Every record of `topic` (partition 0) as the admin sees it, uncommitted and aborted
    ones included: (offset, value)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            **client_settings(kafka, "admin"),
            "group.id": f"admin-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_uncommitted",
            "enable.partition.eof": True,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        records: list[tuple[int, bytes | None]] = []
        deadline = time.monotonic() + timeout
        while True:
            assert time.monotonic() < deadline, f"{topic} not read to its end within {timeout:.0f} s"
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                if message.error().code() == KafkaError._PARTITION_EOF:
                    return records
                raise AssertionError(f"reading {topic}: {message.error()}")
            records.append((message.offset(), message.value()))
    finally:
        consumer.close()


def produce_as(kafka, user: str | None, topic: str, value: bytes, bootstrap: str | None = None):
    """Send one record as `user` and return the broker's delivery error (None: delivered)."""
    from confluent_kafka import Producer

    settings = client_settings(kafka, user)
    if bootstrap is not None:
        settings["bootstrap.servers"] = bootstrap
    reports = []
    producer = Producer({**settings, "message.timeout.ms": 15000})
    producer.produce(topic, value=value, on_delivery=lambda error, message: reports.append(error))
    assert producer.flush(30) == 0, f"a record to {topic} as {user} was neither delivered nor refused"
    return reports[0]


def connection_errors(settings: dict, timeout: float = 3) -> str:
    """What librdkafka reports (its error callback and its log) while a client with
    `settings` fails to read metadata."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    reports: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            reports.append(record.getMessage())

    logger = logging.getLogger(f"ordo.test.kafka_security.{uuid.uuid4().hex}")
    logger.addHandler(Collect())
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    admin = AdminClient({**settings, "logger": logger, "error_cb": lambda error: reports.append(error.str())})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=timeout)
    admin.poll(1)  # serves the error callback
    return " | ".join(reports)


# -- the tests --------------------------------------------------------------------------------


def test_ordo_runs_end_to_end_with_a_principal_per_role(kafka, tmp_path):
    """`ordo sequence` and `ordo execute`, each under its own principal, answer a client's
    requests, a dependent one among them (the engine re-sequences it through
    <ns>.requests); a restarted sequencer reads its past back, and `ordo recover` rebuilds
    the engine's state from the log, all within the ACLs."""
    from confluent_kafka import KafkaError

    common = ["--bootstrap-servers", kafka.listener_servers("SASL_SSL"), "--namespace", NS]
    data_dir = str(tmp_path / "data")
    logs = []

    def start(role: str, *args: str) -> subprocess.Popen:
        log = open(tmp_path / f"{role}-{len(logs)}.err", "w+")
        logs.append(log)
        return subprocess.Popen(
            [sys.executable, "-m", "ordo.cli", *args, *common, "--kafka-config", write_kafka_config(kafka, role)],
            cwd=ROOT,
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=log,
        )

    def submit(*args: str) -> list[dict]:
        done = ordo_cli(
            "submit",
            *common,
            "--kafka-config",
            write_kafka_config(kafka, "client"),
            *args,
            "--wait",
            "--timeout",
            "60",
            timeout=90,
        )
        assert done.returncode == 0, done.stderr[-2000:] + "".join(_tail(log) for log in logs)
        return [json.loads(line) for line in done.stdout.splitlines()]

    requests = [{"id": f"s-{i}", "proc": "micro_rmw", "args": {"keys": [i, i + 1]}} for i in range(3)]
    requests += [
        {"id": "bind", "proc": "alias_bind", "args": {"alias": "a", "account": 7}},
        {"id": "deposit", "proc": "alias_deposit", "args": {"alias": "a", "amount": 5}},
    ]
    (tmp_path / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in requests))
    sequencer = start("sequencer", "sequence")
    engine = start("engine", "execute", "--data-dir", data_dir, "--quiet", "--checkpoint-every", "0")
    try:
        outcomes = submit("--file", str(tmp_path / "requests.jsonl"))
        assert sorted(o["id"] for o in outcomes) == sorted(r["id"] for r in requests)
        assert {o["status"] for o in outcomes} == {"committed"}, outcomes
        assert stop(sequencer, 60) == 0, "".join(_tail(log) for log in logs)
        sequencer = start("sequencer", "sequence")
        (again,) = submit("--proc", "micro_rmw", "--args", '{"keys": [9]}', "--id", "after-restart")
        assert again["status"] == "committed", again
        # A live read of the state, as the client, within its ACLs.
        for consistency in ([], ["--linearizable"]):
            read = ordo_cli(
                "get", *common, "--kafka-config", write_kafka_config(kafka, "client"), "micro", "9", *consistency
            )
            assert read.returncode == 0, read.stderr[-2000:] + "".join(_tail(log) for log in logs)
            assert json.loads(read.stdout) == {"table": "micro", "key": 9, "value": 1}
    finally:
        codes = {"engine": stop(engine, 60), "sequencer": stop(sequencer, 60)}
    assert codes == {"engine": 0, "sequencer": 0}, "".join(_tail(log) for log in logs)
    recover = subprocess.run(
        [
            sys.executable,
            "-m",
            "ordo.cli",
            "recover",
            *common,
            "--data-dir",
            data_dir,
            "--from-scratch",
            "--kafka-config",
            write_kafka_config(kafka, "engine"),
        ],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert recover.returncode == 0 and "recovered: rebuild" in recover.stderr, recover.stderr[-2000:]
    for log in logs:
        log.close()
    # The log holds the sequencers' records, the results the engine's outcomes.
    assert len(read_topic(kafka, f"{NS}.log")) >= 5
    published = {json.loads(value)["id"] for _, value in read_topic(kafka, f"{NS}.results")}
    assert published >= {r["id"] for r in requests} | {"after-restart"}
    # Nor may the engine write the log, nor the sequencer the outputs.
    assert produce_as(kafka, "engine", f"{NS}.log", FORGED).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert produce_as(kafka, "sequencer", f"{NS}.results", FORGED).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def _tail(log) -> str:
    log.flush()
    log.seek(0)
    return f"\n--- {log.name} ---\n{log.read()[-2000:]}"


def test_a_client_without_credentials_is_refused(kafka, tmp_path):
    """No credentials, or wrong ones: no connection; the PLAINTEXT listener: in as
    User:ANONYMOUS, which may write nothing. Nothing reaches the topics."""
    from confluent_kafka import KafkaError

    requests_before = read_topic(kafka, f"{NS}.requests")
    submit = ["submit", "--namespace", NS, "--proc", "micro_rmw", "--args", '{"keys": [7]}']
    # No SASL, no TLS, at the SASL_SSL listener: no connection at all; a wrong password:
    # SCRAM refuses it. Either way the command stops in one line before sending anything.
    wrong_password = write_kafka_config(kafka, "client", "not-the-password", tmp_path)
    for settings in ([], ["--kafka-config", wrong_password]):
        done = ordo_cli(*submit, "--bootstrap-servers", kafka.listener_servers("SASL_SSL"), *settings, timeout=60)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert kafka.listener_servers("SASL_SSL") in done.stderr, done.stderr
    # What the broker told those clients, as librdkafka reports it.
    assert "connection closed by peer" in connection_errors(client_settings(kafka, None))
    assert "Authentication failed" in connection_errors(client_settings(kafka, "client", "not-the-password"))
    # The launcher's PLAINTEXT listener: in, as User:ANONYMOUS, which may do nothing.
    anonymous = ordo_cli(*submit, "--bootstrap-servers", kafka.bootstrap_servers, timeout=60)
    assert anonymous.returncode == 1 and "not sent" in anonymous.stderr, anonymous.stderr
    assert "authorization failed" in anonymous.stderr.lower() and "Traceback" not in anonymous.stderr, anonymous.stderr
    for topic in (f"{NS}.log", f"{NS}.results"):
        error = produce_as(kafka, None, topic, FORGED, bootstrap=kafka.bootstrap_servers)
        assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, (topic, error)
    assert read_topic(kafka, f"{NS}.requests") == requests_before


def test_a_client_cannot_forge_the_log_or_the_outputs(kafka):
    """The client principal writes requests, and nothing else: the broker refuses its
    records to the log and the outputs, and the log as the admin reads it (uncommitted
    records included) is unchanged."""
    from confluent_kafka import KafkaError, KafkaException, Producer

    before = {topic: read_topic(kafka, f"{NS}.{topic}") for topic in ("log", "results", "changes")}
    for topic in ("log", "results", "changes"):
        error = produce_as(kafka, "client", f"{NS}.{topic}", FORGED)
        assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, (topic, error)
    # Nor can it take the sequencer's transactional id (which would fence the sequencer).
    producer = Producer({**client_settings(kafka, "client"), "transactional.id": f"{NS}.sequencer"})
    with pytest.raises(KafkaException) as refused:
        producer.init_transactions(30)
    assert refused.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, refused.value
    # What it may do, it can: a request goes in.
    assert (
        produce_as(kafka, "client", f"{NS}.requests", b'{"id": "c-1", "proc": "micro_rmw", "args": {"keys": [1]}}')
        is None
    )
    after = {topic: read_topic(kafka, f"{NS}.{topic}") for topic in ("log", "results", "changes")}
    assert after == before
    assert not any(value == FORGED for records in after.values() for _, value in records)
