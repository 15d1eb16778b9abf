"""`ordo bench`: the measurements of BENCHMARKS.md.

`ordo bench WORKLOAD …` measures one configuration (configuration.py); `ordo bench suite`
runs the grid (suite.py) with the storage limit and the PostgreSQL baseline in the same
run; `ordo bench scale` runs one log at several partition counts (scale.py). They print a
table and can write JSON; the suite also draws a plot (plot.py).

What each figure is (docs/benchmarks.md says more):
- storage limit: the same writes straight into RocksDB, one WriteBatch per batch;
- engine: transactions/s of the partition workers following a pre-filled log from the
  first batch applied to the last (no client, no sequencer);
- replay: a log replayed into a fresh data directory by `ordo.recover.recover`;
- end to end: requests/s from the first request produced until the client has read every
  outcome from <ns>.results (the client is a separate process);
- latency: produce → outcome read by the client, at half of the end-to-end throughput;
- memory: peak resident memory of the engine process, the sequencer and Ray workers.
"""
