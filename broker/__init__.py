"""The broker and the talk to it: the Kafka broker Ordo starts on this machine, and the
Kafka client plumbing every component shares.

local          `ordo broker` and the broker behind embedded defaults: Apache Kafka or tansu
apache_kafka   Apache Kafka in KRaft mode, one node or a cluster on loopback ports
tansu          the memory-only fallback broker, by choice only
probe          `python -m ordo.broker.probe`: what a broker does that the sequencer relies on
clients        settings every Ordo Kafka client shares, and small helpers around consumers
client_settings  librdkafka settings a user gives every client (security, timeouts)
reachability   is a broker there at all, asked before anything starts
topics         a namespace's topic names, their creation and the log's settings
lag            requests and source records waiting for the sequencer
fetch_stall    consumers that stop fetching after a broker restart, read on by new ones
fetch_states   what a consumer's fetcher is doing, from librdkafka's statistics

May import: the standard library, confluent-kafka, `ordo.errors`, `ordo.maven`, `ordo.extras`
and `ordo.config`, and `ordo.storage`. Nothing of the log, the procedures or the engine."""
