"""A damaged shard is reported, never read around: `ordo dump` and `ordo digest` on a shard
whose SST file has bad bytes exit non-zero with one line naming the shard and what to do,
instead of printing part of the state as if it were all of it."""

from __future__ import annotations

import glob
import json
import os
import subprocess

from ordo.storage.layout import check_layout, shard_path
from ordo.storage.keys import encode_key
from ordo.storage.rocks import RocksShard
from ordo.storage.values import encode_value
from tests.helpers import ordo

KEYS = 20_000


def write_shards(data_dir: str) -> None:
    check_layout(data_dir, 2)
    for p in range(2):
        with RocksShard(shard_path(data_dir, p)) as shard:
            shard.apply_batch({encode_key("micro", k): encode_value(k * 7) for k in range(p, KEYS, 2)}, {"batch": 1})
            shard._db.flush()  # into an SST file, where a block checksum guards the bytes


def corrupt_an_sst(shard_dir: str) -> str:
    sst = max(glob.glob(os.path.join(shard_dir, "*.sst")), key=os.path.getsize)
    size = os.path.getsize(sst)
    with open(sst, "r+b") as f:
        f.seek(size // 2)
        f.write(b"\xa5" * 64)
    return sst


def cli(*args: str) -> subprocess.CompletedProcess:
    process = ordo(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def test_dump_and_digest_of_a_corrupt_shard_fail_with_one_clear_line(tmp_path):
    data_dir = str(tmp_path / "data")
    write_shards(data_dir)
    whole = cli("dump", "--data-dir", data_dir)
    assert whole.returncode == 0 and len(whole.stdout.splitlines()) == KEYS
    assert cli("digest", "--data-dir", data_dir).returncode == 0

    corrupt_an_sst(shard_path(data_dir, 1))
    for args in (("dump",), ("dump", "--table", "micro"), ("digest",)):
        done = cli(*args, "--data-dir", data_dir)
        assert done.returncode != 0, (args, done.stderr)
        [line] = done.stderr.strip().splitlines()
        assert line.startswith(f"ordo {args[0]}: shard 1 ({shard_path(data_dir, 1)}) is corrupt"), line
        assert "ordo recover --from-checkpoint" in line and "ordo recover --from-scratch" in line, line
        assert "Traceback" not in done.stderr
        if args[0] == "dump":
            assert len(done.stdout.splitlines()) < KEYS
        else:
            assert done.stdout == ""


def test_intact_shards_dump_as_before(tmp_path):
    data_dir = str(tmp_path / "data")
    write_shards(data_dir)
    done = cli("dump", "--data-dir", data_dir, "--table", "no_such_table")
    assert done.returncode == 2 and done.stdout == "" and "tables with records there: micro" in done.stderr
    records = [json.loads(line) for line in cli("dump", "--data-dir", data_dir).stdout.splitlines()]
    assert records[:2] == [{"table": "micro", "key": 0, "value": 0}, {"table": "micro", "key": 1, "value": 7}]
