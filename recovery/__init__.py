"""Recovery: checkpoints of the shards and deterministic replay of the log."""
