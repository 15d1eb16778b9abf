"""The log: the one total order of requests in `<ns>.log`, its records, how it is read, signed,
versioned and got past a record that stops it.

records    the record format (start, batch, snapshot, skip, upgrade) and `LogCursor`, the one
           acceptance rule every reader applies
reader     `LogReader`: following the log from a position, through broker weather
secret     the log secret: signing and checking every record, rotation
steps      a dependent transaction's step on its way back through `<ns>.requests`, signed
snapshots  where a restarting sequencer begins to read: a recent, trusted snapshot
probe      does the broker still hold what this process read or wrote
versions   procedure set versions: the check every sequencer makes, `ordo upgrade`
skip       `ordo log skip`: past a record that stops every reader

May import: `ordo.broker`, `ordo.procedures`, `ordo.storage` and the base modules of `ordo`
(errors, maven, extras, config). Never the sequencer, the engine or recovery: they all read
the log through here."""
