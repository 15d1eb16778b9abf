"""Recovery: checkpoints of the shards, and what an engine does with them on start
(docs/recovery.md). The engine (scheduler/) takes and restores checkpoints through it;
`ordo recover`, which drives the engine over the log, is ordo/recover.py.

checkpoints  taking, listing (manifest), pruning and cleaning checkpoints
restore      what an engine does with its shards on start: continue, restore, rebuild
checks       crash-consistency checks over a data directory

Imports: storage, broker, procedures, log and sequencer; never the scheduler.
"""
