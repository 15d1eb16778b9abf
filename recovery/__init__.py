"""Recovery: checkpoints of the shards and deterministic replay of the log (docs/recovery.md).

checkpoints  taking, listing (manifest), pruning and cleaning checkpoints
restore      what an engine does with its shards on start: continue, restore, rebuild
replay       `ordo recover`: replay the log to its head, with progress and rates
checks       crash-consistency checks over a data directory
"""
