"""Small sample datasets for the border producer, made by the workload generators.

    python -m spark_jobs.samples [--out spark_jobs/samples] [--count 300]

writes, for the `sl` and `micro` workloads, the same requests twice:
  <w>.csv    columns id, proc, args (args: a JSON object as text)
  <w>.jsonl  one {"id", "proc", "args"} object per line (args: a JSON object)
plus
  sl_deposits_wide.csv  sl deposits with one column per argument (for --args-cols)
  bad_rows.csv          a few good and a few bad rows (missing proc, args that are not
                        JSON, unknown procedure, missing args, wrong argument type)
Everything is seeded: running it again writes the same files (checked in under samples/).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
from collections.abc import Iterable

from ordo.procedures.workloads import micro, sl

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLES_DIR = os.path.join(HERE, "samples")

# Small key spaces, so that a few hundred requests build up a visible state.
SL_KNOBS = {"records": 50, "theta": 0.6, "transfer": 0.4}
MICRO_KNOBS = {"keys": 200, "hot": 10}

# (id, proc, args) — args is the exact text of the CSV cell (None: empty cell).
BAD_ROWS = [
    ("good-1", "sl_deposit", '{"account": 1, "asset": 1, "account_amount": 10, "asset_amount": 10}'),
    ("no-proc", None, '{"account": 1, "asset": 1, "account_amount": 10, "asset_amount": 10}'),
    ("bad-args", "sl_deposit", '{"account": 1, "asset": '),
    ("unknown-proc", "sl_withdraw", '{"account": 1}'),
    ("no-args", "sl_deposit", None),
    ("wrong-type", "sl_deposit", '{"account": "one", "asset": 1, "account_amount": 10, "asset_amount": 10}'),
    ("good-2", "sl_deposit", '{"account": 2, "asset": 2, "account_amount": 5, "asset_amount": 5}'),
]


def sl_requests(count: int, seed: int = 7) -> list[dict]:
    return list(sl.generate(count, seed, **SL_KNOBS))


def micro_requests(count: int, seed: int = 7) -> list[dict]:
    return list(micro.generate(count, seed, **MICRO_KNOBS))


def _json(value) -> str:
    return json.dumps(value, separators=(",", ":"))


def write_csv(path: str, requests: Iterable[dict]) -> None:
    with open(path, "w", newline="") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(["id", "proc", "args"])
        for r in requests:
            out.writerow([r["id"], r["proc"], _json(r["args"])])


def write_jsonl(path: str, requests: Iterable[dict]) -> None:
    with open(path, "w") as f:
        f.writelines(_json({"id": r["id"], "proc": r["proc"], "args": r["args"]}) + "\n" for r in requests)


def write_wide_csv(path: str, deposits: Iterable[dict]) -> None:
    columns = ["account", "asset", "account_amount", "asset_amount"]
    with open(path, "w", newline="") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(["id", "proc", *columns])
        for r in deposits:
            out.writerow([r["id"], r["proc"], *(r["args"][c] for c in columns)])


def write_bad_rows(path: str) -> None:
    with open(path, "w", newline="") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(["id", "proc", "args"])
        for row in BAD_ROWS:
            out.writerow(["" if v is None else v for v in row])


def write_samples(directory: str = SAMPLES_DIR, count: int = 300) -> list[str]:
    """Write every sample file into `directory`; returns their paths."""
    os.makedirs(directory, exist_ok=True)
    written = []

    def path(name: str) -> str:
        written.append(os.path.join(directory, name))
        return written[-1]

    sl_rows, micro_rows = sl_requests(count), micro_requests(count)
    write_csv(path("sl.csv"), sl_rows)
    write_jsonl(path("sl.jsonl"), sl_rows)
    write_csv(path("micro.csv"), micro_rows)
    write_jsonl(path("micro.jsonl"), micro_rows)
    deposits = [r for r in sl.generate(count, 8, **{**SL_KNOBS, "transfer": 0.0})][: max(1, count // 3)]
    write_wide_csv(path("sl_deposits_wide.csv"), deposits)
    write_bad_rows(path("bad_rows.csv"))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=SAMPLES_DIR, help="directory (default: spark_jobs/samples)")
    parser.add_argument("--count", type=int, default=300, help="requests per workload (default 300)")
    args = parser.parse_args(argv)
    for written in write_samples(args.out, args.count):
        print(written)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
