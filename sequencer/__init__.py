"""Sequencing: requests (from `<ns>.requests` and the app's source topics) cut into batches
of the log, exactly once, one sequencer per lane.

sequencer   the loop: consume, validate, batch, append, note its place
wire        a request's wire format and its validation
dedupe      the window of recent request ids
routing     where each transaction of a batch runs, carried in the batch for the engine
sources     reading the app's source topics, their positions in the log
lane_owner  one engine per namespace: the note every sequencer keeps, the look at start
takeover    learning from the log that another sequencer took this lane over

May import: `ordo.log`, `ordo.broker`, `ordo.procedures`, `ordo.storage` and the base
modules of `ordo`. Never the engine (`ordo.scheduler`) or recovery."""
