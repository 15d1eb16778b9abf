"""Storage: key and value encoding, RocksDB shards, the per-batch overlay, state digests."""
