"""The `ordo` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from confluent_kafka import KafkaException

from ordo import stopping
from ordo.config import WAIT_S, integer_between as _integer, seconds_between as _seconds
from ordo.errors import OrdoError
from ordo.procedures.loading import procedure_options, procedure_specs
from ordo.log.records import ARIA
from ordo.recovery.cadence import DEFAULT_CHECKPOINT_EVERY, checkpoint_every
from ordo.scheduler.round import ROUND_TXNS
from ordo.sequencer.sequencer import MAX_BATCH_BYTES, SequencerConfig

# The built-in workloads (procedures/workloads), named here so that building the parser
# imports none of them; a test keeps the two lists equal.
WORKLOAD_NAMES = ("micro", "sl", "gs", "ob", "tp", "alias", "tpcc", "voter", "ycsbt")

SCHEDULER_CHOICES = ("serial", "locking", "vll", "opchain", "aria")


# The ranges a setting may take. librdkafka consumes at most 1,000,000 messages a call; an
# epoch longer than a minute, or a wait longer than a day, is a typing mistake.
PORT = _integer(0, 65535)
COUNT = _integer(1)
BATCH_TXNS = _integer(1, 1_000_000)
BATCH_BYTES = _integer(1, MAX_BATCH_BYTES)  # a batch is one Kafka record
EPOCH_MS = _seconds(0, 60_000)


def _kafka(p: argparse.ArgumentParser, namespace: bool = True) -> None:
    p.add_argument("--bootstrap-servers", required=True, metavar="HOST:PORT", help="Kafka bootstrap servers")
    p.add_argument(
        "--kafka-config",
        metavar="FILE",
        help="librdkafka settings for every Kafka client (security, timeouts…): a .properties, .toml "
        "or .json file; ORDO_KAFKA_<SETTING> in the environment wins over it",
    )
    p.add_argument(
        "--wait-for-broker",
        type=WAIT_S,
        default=0.0,
        metavar="S",
        help="wait up to S seconds for a broker that is still starting (default: a broker must answer within 5 s)",
    )
    if namespace:
        p.add_argument("--namespace", default="ordo", metavar="NS", help="topic prefix (default: ordo)")


def _log_secret(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--log-secret-file",
        metavar="FILE",
        help="the namespace's log secret, shared by its sequencers and engines, which sign and check "
        "every log record with it; ORDO_LOG_SECRET (the secret itself) wins over it (default: "
        "this user's own, made on first use; docs/operations.md, 'Security')",
    )


def _sequencer_options(p: argparse.ArgumentParser) -> None:
    d = SequencerConfig()
    g = p.add_argument_group("sequencer")
    g.add_argument(
        "--max-delay-ms",
        type=EPOCH_MS,
        default=d.max_delay_ms,
        help="epoch length; 0: group commit, each batch cut as soon as the previous append is "
        "acknowledged (default: 2 ms for an engine of one partition, 10 ms for several)",
    )
    g.add_argument(
        "--min-delay-ms",
        type=EPOCH_MS,
        default=d.min_delay_ms,
        metavar="MS",
        help="epochs that follow the rate requests arrive at: this long at light load, growing with "
        "the rate to --max-delay-ms from 1,000 requests/s on (default: fixed epochs; docs/architecture.md)",
    )
    g.add_argument(
        "--max-txns", type=BATCH_TXNS, default=d.max_txns, help="requests per batch at most (default %(default)s)"
    )
    g.add_argument(
        "--max-bytes",
        type=BATCH_BYTES,
        default=d.max_bytes,
        help="bytes per batch record at most (default %(default)s); the log topic's max.message.bytes must allow it",
    )
    g.add_argument(
        "--max-request-bytes",
        type=COUNT,
        default=d.max_request_bytes,
        help="larger requests are rejected (default %(default)s)",
    )
    g.add_argument(
        "--dedupe-window",
        type=COUNT,
        default=d.dedupe_window,
        help="recent request ids remembered to reject duplicates (default %(default)s)",
    )
    g.add_argument(
        "--sequencers",
        type=COUNT,
        default=d.sequencers,
        metavar="S",
        help="sequencers sharing the request partitions, each with its own process and producer; "
        "needs at least S request partitions (default %(default)s)",
    )


def _sequencer_config(args) -> SequencerConfig:
    return SequencerConfig(
        args.max_delay_ms,
        args.max_txns,
        args.max_bytes,
        args.max_request_bytes,
        args.dedupe_window,
        args.partitions,
        args.sequencers,
        getattr(args, "sequencer_index", 0),
        _ordering(args),
        args.min_delay_ms,
    )


def _bench_epochs(args):
    """A benchmark's epochs (benchmarks/runners.py `sequencer_config`): --max-delay-ms, or
    (--min-delay-ms, --max-delay-ms) for epochs that follow the rate."""
    return args.max_delay_ms if args.min_delay_ms is None else (args.min_delay_ms, args.max_delay_ms)


def _ordering(args) -> str | None:
    """The batches' ordering stamp: aria's for `run --scheduler aria` and `sequence --ordering aria`."""
    chosen = getattr(args, "ordering", None) or getattr(args, "scheduler", None)
    return ARIA if chosen == ARIA else None


def _engine_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", required=True, metavar="DIR", help="where the RocksDB shards live")
    p.add_argument("--scheduler", choices=SCHEDULER_CHOICES, default="serial")
    p.add_argument("--partitions", type=COUNT, default=1, metavar="N", help="partition workers (default 1)")
    _placement_options(p)
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    _round_option(p, "a worker behind the log executes the batches waiting for it as one round")
    p.add_argument(
        "--metrics-port",
        type=PORT,
        metavar="PORT",
        help="serve Prometheus metrics on 127.0.0.1:PORT (0: a free port, printed at start)",
    )


# `--runtime auto` for `ordo recover`: Ray only where the placement asks for it, since
# starting Ray costs more than a replay of most logs on a few cores.
RECOVER_AUTO = "auto: in this process, unless --ray-address or --cores place the workers (then Ray)"


def _placement_options(
    p: argparse.ArgumentParser, auto: str = "auto: Ray when there is more than one partition"
) -> None:
    g = p.add_argument_group("placement")
    g.add_argument(
        "--runtime",
        choices=("auto", "local", "ray"),
        default="auto",
        help=f"partition workers in this process (local) or as Ray actors (ray); {auto}",
    )
    g.add_argument("--ray-address", metavar="ADDR", help="join this Ray cluster instead of starting one")
    g.add_argument("--cores", type=_cores, metavar="LIST", help="cores to pin workers to, e.g. 0,1 (default: all)")
    procedure_options(g)


def _checkpoint_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("checkpoints and recovery")
    g.add_argument(
        "--checkpoint-every",
        type=checkpoint_every,
        default=DEFAULT_CHECKPOINT_EVERY,
        metavar="K|Ts",
        help="checkpoint every shard each K batches, or each T seconds of log time, e.g. 10s "
        "(0: never; default %(default)s); SIGUSR1 asks a running engine for one at the next batch",
    )
    g.add_argument(
        "--keep-checkpoints",
        type=COUNT,
        default=2,
        metavar="N",
        help="complete checkpoints kept, older ones pruned (default %(default)s)",
    )
    how = g.add_mutually_exclusive_group()
    how.add_argument(
        "--from-checkpoint",
        action="store_true",
        help="restore every shard from the newest checkpoint and replay the log from there, "
        "even if the shards agree (by default only shards that disagree are restored)",
    )
    how.add_argument(
        "--from-scratch", action="store_true", help="wipe the shards and rebuild them from the beginning of the log"
    )


def _checkpointing(args) -> dict:
    restore = "checkpoint" if args.from_checkpoint else "scratch" if args.from_scratch else "auto"
    return {"checkpoint_every": args.checkpoint_every, "keep_checkpoints": args.keep_checkpoints, "restore": restore}


def _cores(text: str) -> list[int]:
    try:
        cores = [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of core numbers: {text!r}") from None
    if not cores:
        raise argparse.ArgumentTypeError("no cores given")
    return cores


def _round_option(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--round-txns",
        type=_integer(0),
        default=ROUND_TXNS,
        metavar="N",
        help=f"{what} of up to N transactions (0: one batch at a time; default %(default)s)",
    )


def _read_json(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the report {path}: {exc}") from None


def _placement(args) -> dict:
    """Where the workers run, with what code, and (`ordo run`, `ordo engine`) how."""
    placement = {
        "runtime": args.runtime,
        "ray_address": args.ray_address,
        "cores": args.cores,
        "procedure_modules": procedure_specs(args),
    }
    if hasattr(args, "round_txns"):
        placement["round_txns"] = args.round_txns
    return placement


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ordo", description="A deterministic transaction engine for streams.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("broker", help="run Apache Kafka (KRaft) on 127.0.0.1 in the foreground")
    p.add_argument(
        "--port",
        type=PORT,
        default=None,
        help="client port of the first node on 127.0.0.1 (default: a free one, kept in --data-dir)",
    )
    p.add_argument(
        "--data-dir",
        default="ordo-broker-data",
        metavar="DIR",
        help="where the nodes keep their logs; started again on it, the broker has everything "
        "it had (default %(default)s)",
    )
    p.add_argument(
        "--nodes",
        type=COUNT,
        default=1,
        metavar="N",
        help="KRaft nodes (broker and controller each) on loopback ports; 3 for replication, "
        "a node that dies started again while the others serve (default %(default)s)",
    )
    p.add_argument(
        "--engine",
        choices=("kafka", "tansu"),
        default=None,
        help="kafka (default), or tansu: a memory-only fallback for machines without Java, "
        "which forgets everything when it stops (also ORDO_BROKER_ENGINE)",
    )

    p = sub.add_parser("run", help="create topics if missing, run sequencer and engine until stopped")
    _kafka(p)
    _log_secret(p)
    _engine_options(p)
    _checkpoint_options(p)
    p.add_argument(
        "--request-partitions",
        type=COUNT,
        default=None,
        metavar="R",
        help="partitions of <ns>.requests when it is created (default: the sequencer count)",
    )
    p.add_argument(
        "--log-replication",
        type=COUNT,
        default=1,
        metavar="N",
        help="replicas of the namespace's topics when they are created; with 3 or more, "
        "<ns>.log also gets min.insync.replicas=2 (default 1)",
    )
    _sequencer_options(p)

    p = sub.add_parser("sequence", help="run only the sequencer (one of --sequencers)")
    _kafka(p)
    _log_secret(p)
    _sequencer_options(p)
    p.add_argument(
        "--sequencer-index",
        type=_integer(0),
        default=0,
        metavar="K",
        help="with --sequencers S: this is sequencer K, 0 <= K < S; it takes the request partitions "
        "p with p %% S == K (default 0)",
    )
    p.add_argument(
        "--partitions",
        type=COUNT,
        default=1,
        metavar="N",
        help="the engine's partition count, for which each batch records its routing (default 1; "
        "an engine with another count places every entry itself)",
    )
    p.add_argument("--quiet", action="store_true", help="no start line (errors are still said)")
    p.add_argument(
        "--ordering",
        choices=("log", ARIA),
        default="log",
        help="the serial order of each batch: log order, or aria's (Aria's deterministic reordering, "
        "what `ordo run --scheduler aria` asks for; docs/architecture.md); every engine follows the "
        "stamp whatever its --scheduler (default %(default)s)",
    )
    procedure_options(p)

    p = sub.add_parser("execute", help="run only the engine (follows <ns>.log)")
    _kafka(p)
    _log_secret(p)
    _engine_options(p)
    _checkpoint_options(p)

    p = sub.add_parser(
        "recover", help="restore or rebuild the shards if they need it, replay <ns>.log to its head, exit"
    )
    _kafka(p)
    _log_secret(p)
    p.add_argument("--data-dir", required=True, metavar="DIR", help="where the RocksDB shards live")
    p.add_argument("--scheduler", choices=SCHEDULER_CHOICES, default="serial")
    p.add_argument(
        "--partitions",
        type=COUNT,
        default=None,
        metavar="N",
        help="partition workers (default: as DIR is laid out, else 1)",
    )
    _placement_options(p, RECOVER_AUTO)
    p.add_argument("--quiet", action="store_true", help="no progress line")
    _checkpoint_options(p)
    p.add_argument(
        "--idle",
        type=_seconds(0, 86_400),
        default=2.0,
        metavar="SECONDS",
        help="once the log's end measured at the start is applied, wait this long for more "
        "batches before exiting (0: none; default %(default)s)",
    )
    p.add_argument("--checkpoint", action="store_true", help="checkpoint the shards at the head before exiting")
    p.add_argument(
        "--app-version",
        action="append",
        default=[],
        metavar="SPECS",
        help="an earlier version of the procedures, for the batches it sequenced: MODULE:APP (or a "
        "comma-separated list of MODULE:APP and modules), matched by its procedure-set identity "
        "(repeatable; docs/operations.md, 'Upgrading procedures')",
    )
    p.add_argument(
        "--no-kept-code",
        dest="kept_code",
        action="store_false",
        help="run only the code given (--app, --app-version), never the code the log keeps of a version",
    )
    p.add_argument(
        "--publish",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="publish the replay's outcomes and change data to <ns>'s topics (default: only where DIR is an "
        "engine's own data directory, as a restart of that engine does; a rebuild elsewhere publishes nothing)",
    )

    p = sub.add_parser(
        "upgrade",
        help="move <ns>.log to these procedures from its next batch on (an upgrade "
        "record); a running engine of the set before stops there",
    )
    _kafka(p)
    _log_secret(p)
    procedure_options(p)

    p = sub.add_parser("log", help="operator commands on <ns>.log")
    log_commands = p.add_subparsers(dest="log_command", required=True, metavar="LOG_COMMAND")
    p = log_commands.add_parser(
        "skip",
        help="append a signed record that has every reader and replay pass over "
        "the record at --offset, one that stops the log's readers",
    )
    _kafka(p)
    _log_secret(p)
    p.add_argument("--offset", type=int, required=True, metavar="N", help="the offset of the record to pass over")

    p = sub.add_parser("submit", help="produce requests; --wait collects their outcomes")
    _kafka(p)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--proc", help="procedure name (with --args)")
    what.add_argument("--file", metavar="F.jsonl", help="one request object per line ('-' for stdin)")
    p.add_argument("--args", default="{}", metavar="JSON", help="arguments object for --proc")
    p.add_argument("--id", help="request id for --proc (default: a fresh one)")
    p.add_argument("--wait", action="store_true", help="wait for every outcome and print a summary")
    p.add_argument("--timeout", type=WAIT_S, default=120.0, help="seconds to wait for outcomes")

    p = sub.add_parser(
        "get",
        help="read the state as of one batch: keys of a table, or a scan of it (docs/client.md)",
        description="Print the values of KEYs of TABLE (or, without keys, a scan of it in key order) as "
        "JSON lines {table, key, value}, all as of one applied batch, which the last line (on stderr) names.",
    )
    _kafka(p)
    p.add_argument("table", metavar="TABLE")
    p.add_argument(
        "keys", nargs="*", metavar="KEY", help="a key as JSON (7, '\"ann\"', '[1, \"x\"]'); a word is a string key"
    )
    p.add_argument("--prefix", metavar="JSON", help="without KEYs: only keys starting with these components")
    p.add_argument("--after", metavar="KEY", help="without KEYs: only keys after this one (the last one printed)")
    p.add_argument("--limit", type=int, default=100, help="without KEYs: at most this many records (default 100)")
    p.add_argument("--at-least", type=int, metavar="BATCH", help="as of this batch or a later one")
    p.add_argument("--linearizable", action="store_true", help="as of every batch the log holds now, or a later one")
    p.add_argument("--timeout", type=WAIT_S, default=10.0, help="seconds to wait for the answer")

    p = sub.add_parser("gen", help="print workload requests as JSON lines")
    p.add_argument(
        "workload",
        nargs="?",
        help=f"one of {', '.join(WORKLOAD_NAMES)} (`ordo gen --list` describes each and its knobs)",
    )
    p.add_argument("--count", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--knob", action="append", default=[], metavar="NAME=VALUE", help="workload knob, repeatable (see --list)"
    )
    p.add_argument("--list", action="store_true", help="describe every workload and its knobs")

    p = sub.add_parser(
        "dump",
        help="print the app's stored records as sorted JSON lines (safe while running)",
        description="Print stored records as sorted JSON lines {table, key, value}: the app's tables; "
        "--internal adds the engine's own tables of output streams and windows (stream.*, window.*). "
        "`ordo digest` always covers every table.",
    )
    p.add_argument("--data-dir", required=True, metavar="DIR")
    p.add_argument("--table", help="only this table (an internal one too, named in full: window.NAME)")
    p.add_argument(
        "--internal",
        action="store_true",
        help="also print the engine's own tables of output streams and windows (stream.*, window.*)",
    )

    p = sub.add_parser(
        "digest",
        help="print the order-independent state digest of a data directory",
        description="Print the order-independent digest of every stored record, the engine's own "
        "tables (stream.*, window.*) included: equal digests mean equal state, at any partition count.",
    )
    p.add_argument("--data-dir", required=True, metavar="DIR")

    p = sub.add_parser("demo", help="embedded broker, engine and a workload, with a readable summary")
    p.add_argument("--workload", default="sl")
    p.add_argument("--count", type=int, default=20_000)
    p.add_argument("--scheduler", choices=SCHEDULER_CHOICES, default="serial")
    p.add_argument("--partitions", type=int, default=1)
    p.add_argument("--data-dir", default=None, metavar="DIR", help="default: a temporary directory")

    p = sub.add_parser(
        "bench",
        help="one configuration (WORKLOAD) or the whole grid (suite), beside the "
        "storage limit and the PostgreSQL baseline",
    )
    p.add_argument(
        "workload",
        help="micro, sl, gs, ob or tp: one configuration; suite: the grid of BENCHMARKS.md; "
        "scale WORKLOAD: the same log at several partition counts; "
        "sequence WORKLOAD: requests/s into the log for several sequencer counts "
        "(--sequencers 1,2); "
        "tpcc: TPC-C engine throughput per partition count (--partitions 1,2); "
        "alias: dependent transactions end to end, with their restart rate; "
        "voter: S-Store's leaderboards, votes/s end to end; "
        "latency WORKLOAD: open-loop latency at fixed rates (--rate 500,1000), "
        "with the share of each hop (sequencing, execution, delivery); "
        "soak WORKLOAD: memory of every process under a steady rate "
        "(--rate 500 --seconds 1800), warm-up told from a leak; "
        "compression WORKLOAD: bytes and CPU of each output codec (--rounds 3); "
        "reads: live reads of the state, point-read latency and reads/s beside writes (--partitions 2)",
    )
    p.add_argument(
        "scaled",
        nargs="?",
        metavar="WORKLOAD",
        help="scale, sequence, latency, soak and compression: the workload to measure",
    )
    p.add_argument(
        "--sequencers",
        default="1,2",
        metavar="S[,S…]",
        help="sequence: the sequencer counts, comma-separated (default %(default)s)",
    )
    p.add_argument("--scheduler", choices=SCHEDULER_CHOICES, default="serial")
    p.add_argument(
        "--partitions",
        default=None,
        metavar="N[,N…]",
        help="partition workers; scale: a comma-separated list (default 1; scale: 1,2)",
    )
    p.add_argument(
        "--mp",
        default=None,
        metavar="SHARE[,SHARE…]",
        help="share of multi-partition transactions (the knob mp); scale: several, "
        "comma-separated, are measured in the same run (0,1: 100 %% against 0 %%)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        metavar="N",
        help="scale and sequence: run every configuration N times, taking turns, and report the medians (default 1)",
    )
    p.add_argument("--no-end-to-end", action="store_true", help="scale and tpcc: the engine only")
    p.add_argument(
        "--rate",
        default=None,
        metavar="REQ_PER_S[,…]",
        help="alias: the client sends at this rate (default: all at once); latency: the rates, "
        "comma-separated, each measured on a fresh namespace, sequencer and engine",
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=10.0,
        metavar="T",
        help="latency: how long the client sends at each rate, after a warm-up (default %(default)s); "
        "soak: how long it sends; reads: how long each of its three measurements runs",
    )
    p.add_argument(
        "--every",
        type=float,
        default=30.0,
        metavar="T",
        help="soak: seconds between memory samples (default %(default)s)",
    )
    p.add_argument(
        "--bounce-broker-every",
        type=float,
        default=None,
        metavar="T",
        help="soak: stop the broker every T seconds (SIGTERM and SIGKILL in turn) and start it again "
        "on its data, then check every request answered once and the state against a serial "
        "reading of the log",
    )
    p.add_argument(
        "--broker-down",
        type=float,
        default=15.0,
        metavar="S",
        help="soak with --bounce-broker-every: seconds the broker stays stopped (default %(default)s)",
    )
    p.add_argument(
        "--runtime",
        choices=("auto", "local", "ray"),
        default="auto",
        help="latency: partition workers in the engine's process (local) or as Ray actors (ray); "
        "auto: Ray when there is more than one partition",
    )
    p.add_argument("--txns", type=int, default=50_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument(
        "--max-txns",
        type=int,
        default=200,
        help="requests per batch at most (default %(default)s: Calvin's cap per 10 ms epoch)",
    )
    p.add_argument(
        "--max-delay-ms",
        type=EPOCH_MS,
        default=SequencerConfig().max_delay_ms,
        metavar="MS",
        help="latency and scale: the sequencer's epoch length; 0: group commit (default: 2 ms on one "
        "partition, 10 ms on several)",
    )
    p.add_argument(
        "--min-delay-ms",
        type=EPOCH_MS,
        metavar="MS",
        help="latency and scale: epochs that follow the rate, from this long at light load to "
        "--max-delay-ms (default: fixed epochs)",
    )
    _round_option(p, "latency: the engine's workers behind the log execute the batches waiting as one round")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON here")
    p.add_argument(
        "--plot",
        metavar="PNG",
        help="latency: plot p50 and p99 against the rate here, each configuration's knee marked",
    )
    p.add_argument(
        "--broker-warmup",
        type=_seconds(0, 3_600),
        default=None,
        metavar="S",
        help="latency: seconds of unreported traffic at most before the first rate, in rounds "
        "of 15 s until the broker's JIT compiler is done (default 90; 0: none)",
    )
    p.add_argument(
        "--beside",
        default="",
        metavar="JSON[,JSON…]",
        help="latency with --plot: earlier reports (--json) drawn in the same plot",
    )
    p.add_argument("--baseline", action="store_true", help="also the PostgreSQL baseline (micro, sl and tpcc)")
    p.add_argument("--quick", action="store_true", help="suite: fewer txns and fewer points (about 3 minutes)")
    p.add_argument(
        "--out",
        default="bench-results",
        metavar="DIR",
        help="suite: where bench.json and bench-plot.png go (default %(default)s)",
    )

    from ordo.spark_jobs.cli import add_spark_commands  # lazy: pyspark loads only when a spark job runs

    add_spark_commands(sub)
    return parser


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the innermost command `args` names (`ordo log pass-over`: pass-over's)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and getattr(args, action.dest, None) in action.choices:
            return _command_parser(action.choices[getattr(args, action.dest)], args)
    return parser


# The commands that serve until stopped: a stop signal is theirs to answer (ordo/stopping.py);
# the others stop by KeyboardInterrupt, as Python has it.
SERVICES = ("run", "sequence", "execute")


def main(argv: list[str] | None = None) -> int:
    from ordo import config

    stopping.install()  # again for `python -m ordo.cli`; `ordo` took the signals before its imports
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    config.add_common_options(parser)
    try:
        config.apply(parser, argv)
    except ValueError as exc:
        print(f"ordo: {exc}", file=sys.stderr)
        return 2
    args, unrecognized = parser.parse_known_args(config.without_config(argv))
    if unrecognized:  # argparse would answer with the top-level usage; the command's says what it takes
        _command_parser(parser, args).error(f"unrecognized arguments: {' '.join(unrecognized)}")
    try:
        config.check_parsed(args)
    except ValueError as exc:
        print(f"ordo: {exc}", file=sys.stderr)
        return 2
    config.setup_logging(args)
    try:
        _answer_stops(args)
        if hasattr(args, "app"):
            procedure_specs(args)  # a mistake in the user's own code first: finding it needs no broker
        if getattr(args, "bootstrap_servers", None):
            from ordo.broker.client_settings import FILE_ENV, user_kafka_settings
            from ordo.broker.reachability import check_reachable

            if getattr(args, "kafka_config", None):
                os.environ[FILE_ENV] = os.path.abspath(args.kafka_config)  # child processes read it too
            user_kafka_settings()  # judged once, before any client starts

            check_reachable(args.bootstrap_servers, wait=getattr(args, "wait_for_broker", 0.0))
        if hasattr(args, "log_secret_file"):
            _use_log_secret(args.log_secret_file)
        stopping.check()
        return COMMANDS[args.command](args)
    except stopping.StopRequested as exc:
        print(f"ordo {args.command}: {exc}", file=sys.stderr)
        return 0
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`ordo dump … | head`): what it wanted was written.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, FileNotFoundError, RuntimeError, OrdoError) as exc:
        print(f"ordo {args.command}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a disk or directory problem: the path and the cause
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"ordo {args.command}: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except KafkaException as exc:
        print(f"ordo {args.command}: Kafka: {exc.args[0].str() if exc.args else exc}", file=sys.stderr)
        return 2


def _answer_stops(args) -> None:
    """A service stops within stopping.SERVICE_STOP_S of a stop signal, however its broker
    does; a job that answers stop signals itself (`ordo spark changes`) keeps them; another
    command goes back to Python's own answer to the signals."""
    command = args.command
    if command not in SERVICES:
        if not getattr(args, "answers_stops", False):
            stopping.release()
        return
    stopping.exit_within(
        stopping.SERVICE_STOP_S,
        lambda: (
            f"ordo {command}: stopped {stopping.SERVICE_STOP_S:.0f} s after {stopping.signal_name()} without "
            f"waiting longer for its Kafka clients to close (a broker that does not answer holds them); nothing is "
            f"lost: the log is the truth, and the shards are crash-safe"
        ),
    )


def _use_log_secret(path: str | None) -> None:
    """Find the log secret once, before anything starts; the processes this one starts
    read the same file."""
    from ordo.log.secret import SECRET_FILE_ENV, forget_key, log_key

    if path:
        os.environ[SECRET_FILE_ENV] = os.path.abspath(path)
        forget_key()
    log_key()


def cmd_broker(args) -> int:
    from ordo.broker.local import run_broker_foreground

    data_dir = None if (args.engine or os.environ.get("ORDO_BROKER_ENGINE")) == "tansu" else args.data_dir
    return run_broker_foreground(args.port, args.engine, args.nodes, data_dir)


def cmd_run(args) -> int:
    from ordo.services import serve_all

    return serve_all(
        args.bootstrap_servers,
        args.namespace,
        args.data_dir,
        args.scheduler,
        args.partitions,
        args.request_partitions or args.sequencers,
        _sequencer_config(args),
        args.quiet,
        _placement(args),
        _checkpointing(args),
        args.log_replication,
        metrics_port=args.metrics_port,
    )


def cmd_sequence(args) -> int:
    from ordo.sequencer.lane_owner import EXIT_ANOTHER_ENGINE, LaneTaken, Superseded
    from ordo.log.versions import EXIT_UPGRADED, UpgradedAway
    from ordo.services import die_with_parent, say_left_for, send_heartbeats, serve_sequencer

    die_with_parent()  # when an engine started this sequencer, it goes when the engine goes
    send_heartbeats()  # and the engine knows it is alive
    try:
        return serve_sequencer(
            args.bootstrap_servers, args.namespace, _sequencer_config(args), procedure_specs(args), args.quiet
        )
    except (LaneTaken, Superseded) as exc:
        print(f"ordo sequence: {exc}", file=sys.stderr, flush=True)
        return EXIT_ANOTHER_ENGINE
    except UpgradedAway as exc:
        print(f"ordo sequence: {exc}", file=sys.stderr, flush=True)
        say_left_for(exc.version)
        return EXIT_UPGRADED


def cmd_execute(args) -> int:
    from ordo.services import serve_engine

    return serve_engine(
        args.bootstrap_servers,
        args.namespace,
        args.data_dir,
        args.scheduler,
        args.partitions,
        args.quiet,
        _placement(args),
        _checkpointing(args),
        args.metrics_port,
    )


def cmd_recover(args) -> int:
    from ordo.recover import recover_across_versions

    options = _checkpointing(args)
    mode = options.pop("restore")
    placement = _placement(args)
    if placement["runtime"] == "auto":  # RECOVER_AUTO
        placement["runtime"] = "ray" if placement["ray_address"] or placement["cores"] else "local"
    versions = [placement.pop("procedure_modules"), *(_version_specs(text) for text in args.app_version)]
    recover_across_versions(
        versions,
        args.bootstrap_servers,
        args.namespace,
        args.data_dir,
        args.scheduler,
        args.partitions,
        mode,
        args.idle,
        args.checkpoint,
        args.quiet,
        kept_code=args.kept_code,
        publish=args.publish,
        **options,
        **placement,
    )
    return 0


def _version_specs(text: str) -> tuple[str, ...]:
    specs = tuple(part.strip() for part in text.split(",") if part.strip())
    if not specs:
        raise ValueError("--app-version takes MODULE:APP (or a comma-separated list of them and modules)")
    return specs


def cmd_upgrade(args) -> int:
    from ordo.procedures.fingerprint import short
    from ordo.procedures.loading import load_registry
    from ordo.log.versions import upgrade

    started = time.monotonic()
    specs = procedure_specs(args)
    done = upgrade(args.bootstrap_servers, args.namespace, load_registry(specs), specs=specs)
    if done is None:
        print(f"{args.namespace}.log already runs these procedures; nothing written", file=sys.stderr)
        return 0
    # A running engine reads its app from disk again at the upgrade record (procedures/reload.py).
    print(
        f"{args.namespace}.log moved from procedure set {done.before.name} to v{done.version} "
        f"({short(done.identity)}) at offset {done.offset}, in {time.monotonic() - started:.2f} s: the batches "
        f"after it run these procedures. A running `ordo run` whose app on disk is this code goes on with it "
        f"in place; one whose app on disk is other code applies every batch before the upgrade and stops there: "
        f"start it again with this code (docs/operations.md, 'Upgrading procedures')",
        file=sys.stderr,
    )
    return 0


def cmd_log(args) -> int:
    from ordo.log.skip import skip_record

    why, at = skip_record(args.bootstrap_servers, args.namespace, args.offset)
    print(
        f"the record at offset {args.offset} stopped the log's readers ({why}); the skip record at offset {at} "
        f"has every reader and replay pass over it",
        file=sys.stderr,
    )
    return 0


def _key_argument(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text  # a bare word: a string key


def cmd_get(args) -> int:
    from ordo.client import Client

    options = {
        "at_least": args.at_least,
        "consistency": "linearizable" if args.linearizable else "recent",
        "timeout": args.timeout,
    }
    with Client(args.bootstrap_servers, args.namespace) as client:
        client.check_namespace()
        if args.keys:
            found = client.get_many(args.table, [_key_argument(key) for key in args.keys], **options)
        else:
            prefix = None if args.prefix is None else _key_argument(args.prefix)
            if prefix is not None and type(prefix) is not list:
                raise ValueError(f"--prefix is a JSON list of key components, not {args.prefix}")
            after = None if args.after is None else _key_argument(args.after)
            found = client.scan(args.table, prefix, after=after, limit=args.limit, **options)
    for key, value in found.values.items():
        print(json.dumps({"table": args.table, "key": list(key) if type(key) is tuple else key, "value": value}))
    more = "; more follow (--after the last key)" if found.more else ""
    print(f"as of batch {found.batch}{more}", file=sys.stderr)
    return 0


def cmd_submit(args) -> int:
    from ordo.client import Client, new_request

    if args.proc:
        try:
            call_args = json.loads(args.args)
        except ValueError as exc:
            raise ValueError(f"--args is not valid JSON: {exc}") from None
        lines, requests = [1], [new_request(args.proc, call_args, args.id)]
    else:
        numbered = list(_read_lines(args.file))
        lines, requests = [n for n, _ in numbered], [line for _, line in numbered]
    with Client(args.bootstrap_servers, args.namespace) as client:
        client.check_namespace()  # a mistyped namespace: said within seconds, not after the producer's 30 s
        submission = client.submit_many(requests)
        sent = submission.sent
        for note in _submission_notes(submission, lines, args.proc is not None):
            print(note, file=sys.stderr)
        print(f"submitted {len(sent)} request(s)", file=sys.stderr)
        if not args.wait:
            return 1 if submission.failed else 0
        found = client.collect(sent, timeout=args.timeout)
    counts: dict[str, int] = {}
    for request_id in dict.fromkeys(sent):
        outcomes = found.get(request_id, [])
        for outcome in outcomes:
            counts[outcome.get("status", "?")] = counts.get(outcome.get("status", "?"), 0) + 1
            if len(sent) <= 20:
                print(json.dumps(outcome))
    missing = len(sent) - sum(counts.values())
    if missing:
        counts["no outcome yet"] = missing
    if submission.failed:
        counts["not sent"] = len(submission.failed)
    print(", ".join(f"{n} {status}" for status, n in sorted(counts.items())), file=sys.stderr)
    # A rejected request never ran (its error says why): like one not sent, a failure of the
    # submission. An aborted one ran and its procedure decided: a result, not a failure.
    return 0 if not missing and not submission.failed and not counts.get("rejected") else 1


def _submission_notes(submission, lines: list[int], single: bool) -> list[str]:
    """What the user must know about what was sent: requests the broker refused (not
    waited for), messages that are not requests with a usable id (their outcomes are
    named by position),
    and ids sent more than once (one outcome per copy)."""
    what = (lambda i: "the request") if single else (lambda i: f"line {lines[i]}")
    notes = [f"{what(i)}: not sent: {reason}" for i, reason in sorted(submission.failed.items())[:5]]
    if len(submission.failed) > 5:
        notes.append(f"and {len(submission.failed) - 5} more not sent")
    for i in submission.by_position[:5]:
        notes.append(f"{what(i)} is not a request with a usable 'id': the engine answers it as {submission.ids[i]}")
    if len(submission.by_position) > 5:
        notes.append(f"and {len(submission.by_position) - 5} more answered by position")
    for request_id, copies in sorted(submission.duplicates().items())[:5]:
        notes.append(
            f"id {request_id!r} sent {copies} times: each copy gets an outcome (a copy the sequencer "
            f"still remembers is rejected as a duplicate)"
        )
    return notes


def _read_lines(path: str):
    stream = sys.stdin.buffer if path == "-" else open(path, "rb")
    with stream:
        for number, line in enumerate(stream, 1):
            line = line.strip()
            if line:
                yield number, line  # sent as it is: the engine, not the client, judges each request


def cmd_gen(args) -> int:
    from ordo.procedures.workloads import ALL_WORKLOADS

    if args.list:
        from ordo.procedures.workloads import summary

        for name, module in ALL_WORKLOADS.items():
            print(f"{name}: {summary(module)}")
            for knob, (kind, default, text) in module.KNOBS.items():
                print(f"  {knob}={default}  ({kind.__name__}) {text}")
        return 0
    if args.workload is None:
        raise ValueError("name a workload (see `ordo gen --list`)")
    module = _workload(args.workload)
    out = sys.stdout
    for request in module.generate(args.count, args.seed, **parse_knobs(module, args.knob)):
        out.write(json.dumps(request, separators=(",", ":")) + "\n")
    return 0


def _workload(name: str):
    from ordo.procedures.workloads import ALL_WORKLOADS

    try:
        return ALL_WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload '{name}' (choose from {', '.join(ALL_WORKLOADS)})") from None


def parse_knobs(module, pairs: list[str]) -> dict:
    knobs = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or name not in module.KNOBS:
            raise ValueError(f"unknown knob '{pair}' (known: {', '.join(module.KNOBS)})")
        knobs[name] = module.KNOBS[name][0](value)
    return knobs


def one_run_knobs(module, args, command: str) -> dict:
    """The knobs of a bench that runs one configuration per rate: `--mp SHARE` is the knob
    mp (several shares are measured in turns by `ordo bench scale` only)."""
    knobs = parse_knobs(module, args.knob)
    if args.mp is not None:
        if "," in args.mp:
            raise ValueError(f"ordo bench {command} measures one --mp share per run; ordo bench scale takes several")
        if "mp" not in module.KNOBS:
            raise ValueError(f"ordo bench {command}: this workload has no multi-partition share (--mp)")
        knobs["mp"] = module.KNOBS["mp"][0](args.mp)
    return knobs


def cmd_dump(args) -> int:
    from ordo.procedures.streams import is_internal_table
    from ordo.state import records, table_names

    out = sys.stdout
    written = 0
    hidden = not args.internal and args.table is None  # the engine's own tables, unless asked for
    for record in records(args.data_dir, args.table):
        if hidden and is_internal_table(record["table"]):
            continue
        out.write(json.dumps(record, separators=(", ", ": ")) + "\n")
        written += 1
    if args.table is not None and not written:
        from ordo.procedures.registry import did_you_mean

        stored = table_names(args.data_dir)
        raise ValueError(
            f"no records of table {args.table!r} in {args.data_dir}{did_you_mean(args.table, stored)}; "
            f"tables with records there: {', '.join(stored) or 'none'}"
        )
    return 0


def cmd_digest(args) -> int:
    from ordo.state import digest
    from ordo.storage.digest import to_hex

    value, batch = digest(args.data_dir)
    print(to_hex(value))
    print(f"applied through batch {batch}", file=sys.stderr)
    return 0


def cmd_demo(args) -> int:
    from ordo.demo import run_demo

    return run_demo(args.workload, args.count, args.scheduler, args.partitions, args.data_dir)


def cmd_bench(args) -> int:
    if args.workload == "suite":
        from ordo.benchmarks.suite import run_suite

        return run_suite(args.quick, args.out)
    if args.workload == "alias":
        from ordo.benchmarks.dependent import run_alias

        run_alias(
            args.scheduler,
            int(args.partitions or 1),
            args.txns,
            args.seed,
            parse_knobs(_workload("alias"), args.knob),
            args.max_txns,
            args.json,
            None if args.rate is None else float(args.rate),
        )
        return 0
    if args.workload == "voter":
        from ordo.benchmarks.voter import run_voter

        run_voter(
            args.scheduler,
            int(args.partitions or 1),
            args.txns,
            args.seed,
            args.max_txns,
            args.json,
            args.baseline,
            parse_knobs(_workload("voter"), args.knob),
        )
        return 0
    if args.workload == "tpcc":
        from ordo.benchmarks.tpcc import run_tpcc

        knobs = parse_knobs(_workload("tpcc"), args.knob)
        run_tpcc(
            [int(n) for n in (args.partitions or "1").split(",")],
            args.scheduler,
            args.txns,
            args.seed,
            knobs,
            args.max_txns,
            args.json,
            args.baseline,
            not args.no_end_to_end,
        )
        return 0
    if args.workload == "sequence":
        from ordo.benchmarks.sequencing import run_sequencing

        if args.scaled is None:
            raise ValueError("ordo bench sequence needs a workload: ordo bench sequence micro --sequencers 1,2")
        run_sequencing(
            args.scaled,
            [int(s) for s in args.sequencers.split(",")],
            args.txns,
            args.seed,
            parse_knobs(_workload(args.scaled), args.knob),
            int(args.partitions or 1),
            args.max_txns,
            args.json,
            args.rounds,
        )
        return 0
    if args.workload == "latency":
        from ordo.benchmarks.latency import run_latency

        if args.scaled is None or args.rate is None:
            raise ValueError("ordo bench latency needs a workload and rates: ordo bench latency micro --rate 500,1000")
        run_latency(
            args.scaled,
            [float(r) for r in args.rate.split(",")],
            int(args.partitions or 1),
            args.scheduler,
            args.seconds,
            args.seed,
            one_run_knobs(_workload(args.scaled), args, "latency"),
            args.max_txns,
            args.runtime,
            args.json,
            _bench_epochs(args),
            args.round_txns,
            args.plot,
            [_read_json(path) for path in args.beside.split(",") if path],
            args.broker_warmup,
        )
        return 0
    if args.workload == "compression":
        from ordo.benchmarks.compression import run_compression

        if args.scaled is None:
            raise ValueError("ordo bench compression needs a workload: ordo bench compression sl")
        run_compression(
            args.scaled,
            args.txns,
            args.seed,
            parse_knobs(_workload(args.scaled), args.knob),
            max(args.rounds, 1),
            args.json,
        )
        return 0
    if args.workload == "reads":
        from ordo.benchmarks.reads import run_reads

        if args.seconds <= 0:
            raise ValueError("ordo bench reads needs --seconds above 0")
        runtime = "local" if args.runtime == "auto" else args.runtime
        run_reads(int(args.partitions or 2), runtime, args.scheduler, args.seconds, args.json)
        return 0
    if args.workload == "soak":
        from ordo.benchmarks.soak import run_soak

        if args.scaled is None or args.rate is None or "," in args.rate:
            raise ValueError(
                "ordo bench soak needs a workload and one rate: ordo bench soak micro --rate 500 --seconds 1800"
            )
        if not (float(args.rate) > 0 and args.seconds > 0 and args.every > 0):
            raise ValueError("ordo bench soak needs --rate, --seconds and --every above 0")
        if args.bounce_broker_every is not None and not (args.bounce_broker_every > 0 and args.broker_down >= 0):
            raise ValueError("ordo bench soak needs --bounce-broker-every above 0 and --broker-down of 0 or more")
        run_soak(
            args.scaled,
            float(args.rate),
            args.seconds,
            int(args.partitions or 1),
            args.scheduler,
            args.every,
            args.seed,
            one_run_knobs(_workload(args.scaled), args, "soak"),
            args.json,
            args.bounce_broker_every,
            args.broker_down,
        )
        return 0
    if args.workload == "scale":
        from ordo.benchmarks.scale import run_scale

        if args.scaled is None:
            raise ValueError("ordo bench scale needs a workload: ordo bench scale micro --partitions 1,2")
        knobs = parse_knobs(_workload(args.scaled), args.knob)
        shares = None
        if args.mp is not None:
            shares = [float(share) for share in args.mp.split(",")]
            if len(shares) == 1:
                knobs["mp"], shares = shares[0], None
        counts = [int(n) for n in (args.partitions or "1,2").split(",")]
        run_scale(
            args.scaled,
            counts,
            args.scheduler,
            args.txns,
            args.seed,
            knobs,
            args.max_txns,
            not args.no_end_to_end,
            args.json,
            args.rounds,
            shares,
            _bench_epochs(args),
        )
        return 0
    from ordo.benchmarks.configuration import run_bench

    module = _workload(args.workload)
    return run_bench(
        args.workload,
        args.scheduler,
        int(args.partitions or 1),
        args.txns,
        args.seed,
        one_run_knobs(module, args, args.workload),
        args.max_txns,
        args.json,
        args.baseline,
    )


def cmd_spark(args) -> int:
    from ordo.extras import require

    require("pyspark", "spark", f"ordo spark {args.spark_command}" if hasattr(args, "spark_command") else "ordo spark")
    return args.spark_handler(args)


COMMANDS = {
    "broker": cmd_broker,
    "run": cmd_run,
    "sequence": cmd_sequence,
    "execute": cmd_execute,
    "recover": cmd_recover,
    "log": cmd_log,
    "upgrade": cmd_upgrade,
    "submit": cmd_submit,
    "gen": cmd_gen,
    "dump": cmd_dump,
    "get": cmd_get,
    "digest": cmd_digest,
    "demo": cmd_demo,
    "bench": cmd_bench,
    "spark": lambda args: cmd_spark(args),
}

if __name__ == "__main__":
    sys.exit(main())
