"""Online Bidding (TStream): items with an asking price and a quantity on offer.

Table `item`: key -> {"price": int, "qty": int}; a never-written item reads as
{"price": 100, "qty": 1000}.
- ob_bid {item, price, qty}: if price >= the item's price and the item has at least qty,
  take qty and return what is left; otherwise abort ("bid rejected").
- ob_alter {items, prices}: set each item's price (a repeated item ends at its last price).
- ob_top {items, qtys}: add each quantity to its item.
Mix bid : alter : top = 6 : 1 : 1.
"""

from __future__ import annotations

import random
from typing import Iterator

from ordo.procedures.args import Int, List
from ordo.procedures.contract import Procedure, Table
from ordo.procedures.operations import READ_MODIFY, Condition, Operations
from ordo.procedures.workloads.sampling import Zipf, request

RECORDS = 10_000
ITEMS_PER_TXN = 20
DEFAULT = {"price": 100, "qty": 1000}
TABLES = [Table("item", default=DEFAULT)]
# Bounded so that no sequence of requests a benchmark can send overflows a stored int64.
PRICE = Int(0, 10**9)
QTY = Int(0, 10**9)
REJECTED = "bid rejected"


def _bid_keys(args):
    keys = [("item", args["item"])]
    return keys, keys


def _bid(ctx, args):
    item = ctx.read("item", args["item"])
    if args["price"] < item["price"] or item["qty"] < args["qty"]:
        ctx.abort(REJECTED)
    item["qty"] -= args["qty"]
    ctx.write("item", args["item"], item)
    return item["qty"]


def _bid_ops(args):
    price, qty = args["price"], args["qty"]

    def acceptable(item: dict) -> bool:
        return price >= item["price"] and item["qty"] >= qty

    def take(item: dict) -> dict:
        return {"price": item["price"], "qty": item["qty"] - qty}

    accept = Condition([("item", args["item"])], acceptable, REJECTED)
    return Operations([READ_MODIFY("item", args["item"], take, condition=accept)], _left)


def _left(outputs: list) -> int:
    return outputs[0]["qty"]


def _pairs(args, values: str):
    items, numbers = args["items"], args[values]
    if len(items) != len(numbers):
        raise ValueError(f"'items' and '{values}' differ in length")
    return zip(items, numbers)


def _alter_keys(args):
    keys = [("item", item) for item, _ in _pairs(args, "prices")]
    return keys, keys


def _alter(ctx, args):
    for key, price in _pairs(args, "prices"):
        item = ctx.read("item", key)
        item["price"] = price
        ctx.write("item", key, item)
    return None


def _price_setter(price: int):
    def set_price(item: dict) -> dict:
        return {"price": price, "qty": item["qty"]}

    return set_price


def _alter_ops(args):
    return Operations([READ_MODIFY("item", key, _price_setter(price)) for key, price in _pairs(args, "prices")])


def _top_keys(args):
    keys = [("item", item) for item, _ in _pairs(args, "qtys")]
    return keys, keys


def _top(ctx, args):
    for key, qty in _pairs(args, "qtys"):
        item = ctx.read("item", key)
        item["qty"] += qty
        ctx.write("item", key, item)
    return None


def _topper(qty: int):
    def top_up(item: dict) -> dict:
        return {"price": item["price"], "qty": item["qty"] + qty}

    return top_up


def _top_ops(args):
    return Operations([READ_MODIFY("item", key, _topper(qty)) for key, qty in _pairs(args, "qtys")])


_ITEMS = List(Int(0), min_len=1, max_len=64)

ob_bid = Procedure("ob_bid", {"item": Int(0), "price": PRICE, "qty": QTY}, _bid_keys, _bid, operations=_bid_ops)
ob_alter = Procedure(
    "ob_alter",
    {"items": _ITEMS, "prices": List(PRICE, min_len=1, max_len=64)},
    _alter_keys,
    _alter,
    operations=_alter_ops,
)
ob_top = Procedure(
    "ob_top", {"items": _ITEMS, "qtys": List(QTY, min_len=1, max_len=64)}, _top_keys, _top, operations=_top_ops
)

PROCEDURES = [ob_bid, ob_alter, ob_top]

KNOBS = {
    "records": (int, RECORDS, "items"),
    "theta": (float, 0.6, "Zipf skew of item choice"),
}


def generate(count: int, seed: int = 0, records: int = RECORDS, theta: float = 0.6) -> Iterator[dict]:
    if records < ITEMS_PER_TXN:
        raise ValueError(f"need at least {ITEMS_PER_TXN} items")
    rng = random.Random(seed)
    zipf = Zipf(records, theta)
    for i in range(count):
        kind = rng.randrange(8)  # bid : alter : top = 6 : 1 : 1
        if kind < 6:
            args = {"item": zipf.sample(rng), "price": rng.randint(80, 130), "qty": rng.randint(1, 20)}
            yield request("ob", seed, i, "ob_bid", args)
        elif kind == 6:
            items = zipf.distinct(rng, ITEMS_PER_TXN)
            args = {"items": items, "prices": [rng.randint(80, 120) for _ in items]}
            yield request("ob", seed, i, "ob_alter", args)
        else:
            items = zipf.distinct(rng, ITEMS_PER_TXN)
            args = {"items": items, "qtys": [rng.randint(1, 100) for _ in items]}
            yield request("ob", seed, i, "ob_top", args)
