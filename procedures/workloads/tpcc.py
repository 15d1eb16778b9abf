"""TPC-C (5.11): its schema partitioned by warehouse, the initial population loaded through
the log, and its five transactions: NewOrder, Payment (by customer id, or 60 % by last
name through a secondary index), OrderStatus, Delivery and StockLevel.

Keys are composite: `district` is keyed [w_id, d_id], `order_line` [w_id, d_id, o_id,
ol_number], and so on; every table but `item` is partitioned by the warehouse id, so only
remote stock lines and remote customers make a transaction multi-partition. Amounts are
integers in cents, tax and discount rates integers in 1/10000.

Where the data decides which rows a transaction touches:
- NewOrder writes its order under the district's order ranges (docs/keys.md): the order
  id comes from `d_next_o_id`, which the transaction itself increments, so its rows cannot
  be named in advance, and predicting them (OLLP) would restart every concurrent NewOrder
  of a district.
- Payment and OrderStatus by last name read the secondary index `customer_name`
  [w_id, d_id, c_last] -> customer ids sorted by c_first, through a reconnaissance
  (docs/ollp.md): the index never changes after the load, so they restart only if they
  were sequenced before their district was loaded.
- Delivery and StockLevel read within declared ranges of one warehouse: Delivery the
  oldest new order of each district (`new_order_head` [w_id, d_id] keeps its id, as the
  minimum NO_O_ID of the district), its lines and its customer; StockLevel the lines of
  the district's last 20 orders and their stock.

Two engine-side tables serve as indexes: `customer_name` (above) and `customer_last_order`
[w_id, d_id, c_id] -> the id of the customer's newest order (OrderStatus).

The item table is read by nobody after the load: as Calvin replicates `item` on every
partition, each stock row carries a copy of its item's price, name and data (i_price,
i_name, i_data), so NewOrder reads only its warehouse's stock.

The population is generated inside RUN (and ANALYZE, for the keys it needs) from random
generators seeded by the load request's arguments alone, so a replay rebuilds it exactly.
"""

from __future__ import annotations

import random
import string
from functools import lru_cache
from typing import Iterator

from ordo.procedures.args import Int, List, Str
from ordo.procedures.contract import Prefix, Procedure, Table
from ordo.procedures.ollp import OLLP_FIELD
from ordo.procedures.workloads.ob import DEFAULT as OB_ITEM_DEFAULT

DISTRICTS = 10
WAREHOUSES, CUSTOMERS, ITEMS = 1, 3000, 100_000
ITEM_CHUNK = 1000  # items or stock rows per load request
MAX_W = 10_000
NURAND_C = {"c_last": 173, "c_id": 259, "ol_i_id": 7911}  # the run-time constants C of NURand

TABLES = [
    Table("warehouse", partition_by=0, default=None),
    Table("district", partition_by=0, default=None),
    Table("customer", partition_by=0, range_by=2, default=None),
    Table("customer_name", partition_by=0, default=None),
    Table("customer_last_order", partition_by=0, default=None),
    Table("history", partition_by=0, default=None),
    Table("orders", partition_by=0, range_by=2, default=None),
    Table("new_order", partition_by=0, range_by=2, default=None),
    Table("new_order_head", partition_by=0, default=None),
    Table("order_line", partition_by=0, range_by=2, default=None),
    Table("stock", partition_by=0, range_by=1, default=None),
    # The name is shared with ob's table of items (same settings; TPC-C's keys are tuples,
    # ob's integers, so they never meet). TPC-C reads no item row after the load.
    Table("item", default=OB_ITEM_DEFAULT),
]

_SYLLABLES = ("BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING")
_ALNUM = string.ascii_letters + string.digits


def last_name(number: int) -> str:
    """TPC-C 4.3.2.3: three syllables from the digits of a number in 0..999."""
    return _SYLLABLES[number // 100] + _SYLLABLES[number // 10 % 10] + _SYLLABLES[number % 10]


def name_count(customers: int) -> int:
    """How many distinct last names a district's customers draw from: 1000 at TPC-C's
    3000 customers, a third of them when scaled down, so names still repeat."""
    return max(1, min(1000, customers // 3))


def nurand_a(n: int, spec_a: int, spec_n: int) -> int:
    """NURand's A, scaled with the range: TPC-C's value at its size, else the power of two
    (minus one) in the same proportion."""
    return max(1, (1 << max(1, (n * (spec_a + 1) // spec_n).bit_length() - 1)) - 1)


def nurand(rng: random.Random, a: int, x: int, y: int, c: int) -> int:
    return (((rng.randint(0, a) | rng.randint(x, y)) + c) % (y - x + 1)) + x


def _text(rng: random.Random, low: int, high: int) -> str:
    return "".join(rng.choices(_ALNUM, k=rng.randint(low, high)))


def _data(rng: random.Random) -> str:
    """i_data and s_data: 26..50 characters, 10 % holding "ORIGINAL"."""
    text = _text(rng, 26, 50)
    if rng.random() < 0.1:
        at = rng.randint(0, len(text) - 8)
        text = text[:at] + "ORIGINAL" + text[at + 8 :]
    return text


@lru_cache(maxsize=1 << 16)
def item_row(i_id: int) -> dict:
    """The item's columns, a function of its id alone (the stock rows copy them)."""
    rng = random.Random(f"tpcc/item/{i_id}")
    return {
        "i_im_id": rng.randint(1, 10_000),
        "i_name": _text(rng, 14, 24),
        "i_price": rng.randint(100, 10_000),
        "i_data": _data(rng),
    }


def _stock_row(w: int, i_id: int) -> dict:
    rng = random.Random(f"tpcc/stock/{w}/{i_id}")
    item = item_row(i_id)
    row = {
        "s_quantity": rng.randint(10, 100),
        "s_ytd": 0,
        "s_order_cnt": 0,
        "s_remote_cnt": 0,
        "s_data": _data(rng),
        "i_price": item["i_price"],
        "i_name": item["i_name"],
        "i_data": item["i_data"],
    }
    for d in range(1, DISTRICTS + 1):
        row[f"s_dist_{d:02d}"] = _text(rng, 24, 24)
    return row


@lru_cache(maxsize=64)
def district_names(w: int, d: int, customers: int) -> tuple[str, ...]:
    """The last names of a district's customers 1..C (index c - 1): TPC-C 4.3.2.3, the first
    ones in order, the rest by NURand. A stream of its own, so ANALYZE of a load request
    gets the index keys without generating the district."""
    rng = random.Random(f"tpcc/names/{w}/{d}/{customers}")
    names = name_count(customers)
    a = nurand_a(names, 255, 1000)
    return tuple(
        last_name(c - 1 if c <= names else nurand(rng, a, 0, names - 1, NURAND_C["c_last"]))
        for c in range(1, customers + 1)
    )


@lru_cache(maxsize=2)
def district_population(w: int, d: int, customers: int, items: int) -> dict:
    """Customers, their orders, order lines and history rows of one district (TPC-C
    4.3.3.1, scaled): customers 1..C, one order each (a random permutation), the last 30 %
    of them undelivered (new orders)."""
    rng = random.Random(f"tpcc/district/{w}/{d}/{customers}/{items}")
    last_names = district_names(w, d, customers)
    out_customers = {}
    by_name: dict[str, list] = {}
    for c in range(1, customers + 1):
        first = _text(rng, 8, 16)
        row = {
            "c_first": first,
            "c_middle": "OE",
            "c_last": last_names[c - 1],
            "c_street_1": _text(rng, 10, 20),
            "c_city": _text(rng, 10, 20),
            "c_state": _text(rng, 2, 2),
            "c_zip": f"{rng.randint(0, 9999):04d}11111",
            "c_phone": "".join(rng.choices(string.digits, k=16)),
            "c_credit": "BC" if rng.random() < 0.1 else "GC",
            "c_credit_lim": 5_000_000,
            "c_discount": rng.randint(0, 5000),
            "c_balance": -1000,
            "c_ytd_payment": 1000,
            "c_payment_cnt": 1,
            "c_delivery_cnt": 0,
            "c_data": _text(rng, 300, 500),
        }
        out_customers[c] = row
        by_name.setdefault(row["c_last"], []).append((first, c))
    index = {name: [c for _, c in sorted(found)] for name, found in by_name.items()}
    owners = list(range(1, customers + 1))
    rng.shuffle(owners)
    first_new = customers - (customers * 3) // 10 + 1  # TPC-C: orders 2101..3000 of 3000
    orders, lines = {}, {}
    for o in range(1, customers + 1):
        count = rng.randint(5, 15)
        delivered = o < first_new
        orders[o] = {
            "o_c_id": owners[o - 1],
            "o_carrier_id": rng.randint(1, 10) if delivered else None,
            "o_ol_cnt": count,
            "o_all_local": 1,
        }
        for n in range(1, count + 1):
            lines[(o, n)] = {
                "ol_i_id": rng.randint(1, items),
                "ol_supply_w_id": w,
                "ol_quantity": 5,
                "ol_amount": 0 if delivered else rng.randint(1, 999_999),
                "ol_dist_info": _text(rng, 24, 24),
                "delivered": delivered,
            }
    district = {
        "d_name": _text(rng, 6, 10),
        "d_street_1": _text(rng, 10, 20),
        "d_city": _text(rng, 10, 20),
        "d_state": _text(rng, 2, 2),
        "d_zip": f"{rng.randint(0, 9999):04d}11111",
        "d_tax": rng.randint(0, 2000),
        "d_ytd": customers * 1000,
        "d_next_o_id": customers + 1,
    }
    return {
        "customers": out_customers,
        "index": index,
        "orders": orders,
        "lines": lines,
        "first_new": first_new,
        "district": district,
    }


@lru_cache(maxsize=1024)
def district_index(w: int, d: int, customers: int, items: int) -> dict[str, list[int]]:
    """The `customer_name` entries the load writes for a district (a client's reconnaissance)."""
    return district_population(w, d, customers, items)["index"]


# --- load requests ------------------------------------------------------------------------


def _item_keys(args):
    last = min(args["first"] + args["count"], args["items"] + 1)
    return (), [("item", (i,)) for i in range(args["first"], last)]


def _load_items(ctx, args):
    for _, key in _item_keys(args)[1]:
        ctx.write("item", key, item_row(key[0]))


def _stock_keys(args):
    last = min(args["first"] + args["count"], args["items"] + 1)
    return (), [("stock", (args["w"], i)) for i in range(args["first"], last)]


def _load_stock(ctx, args):
    for _, key in _stock_keys(args)[1]:
        ctx.write("stock", key, _stock_row(*key))


def _warehouse_keys(args):
    return (), [("warehouse", (args["w"],))]


def _load_warehouse(ctx, args):
    rng = random.Random(f"tpcc/warehouse/{args['w']}")
    ctx.write(
        "warehouse",
        (args["w"],),
        {
            "w_name": _text(rng, 6, 10),
            "w_street_1": _text(rng, 10, 20),
            "w_city": _text(rng, 10, 20),
            "w_state": _text(rng, 2, 2),
            "w_zip": f"{rng.randint(0, 9999):04d}11111",
            "w_tax": rng.randint(0, 2000),
            "w_ytd": DISTRICTS * args["customers"] * 1000,
        },
    )


def _district_keys(args):
    w, d, customers = args["w"], args["d"], args["customers"]
    writes = [
        ("district", (w, d)),
        ("new_order_head", (w, d)),
        Prefix("customer", (w, d)),
        Prefix("orders", (w, d)),
        Prefix("new_order", (w, d)),
        Prefix("order_line", (w, d)),
    ]
    writes += [("customer_name", (w, d, name)) for name in dict.fromkeys(district_names(w, d, customers))]
    writes += [("customer_last_order", (w, d, c)) for c in range(1, customers + 1)]
    writes += [("history", (w, d, f"load-{c}")) for c in range(1, customers + 1)]
    return (), writes


def _load_district(ctx, args):
    w, d = args["w"], args["d"]
    population = district_population(w, d, args["customers"], args["items"])
    now = ctx.now
    ctx.write("district", (w, d), population["district"])
    ctx.write("new_order_head", (w, d), population["first_new"])
    for c, row in population["customers"].items():
        ctx.write("customer", (w, d, c), {**row, "c_since": now})
        ctx.write(
            "history",
            (w, d, f"load-{c}"),
            {
                "h_c_id": c,
                "h_c_d_id": d,
                "h_c_w_id": w,
                "h_d_id": d,
                "h_w_id": w,
                "h_date": now,
                "h_amount": 1000,
                "h_data": "initial payment",
            },
        )
    for name, ids in population["index"].items():
        ctx.write("customer_name", (w, d, name), ids)
    for o, row in population["orders"].items():
        ctx.write("orders", (w, d, o), {**row, "o_entry_d": now})
        ctx.write("customer_last_order", (w, d, row["o_c_id"]), o)
        if o >= population["first_new"]:
            ctx.write("new_order", (w, d, o), {})
    for (o, n), line in population["lines"].items():
        row = {k: v for k, v in line.items() if k != "delivered"}
        row["ol_delivery_d"] = now if line["delivered"] else None
        ctx.write("order_line", (w, d, o, n), row)


# --- NewOrder (2.4) ---------------------------------------------------------------------------


def _lines(args) -> list[tuple[int, int, int]]:
    items, supply, quantity = args["items"], args["supply"], args["quantity"]
    if not len(items) == len(supply) == len(quantity):
        raise ValueError("items, supply and quantity must have the same length")
    return list(zip(items, supply, quantity))


def _new_order_keys(args):
    w, d = args["w"], args["d"]
    stock = [("stock", (sw, i)) for i, sw, _ in _lines(args)]
    reads = [("warehouse", (w,)), ("district", (w, d)), ("customer", (w, d, args["c"]))] + stock
    writes = [
        ("district", (w, d)),
        ("customer_last_order", (w, d, args["c"])),
        Prefix("orders", (w, d)),
        Prefix("new_order", (w, d)),
        Prefix("order_line", (w, d)),
    ] + stock
    return reads, writes


def _new_order(ctx, args):
    w, d, c = args["w"], args["d"], args["c"]
    lines = _lines(args)
    warehouse, district = ctx.read("warehouse", (w,)), ctx.read("district", (w, d))
    customer = ctx.read("customer", (w, d, c))
    if warehouse is None or district is None or customer is None:
        ctx.abort("no such warehouse, district or customer")
    o_id = district["d_next_o_id"]
    ctx.write("district", (w, d), {**district, "d_next_o_id": o_id + 1})
    total = 0
    for n, (i, sw, quantity) in enumerate(lines, start=1):
        stock = ctx.read("stock", (sw, i))
        if stock is None:  # TPC-C's 1 % rollback: an abort discards every write before it
            ctx.abort("Item number is not valid")
        left = stock["s_quantity"] - quantity
        stock = {
            **stock,
            "s_quantity": left if left >= 10 else left + 91,
            "s_ytd": stock["s_ytd"] + quantity,
            "s_order_cnt": stock["s_order_cnt"] + 1,
            "s_remote_cnt": stock["s_remote_cnt"] + (1 if sw != w else 0),
        }
        ctx.write("stock", (sw, i), stock)
        amount = quantity * stock["i_price"]
        total += amount
        ctx.write(
            "order_line",
            (w, d, o_id, n),
            {
                "ol_i_id": i,
                "ol_supply_w_id": sw,
                "ol_delivery_d": None,
                "ol_quantity": quantity,
                "ol_amount": amount,
                "ol_dist_info": stock[f"s_dist_{d:02d}"],
            },
        )
    ctx.write(
        "orders",
        (w, d, o_id),
        {
            "o_c_id": c,
            "o_entry_d": ctx.now,
            "o_carrier_id": None,
            "o_ol_cnt": len(lines),
            "o_all_local": int(all(sw == w for _, sw, _ in lines)),
        },
    )
    ctx.write("new_order", (w, d, o_id), {})
    ctx.write("customer_last_order", (w, d, c), o_id)
    rate = (10_000 - customer["c_discount"]) * (10_000 + warehouse["w_tax"] + district["d_tax"])
    return {"o_id": o_id, "total": total * rate // 100_000_000}


# --- Payment (2.5) ----------------------------------------------------------------------------


def _by_name(args) -> tuple:
    return ("customer_name", (args["c_w"], args["c_d"], args["c_last"]))


def _chosen(assumed: dict, key: tuple):
    """TPC-C 2.5.2.2: of the customers with that last name, sorted by c_first, the one at
    position ceil(n / 2)."""
    ids = assumed.get(key)
    if type(ids) is not list or not ids:
        return None
    return ids[(len(ids) + 1) // 2 - 1]


def _payment_sets(args, c):
    w, d = args["w"], args["d"]
    home = [("warehouse", (w,)), ("district", (w, d))]
    customer = [] if c is None else [("customer", (args["c_w"], args["c_d"], c))]
    return home + customer, home + customer + [("history", (w, d, args["h_id"]))]


def _payment_keys(args):
    return _payment_sets(args, args["c"])


def _payment_name_recon(args):
    return [_by_name(args)]


def _payment_name_keys(args, assumed):
    return _payment_sets(args, _chosen(assumed, _by_name(args)))


def _pay(ctx, args, c):
    w, d, c_w, c_d, amount = args["w"], args["d"], args["c_w"], args["c_d"], args["amount"]
    warehouse, district = ctx.read("warehouse", (w,)), ctx.read("district", (w, d))
    customer = None if c is None else ctx.read("customer", (c_w, c_d, c))
    if warehouse is None or district is None or customer is None:
        ctx.abort("no such warehouse, district or customer")
    ctx.write("warehouse", (w,), {**warehouse, "w_ytd": warehouse["w_ytd"] + amount})
    ctx.write("district", (w, d), {**district, "d_ytd": district["d_ytd"] + amount})
    customer = {
        **customer,
        "c_balance": customer["c_balance"] - amount,
        "c_ytd_payment": customer["c_ytd_payment"] + amount,
        "c_payment_cnt": customer["c_payment_cnt"] + 1,
    }
    if customer["c_credit"] == "BC":
        customer["c_data"] = f"{c} {c_d} {c_w} {d} {w} {amount}|{customer['c_data']}"[:500]
    ctx.write("customer", (c_w, c_d, c), customer)
    ctx.write(
        "history",
        (w, d, args["h_id"]),
        {
            "h_c_id": c,
            "h_c_d_id": c_d,
            "h_c_w_id": c_w,
            "h_d_id": d,
            "h_w_id": w,
            "h_date": ctx.now,
            "h_amount": amount,
            "h_data": f"{warehouse['w_name']}    {district['d_name']}",
        },
    )
    return {"c_id": c, "c_balance": customer["c_balance"]}


def _payment(ctx, args):
    return _pay(ctx, args, args["c"])


def _payment_name(ctx, args):
    return _pay(ctx, args, _chosen({_by_name(args): ctx.read(*_by_name(args))}, _by_name(args)))


# --- OrderStatus (2.6) ------------------------------------------------------------------------


def _status_sets(args, c):
    w, d = args["w"], args["d"]
    reads = [Prefix("orders", (w, d)), Prefix("order_line", (w, d))]
    if c is not None:
        reads += [("customer", (w, d, c)), ("customer_last_order", (w, d, c))]
    return reads, []


def _status_name_recon(args):
    return [("customer_name", (args["w"], args["d"], args["c_last"]))]


def _status_name_keys(args, assumed):
    return _status_sets(args, _chosen(assumed, _status_name_recon(args)[0]))


def _status(ctx, args, c):
    w, d = args["w"], args["d"]
    customer = None if c is None else ctx.read("customer", (w, d, c))
    if customer is None:
        ctx.abort("no such customer")
    o_id = ctx.read("customer_last_order", (w, d, c))
    order = ctx.read("orders", (w, d, o_id))
    lines = [ctx.read("order_line", (w, d, o_id, n)) for n in range(1, order["o_ol_cnt"] + 1)]
    return {
        "c_id": c,
        "c_balance": customer["c_balance"],
        "o_id": o_id,
        "o_carrier_id": order["o_carrier_id"],
        "lines": [[line["ol_i_id"], line["ol_quantity"], line["ol_amount"], line["ol_delivery_d"]] for line in lines],
    }


def _status_name(ctx, args):
    key = _status_name_recon(args)[0]
    return _status(ctx, args, _chosen({key: ctx.read(*key)}, key))


# --- Delivery (2.7) ---------------------------------------------------------------------------


def _delivery_keys(args):
    w = args["w"]
    reads, writes = [], []
    for d in range(1, DISTRICTS + 1):
        ranges = [
            Prefix("new_order", (w, d)),
            Prefix("orders", (w, d)),
            Prefix("order_line", (w, d)),
            Prefix("customer", (w, d)),
        ]
        reads += ranges + [("new_order_head", (w, d))]
        writes += ranges + [("new_order_head", (w, d))]
    return reads, writes


def _delivery(ctx, args):
    w, carrier = args["w"], args["carrier"]
    delivered = []
    for d in range(1, DISTRICTS + 1):
        o_id = ctx.read("new_order_head", (w, d))
        if o_id is None or ctx.read("new_order", (w, d, o_id)) is None:
            continue  # no undelivered order in this district: skipped, as TPC-C allows
        ctx.delete("new_order", (w, d, o_id))
        ctx.write("new_order_head", (w, d), o_id + 1)
        order = ctx.read("orders", (w, d, o_id))
        ctx.write("orders", (w, d, o_id), {**order, "o_carrier_id": carrier})
        total = 0
        for n in range(1, order["o_ol_cnt"] + 1):
            line = ctx.read("order_line", (w, d, o_id, n))
            total += line["ol_amount"]
            ctx.write("order_line", (w, d, o_id, n), {**line, "ol_delivery_d": ctx.now})
        c = order["o_c_id"]
        customer = ctx.read("customer", (w, d, c))
        ctx.write(
            "customer",
            (w, d, c),
            {**customer, "c_balance": customer["c_balance"] + total, "c_delivery_cnt": customer["c_delivery_cnt"] + 1},
        )
        delivered.append([d, o_id])
    return delivered


# --- StockLevel (2.8) -------------------------------------------------------------------------


def _stock_level_keys(args):
    w, d = args["w"], args["d"]
    return [("district", (w, d)), Prefix("orders", (w, d)), Prefix("order_line", (w, d)), Prefix("stock", (w,))], []


def _stock_level(ctx, args):
    w, d = args["w"], args["d"]
    district = ctx.read("district", (w, d))
    if district is None:
        ctx.abort("no such district")
    next_o = district["d_next_o_id"]
    items = set()
    for o in range(max(1, next_o - 20), next_o):
        order = ctx.read("orders", (w, d, o))
        if order is None:
            continue
        for n in range(1, order["o_ol_cnt"] + 1):
            items.add(ctx.read("order_line", (w, d, o, n))["ol_i_id"])
    low = 0
    for i in sorted(items):
        stock = ctx.read("stock", (w, i))
        if stock is not None and stock["s_quantity"] < args["threshold"]:
            low += 1
    return low


W = Int(1, MAX_W)
D = Int(1, DISTRICTS)
CUSTOMER = Int(1, 1_000_000)
LINES = List(Int(0, 10_000_000), min_len=1, max_len=15)
AMOUNT = Int(1, 500_000)
SIZE = {"customers": Int(1, 1_000_000), "items": Int(1, 10_000_000)}

PROCEDURES = [
    Procedure(
        "tpcc_load_items",
        {"first": Int(1), "count": Int(1, 10_000), "items": Int(1, 10_000_000)},
        _item_keys,
        _load_items,
    ),
    Procedure(
        "tpcc_load_stock",
        {"w": W, "first": Int(1), "count": Int(1, 10_000), "items": Int(1, 10_000_000)},
        _stock_keys,
        _load_stock,
    ),
    Procedure("tpcc_load_warehouse", {"w": W, "customers": Int(1, 1_000_000)}, _warehouse_keys, _load_warehouse),
    Procedure("tpcc_load_district", {"w": W, "d": D, **SIZE}, _district_keys, _load_district),
    Procedure(
        "tpcc_new_order",
        {"w": W, "d": D, "c": CUSTOMER, "items": LINES, "supply": LINES, "quantity": LINES},
        _new_order_keys,
        _new_order,
    ),
    Procedure(
        "tpcc_payment",
        {"w": W, "d": D, "c_w": W, "c_d": D, "c": CUSTOMER, "amount": AMOUNT, "h_id": Str(64)},
        _payment_keys,
        _payment,
    ),
    Procedure(
        "tpcc_payment_name",
        {"w": W, "d": D, "c_w": W, "c_d": D, "c_last": Str(32), "amount": AMOUNT, "h_id": Str(64)},
        _payment_name_keys,
        _payment_name,
        reconnoiter=_payment_name_recon,
    ),
    Procedure(
        "tpcc_order_status",
        {"w": W, "d": D, "c": CUSTOMER},
        lambda a: _status_sets(a, a["c"]),
        lambda ctx, a: _status(ctx, a, a["c"]),
    ),
    Procedure(
        "tpcc_order_status_name",
        {"w": W, "d": D, "c_last": Str(32)},
        _status_name_keys,
        _status_name,
        reconnoiter=_status_name_recon,
    ),
    Procedure("tpcc_delivery", {"w": W, "carrier": Int(1, 10)}, _delivery_keys, _delivery),
    Procedure("tpcc_stock_level", {"w": W, "d": D, "threshold": Int(10, 20)}, _stock_level_keys, _stock_level),
]

KNOBS = {
    "warehouses": (int, WAREHOUSES, "warehouses"),
    "customers": (int, CUSTOMERS, "customers per district (TPC-C: 3000)"),
    "items": (int, ITEMS, "items (TPC-C: 100000)"),
    "payment": (float, 0.5, "share of Payment (NewOrder takes what the other shares leave)"),
    "order_status": (float, 0.0, "share of OrderStatus"),
    "delivery": (float, 0.0, "share of Delivery"),
    "stock_level": (float, 0.0, "share of StockLevel"),
    "load": (int, 1, "1: print the load requests first; 0: only the mix"),
    "assume": (int, 0, "1: lookups by last name carry the client's reconnaissance (the index as loaded)"),
    "remote_payment": (float, 0.15, "share of payments by a customer of another warehouse (TPC-C: 0.15)"),
    "remote_line": (float, 0.01, "share of order lines supplied by another warehouse (TPC-C: 0.01)"),
}


def load_requests(warehouses: int, customers: int, items: int) -> Iterator[dict]:
    """The initial population as small requests: items and stock in chunks, then each
    warehouse and each district."""

    def req(rid: str, proc: str, args: dict) -> dict:
        return {"id": f"tpcc-load-{rid}", "proc": proc, "args": args}

    for first in range(1, items + 1, ITEM_CHUNK):
        yield req(f"item-{first}", "tpcc_load_items", {"first": first, "count": ITEM_CHUNK, "items": items})
    for w in range(1, warehouses + 1):
        for first in range(1, items + 1, ITEM_CHUNK):
            yield req(
                f"stock-{w}-{first}", "tpcc_load_stock", {"w": w, "first": first, "count": ITEM_CHUNK, "items": items}
            )
        yield req(f"warehouse-{w}", "tpcc_load_warehouse", {"w": w, "customers": customers})
        for d in range(1, DISTRICTS + 1):
            yield req(
                f"district-{w}-{d}", "tpcc_load_district", {"w": w, "d": d, "customers": customers, "items": items}
            )


def generate(
    count: int,
    seed: int = 0,
    warehouses: int = WAREHOUSES,
    customers: int = CUSTOMERS,
    items: int = ITEMS,
    payment: float = 0.5,
    order_status: float = 0.0,
    delivery: float = 0.0,
    stock_level: float = 0.0,
    load: int = 1,
    assume: int = 0,
    remote_payment: float = 0.15,
    remote_line: float = 0.01,
) -> Iterator[dict]:
    """The load requests (unless load=0), then `count` transactions of the mix. With
    assume=1 a lookup by last name carries its assumed index entry (docs/ollp.md), read from
    the population the load requests create: the engine then skips the reconnaissance pass,
    as Calvin's clients do it before sequencing."""
    if warehouses < 1 or customers < 1 or items < 1:
        raise ValueError("warehouses, customers and items must be >= 1")
    if min(payment, order_status, delivery, stock_level) < 0 or payment + order_status + delivery + stock_level > 1:
        raise ValueError("the transaction shares must be >= 0 and add up to at most 1")
    if load:
        yield from load_requests(warehouses, customers, items)
    rng = random.Random(seed)
    names = name_count(customers)
    a_c, a_i, a_last = nurand_a(customers, 1023, 3000), nurand_a(items, 8191, 100_000), nurand_a(names, 255, 1000)

    def other(w: int) -> int:
        return rng.choice([x for x in range(1, warehouses + 1) if x != w])

    def customer(args: dict, w_key: str, d_key: str, w: int, d: int) -> str:
        """60 % by last name (the procedure's name), else by id."""
        args[w_key], args[d_key] = w, d
        if rng.random() < 0.6:
            args["c_last"] = last_name(nurand(rng, a_last, 0, names - 1, NURAND_C["c_last"]))
            if assume:
                index = district_index(w, d, customers, items)
                args[OLLP_FIELD] = {"restarts": 0, "assumed": [index.get(args["c_last"])]}
            return "_name"
        args["c"] = nurand(rng, a_c, 1, customers, NURAND_C["c_id"])
        return ""

    for n in range(count):
        rid = f"tpcc-{seed}-{n}"
        w, d = rng.randint(1, warehouses), rng.randint(1, DISTRICTS)
        draw = rng.random()
        if draw < payment:
            args = {"w": w, "d": d, "amount": rng.randint(100, 500_000), "h_id": rid}
            remote = warehouses > 1 and rng.random() < remote_payment
            c_w, c_d = (other(w), rng.randint(1, DISTRICTS)) if remote else (w, d)
            suffix = customer(args, "c_w", "c_d", c_w, c_d)
            yield {"id": rid, "proc": "tpcc_payment" + suffix, "args": args}
        elif draw < payment + order_status:
            args = {}
            suffix = customer(args, "w", "d", w, d)
            yield {"id": rid, "proc": "tpcc_order_status" + suffix, "args": args}
        elif draw < payment + order_status + delivery:
            yield {"id": rid, "proc": "tpcc_delivery", "args": {"w": w, "carrier": rng.randint(1, 10)}}
        elif draw < payment + order_status + delivery + stock_level:
            yield {"id": rid, "proc": "tpcc_stock_level", "args": {"w": w, "d": d, "threshold": rng.randint(10, 20)}}
        else:
            count_lines = rng.randint(5, 15)
            chosen: list[int] = []
            while len(chosen) < count_lines:
                i = nurand(rng, a_i, 1, items, NURAND_C["ol_i_id"])
                if i not in chosen:
                    chosen.append(i)
                if len(chosen) < count_lines and len(set(chosen)) >= items:
                    break
            if rng.random() < 0.01:
                chosen[-1] = items + 1  # an unused item id: the order rolls back
            supply = [other(w) if warehouses > 1 and rng.random() < remote_line else w for _ in chosen]
            yield {
                "id": rid,
                "proc": "tpcc_new_order",
                "args": {
                    "w": w,
                    "d": d,
                    "c": nurand(rng, a_c, 1, customers, NURAND_C["c_id"]),
                    "items": chosen,
                    "supply": supply,
                    "quantity": [rng.randint(1, 10) for _ in chosen],
                },
            }
