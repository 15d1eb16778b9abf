"""The sequencer: request wire format, epoch batching, the log and its exactly-once append."""
