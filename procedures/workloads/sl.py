"""Streaming Ledger (TStream, after Flink's Streaming Ledger): deposits and transfers over
accounts and assets. A transfer's credits depend on its debit check: the hard case for
operation chains."""

from __future__ import annotations

import random
from typing import Iterator

from ordo.procedures.args import Int
from ordo.procedures.contract import Procedure, Table
from ordo.procedures.operations import READ_MODIFY, Condition, Operations, adder
from ordo.procedures.workloads.sampling import Zipf, request

RECORDS = 10_000
AMOUNT = Int(0, 10**12)
TABLES = [Table("account"), Table("asset")]


def _deposit_keys(args):
    keys = [("account", args["account"]), ("asset", args["asset"])]
    return keys, keys


def _deposit(ctx, args):
    ctx.write("account", args["account"], ctx.read("account", args["account"]) + args["account_amount"])
    ctx.write("asset", args["asset"], ctx.read("asset", args["asset"]) + args["asset_amount"])
    return None


def _transfer_keys(args):
    keys = [
        ("account", args["src_account"]),
        ("account", args["dst_account"]),
        ("asset", args["src_asset"]),
        ("asset", args["dst_asset"]),
    ]
    return keys, keys


def _transfer(ctx, args):
    account_amount, asset_amount = args["account_amount"], args["asset_amount"]
    if ctx.read("account", args["src_account"]) < account_amount or ctx.read("asset", args["src_asset"]) < asset_amount:
        ctx.abort("insufficient funds")
    for table, src, dst, amount in (
        ("account", args["src_account"], args["dst_account"], account_amount),
        ("asset", args["src_asset"], args["dst_asset"], asset_amount),
    ):
        ctx.write(table, src, ctx.read(table, src) - amount)
        ctx.write(table, dst, ctx.read(table, dst) + amount)
    return None


def _deposit_ops(args):
    return Operations(
        [
            READ_MODIFY("account", args["account"], adder(args["account_amount"])),
            READ_MODIFY("asset", args["asset"], adder(args["asset_amount"])),
        ]
    )


def _transfer_ops(args):
    account_amount, asset_amount = args["account_amount"], args["asset_amount"]

    def enough(account: int, asset: int) -> bool:
        return account >= account_amount and asset >= asset_amount

    # One guard for all four operations: a failed check leaves every chain untouched.
    funds = Condition([("account", args["src_account"]), ("asset", args["src_asset"])], enough, "insufficient funds")
    return Operations(
        [
            READ_MODIFY("account", args["src_account"], adder(-account_amount), condition=funds),
            READ_MODIFY("account", args["dst_account"], adder(account_amount), condition=funds),
            READ_MODIFY("asset", args["src_asset"], adder(-asset_amount), condition=funds),
            READ_MODIFY("asset", args["dst_asset"], adder(asset_amount), condition=funds),
        ]
    )


sl_deposit = Procedure(
    "sl_deposit",
    {"account": Int(0), "asset": Int(0), "account_amount": AMOUNT, "asset_amount": AMOUNT},
    _deposit_keys,
    _deposit,
    operations=_deposit_ops,
)
sl_transfer = Procedure(
    "sl_transfer",
    {
        "src_account": Int(0),
        "dst_account": Int(0),
        "src_asset": Int(0),
        "dst_asset": Int(0),
        "account_amount": AMOUNT,
        "asset_amount": AMOUNT,
    },
    _transfer_keys,
    _transfer,
    operations=_transfer_ops,
)

PROCEDURES = [sl_deposit, sl_transfer]

KNOBS = {
    "records": (int, RECORDS, "accounts and assets"),
    "theta": (float, 0.6, "Zipf skew of key choice"),
    "transfer": (float, 0.5, "share of transfers (the rest are deposits)"),
}


def generate(
    count: int, seed: int = 0, records: int = RECORDS, theta: float = 0.6, transfer: float = 0.5
) -> Iterator[dict]:
    rng = random.Random(seed)
    zipf = Zipf(records, theta)
    for i in range(count):
        if rng.random() < transfer:
            src_account, dst_account = zipf.distinct(rng, 2)
            src_asset, dst_asset = zipf.distinct(rng, 2)
            args = {
                "src_account": src_account,
                "dst_account": dst_account,
                "src_asset": src_asset,
                "dst_asset": dst_asset,
                "account_amount": rng.randint(1, 50),
                "asset_amount": rng.randint(1, 50),
            }
            yield request("sl", seed, i, "sl_transfer", args)
        else:
            args = {
                "account": zipf.sample(rng),
                "asset": zipf.sample(rng),
                "account_amount": rng.randint(1, 100),
                "asset_amount": rng.randint(1, 100),
            }
            yield request("sl", seed, i, "sl_deposit", args)
