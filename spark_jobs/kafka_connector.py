"""Spark's own Kafka connector (`spark-sql-kafka-0-10`) for the border jobs: its jars from
Maven Central (ordo/maven.py), and Ordo's Kafka settings as the connector's options.

    python -m spark_jobs.kafka_connector     # the jars, comma-separated (for spark-submit --jars)

Version: the connector matching the installed PySpark (`pyspark.__version__`, Scala from
PySpark's own spark-core jar), fetched by spark_jobs/jars.py. When Maven Central has no connector of that version (PyPI can
publish a PySpark release before Central has its jars), the newest release tested with Ordo,
`FALLBACK_VERSION`, is used if it has the same major version, with one line saying so.
`ORDO_SPARK_KAFKA_VERSION` names a version to use instead.

Settings (docs/spark.md): the user's librdkafka settings (broker/client_settings.py) become
`kafka.`-prefixed options of the Java client: a setting the Java client knows by the same name
passes as it is, SASL user/password and Kerberos keytab settings become `sasl.jaas.config`,
PEM files become PEM trust/key stores; settings only librdkafka knows are left out, named in
one warning line. What Ordo sets itself (bootstrap servers, isolation, idempotence) wins.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Mapping

from ordo.maven import Artifacts
from ordo.spark_jobs.jars import class_loadable, resolve, scala_version, spark_version

VERSION_ENV = "ORDO_SPARK_KAFKA_VERSION"
# The newest connector release on Maven Central that Ordo's tests have run with; used only
# when Central has none of the installed PySpark's version (same major version).
FALLBACK_VERSION = "4.2.0"
PROVIDER_CLASS = "org.apache.spark.sql.kafka010.KafkaSourceProvider"


# ---------------------------------------------------------------- the jars


def connector(version: str, scala: str | None = None) -> Artifacts:
    """The Maven artifact set of Spark's Kafka connector of one Spark version."""
    return Artifacts(
        "spark-sql-kafka", (f"org.apache.spark:spark-sql-kafka-0-10_{scala or scala_version()}:{version}",)
    )


def candidate_versions() -> list[str]:
    chosen = os.environ.get(VERSION_ENV, "").strip()
    if chosen:
        return [chosen]
    installed = spark_version()
    versions = [installed]
    if FALLBACK_VERSION != installed and FALLBACK_VERSION.split(".")[0] == installed.split(".")[0]:
        versions.append(FALLBACK_VERSION)
    return versions


_resolved: list[str] | None = None


def connector_jars() -> list[str]:
    """The connector's jars and its dependencies, less those Spark ships itself. Fetched
    once; later calls ask no network."""
    global _resolved
    if _resolved is None:
        _resolved = resolve("Spark's Kafka connector", [connector(v) for v in candidate_versions()], VERSION_ENV)
    return list(_resolved)


def ensure_connector(spark) -> None:
    """Make the connector loadable in a session whose JVM started without it (under
    spark-submit without --jars, or a second session in one process): `ADD JAR` puts the
    jars on the session's class loader and ships them to executors."""
    if connector_loaded(spark):
        return
    for jar in connector_jars():
        spark.sql(f"ADD JAR '{jar}'")
    if not connector_loaded(spark):
        raise RuntimeError(
            f"Spark's Kafka connector ({PROVIDER_CLASS}) is not loadable in this Spark session: "
            f'pass its jars with spark-submit --jars "$(python -m spark_jobs.kafka_connector)"'
        )


def connector_loaded(spark) -> bool:
    return class_loadable(spark, PROVIDER_CLASS)


# ---------------------------------------------------------------- settings

# Set by Ordo itself, or refused by the connector (it manages offsets and (de)serializers).
_OWN = {
    "bootstrap.servers",
    "isolation.level",
    "group.id",
    "auto.offset.reset",
    "enable.auto.commit",
    "key.deserializer",
    "value.deserializer",
    "key.serializer",
    "value.serializer",
    "interceptor.classes",
    "enable.idempotence",
    "acks",
}
# librdkafka name -> the Java client's, where only the name differs.
_RENAMED = {"sasl.mechanisms": "sasl.mechanism"}
# Handled by the translation below (they become other settings).
_TRANSLATED = {
    "sasl.username",
    "sasl.password",
    "sasl.kerberos.keytab",
    "sasl.kerberos.principal",
    "sasl.oauthbearer.method",
    "sasl.oauthbearer.client.id",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.scope",
    "sasl.oauthbearer.extensions",
    "ssl.ca.location",
    "ssl.ca.pem",
    "ssl.certificate.location",
    "ssl.certificate.pem",
    "ssl.key.location",
    "ssl.key.pem",
    "ssl.keystore.location",
    "ssl.keystore.password",
}

# The Java client's setting names (kafka-clients 3.9, consumer and producer), for when the
# JVM cannot be asked (tests of the translation without a session).
_JAVA_NAMES = set(
    """
acks auto.commit.interval.ms auto.include.jmx.reporter auto.offset.reset batch.size bootstrap.servers buffer.memory
check.crcs client.dns.lookup client.id client.rack compression.gzip.level compression.lz4.level compression.type
compression.zstd.level connections.max.idle.ms default.api.timeout.ms delivery.timeout.ms enable.auto.commit
enable.idempotence enable.metrics.push exclude.internal.topics fetch.max.bytes fetch.max.wait.ms fetch.min.bytes
group.id group.instance.id group.protocol group.remote.assignor heartbeat.interval.ms interceptor.classes
internal.leave.group.on.close isolation.level key.deserializer key.serializer linger.ms max.block.ms
max.in.flight.requests.per.connection max.partition.fetch.bytes max.poll.interval.ms max.poll.records
max.request.size metadata.max.age.ms metadata.max.idle.ms metadata.recovery.strategy metric.reporters
metrics.num.samples metrics.recording.level metrics.sample.window.ms partition.assignment.strategy
partitioner.adaptive.partitioning.enable partitioner.availability.timeout.ms partitioner.class
partitioner.ignore.keys receive.buffer.bytes reconnect.backoff.max.ms reconnect.backoff.ms request.timeout.ms
retries retry.backoff.max.ms retry.backoff.ms sasl.client.callback.handler.class sasl.jaas.config
sasl.kerberos.kinit.cmd sasl.kerberos.min.time.before.relogin sasl.kerberos.service.name
sasl.kerberos.ticket.renew.jitter sasl.kerberos.ticket.renew.window.factor sasl.login.callback.handler.class
sasl.login.class sasl.login.connect.timeout.ms sasl.login.read.timeout.ms sasl.login.refresh.buffer.seconds
sasl.login.refresh.min.period.seconds sasl.login.refresh.window.factor sasl.login.refresh.window.jitter
sasl.login.retry.backoff.max.ms sasl.login.retry.backoff.ms sasl.mechanism sasl.oauthbearer.clock.skew.seconds
sasl.oauthbearer.expected.audience sasl.oauthbearer.expected.issuer sasl.oauthbearer.header.urlencode
sasl.oauthbearer.jwks.endpoint.refresh.ms sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms
sasl.oauthbearer.jwks.endpoint.retry.backoff.ms sasl.oauthbearer.jwks.endpoint.url sasl.oauthbearer.scope.claim.name
sasl.oauthbearer.sub.claim.name sasl.oauthbearer.token.endpoint.url security.protocol security.providers
send.buffer.bytes session.timeout.ms socket.connection.setup.timeout.max.ms socket.connection.setup.timeout.ms
ssl.cipher.suites ssl.enabled.protocols ssl.endpoint.identification.algorithm ssl.engine.factory.class
ssl.key.password ssl.keymanager.algorithm ssl.keystore.certificate.chain ssl.keystore.key ssl.keystore.location
ssl.keystore.password ssl.keystore.type ssl.protocol ssl.provider ssl.secure.random.implementation
ssl.trustmanager.algorithm ssl.truststore.certificates ssl.truststore.location ssl.truststore.password
ssl.truststore.type transaction.timeout.ms transactional.id value.deserializer value.serializer
""".split()
)

_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
_warned: set[tuple[str, ...]] = set()


def _jaas_value(value: str) -> str:
    return json.dumps(str(value))  # a JAAS option value: a double-quoted string, \ and " escaped


def _read(path: str, setting: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise ValueError(f"Kafka setting {setting}={path}: {exc.strerror or exc}") from None


def java_client_settings(settings: Mapping[str, Any]) -> tuple[dict[str, str], list[str]]:
    """librdkafka settings -> (the Java client's settings, the names left out)."""
    s = {k: str(v) for k, v in settings.items()}
    out: dict[str, str] = {}
    dropped: list[str] = []
    mechanism = (s.get("sasl.mechanism") or s.get("sasl.mechanisms") or "").upper()
    if "sasl.username" in s or "sasl.password" in s:
        module = _LOGIN_MODULES.get(mechanism or "PLAIN")
        if module is None:
            dropped += [k for k in ("sasl.username", "sasl.password") if k in s]
        else:
            out["sasl.jaas.config"] = (
                f"{module} required username={_jaas_value(s.get('sasl.username', ''))} "
                f"password={_jaas_value(s.get('sasl.password', ''))};"
            )
    if mechanism == "GSSAPI" and "sasl.kerberos.keytab" in s:
        principal = f" principal={_jaas_value(s['sasl.kerberos.principal'])}" if "sasl.kerberos.principal" in s else ""
        out["sasl.jaas.config"] = (
            "com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true "
            f"storeKey=true keyTab={_jaas_value(s['sasl.kerberos.keytab'])}{principal};"
        )
    elif "sasl.kerberos.keytab" in s or "sasl.kerberos.principal" in s:
        dropped += [k for k in ("sasl.kerberos.keytab", "sasl.kerberos.principal") if k in s]
    if mechanism == "OAUTHBEARER" and s.get("sasl.oauthbearer.method", "").lower() == "oidc":
        options = [
            f"clientId={_jaas_value(s.get('sasl.oauthbearer.client.id', ''))}",
            f"clientSecret={_jaas_value(s.get('sasl.oauthbearer.client.secret', ''))}",
        ]
        if "sasl.oauthbearer.scope" in s:
            options.append(f"scope={_jaas_value(s['sasl.oauthbearer.scope'])}")
        for pair in filter(None, s.get("sasl.oauthbearer.extensions", "").split(",")):
            key, _, value = pair.partition("=")
            options.append(f"extension_{key.strip()}={_jaas_value(value.strip())}")
        out["sasl.jaas.config"] = (
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required " + " ".join(options) + ";"
        )
        out["sasl.login.callback.handler.class"] = (
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"
        )
    else:
        dropped += [k for k in s if k.startswith("sasl.oauthbearer.") and k in _TRANSLATED]
    # SSL: librdkafka's PEM files and PKCS#12 key store.
    if "ssl.ca.location" in s:
        out.update({"ssl.truststore.type": "PEM", "ssl.truststore.location": s["ssl.ca.location"]})
    if "ssl.ca.pem" in s:
        out.update({"ssl.truststore.type": "PEM", "ssl.truststore.certificates": s["ssl.ca.pem"]})
    certificate = s.get("ssl.certificate.pem") or (
        _read(s["ssl.certificate.location"], "ssl.certificate.location") if "ssl.certificate.location" in s else None
    )
    key = s.get("ssl.key.pem") or (
        _read(s["ssl.key.location"], "ssl.key.location") if "ssl.key.location" in s else None
    )
    if certificate and key:
        out.update({"ssl.keystore.type": "PEM", "ssl.keystore.certificate.chain": certificate, "ssl.keystore.key": key})
    elif certificate or key:
        dropped += [
            k for k in ("ssl.certificate.location", "ssl.certificate.pem", "ssl.key.location", "ssl.key.pem") if k in s
        ]
    if "ssl.keystore.location" in s:
        out.update({"ssl.keystore.type": "PKCS12", "ssl.keystore.location": s["ssl.keystore.location"]})
        if "ssl.keystore.password" in s:
            out["ssl.keystore.password"] = s["ssl.keystore.password"]
    for name, value in s.items():
        if name in _TRANSLATED:
            continue
        name = _RENAMED.get(name, name)
        if name in _OWN:
            continue
        if name == "ssl.endpoint.identification.algorithm" and value.lower() == "none":
            value = ""
        if name in _JAVA_NAMES:
            out.setdefault(name, value)
        else:
            dropped.append(name)
    return out, sorted(set(dropped))


def kafka_options(
    bootstrap: str, extra: Mapping[str, Any] | None = None, user: Mapping[str, Any] | None = None
) -> dict[str, str]:
    """The connector's `kafka.` options: the user's settings (translated; default: from
    user_kafka_settings()), then `extra` (Java client settings, `kafka.` prefix optional),
    then the bootstrap servers."""
    if user is None:
        from ordo.broker.client_settings import user_kafka_settings

        user = user_kafka_settings()
    java, dropped = java_client_settings(user)
    if dropped and tuple(dropped) not in _warned:
        _warned.add(tuple(dropped))
        print(
            f"ordo spark: Kafka setting(s) {', '.join(dropped)} have no equivalent in the Java client of "
            f"Spark's Kafka connector and are left out (docs/spark.md)",
            file=sys.stderr,
            flush=True,
        )
    options = {f"kafka.{k}": v for k, v in java.items()}
    for name, value in (extra or {}).items():
        options[name if name.startswith("kafka.") else f"kafka.{name}"] = str(value)
    options["kafka.bootstrap.servers"] = bootstrap
    return options


def main() -> int:
    print(",".join(connector_jars()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
