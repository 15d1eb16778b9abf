"""Settings shared by every benchmark: seeds, batch size, latency load."""

SCHEDULERS = ("serial", "locking", "vll", "opchain", "aria")
SEED = 1
WARMUP_SEED, PACED_SEED = 1001, 1002
# Requests per batch at most: Calvin's sequencer cap (200 txns per 10 ms epoch).
DEFAULT_BATCH = 200
# Share of the measured end-to-end throughput at which latency is taken.
LATENCY_LOAD = 0.5
PREFILL_DELAY_MS = 250.0  # pre-filled logs: batches are cut by size, not by time
PACED_MAX_RATE = 60_000  # end-to-end requests/s the paced phases are prepared for
