"""How many requests wait on <ns>.requests, and records on the app's source topics
(sequencer/sources.py), for the sequencer: the topics' end offsets
minus the offsets the sequencer commits at most every 0.25 s while it appends batches, when
it starts and every few seconds while idle (its consumer group `<ns>.sequencer`), over
every partition: offsets a killed sequencer did not get to commit are put right by its
successor at once.

For display only (the progress line, the metrics): the sequencer itself resumes from the
log, never from these offsets. On the local broker the end offset of a partition is the
base offset of its last producer batch + 1 (docs/local-broker.md), so requests that
arrived in one batch count as one until a later batch follows; zero stays zero.
"""

from __future__ import annotations

from typing import Hashable, Iterable, Mapping

from ordo.broker.topics import Topics


def sequencer_group(namespace: str) -> str:
    return f"{namespace}.sequencer"


def lag(end_offsets: Mapping[Hashable, int], committed: Mapping[Hashable, int]) -> int:
    """Messages past the committed offset, summed over partitions; a partition with no
    committed offset (negative: none yet) counts from its beginning."""
    return sum(max(0, end - max(committed.get(partition, 0), 0)) for partition, end in end_offsets.items())


def requests_lag(
    consumer_or_bootstrap, namespace: str, group: str | None = None, timeout: float = 2.0, sources: Iterable[str] = ()
) -> int | None:
    """The requests lag as the broker reports it now, source topics (`sources`) included,
    or None if it cannot tell (no topic, no answer). `consumer_or_bootstrap`: the bootstrap servers, or a confluent-kafka
    Consumer whose group.id is the sequencer's group (`group`, by default
    `<ns>.sequencer`) and which never subscribes, so it never joins that group."""
    from confluent_kafka import Consumer, TopicPartition

    from ordo.broker.clients import kafka_config

    group = group or sequencer_group(namespace)
    own = isinstance(consumer_or_bootstrap, str)
    consumer = (
        Consumer(kafka_config(consumer_or_bootstrap, {"group.id": group, "enable.auto.commit": False}))
        if own
        else consumer_or_bootstrap
    )
    try:
        partitions = []
        for topic in (Topics(namespace).requests, *sources):
            metadata = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
            if metadata is None or metadata.error is not None or not metadata.partitions:
                return None
            partitions += [TopicPartition(topic, p) for p in sorted(metadata.partitions)]
        committed = {(tp.topic, tp.partition): tp.offset for tp in consumer.committed(partitions, timeout=timeout)}
        ends = {
            (tp.topic, tp.partition): consumer.get_watermark_offsets(tp, timeout=timeout, cached=False)[1]
            for tp in partitions
        }
        return lag(ends, committed)
    except Exception:  # a display: the broker not answering now is not an error here
        return None
    finally:
        if own:
            consumer.close()
