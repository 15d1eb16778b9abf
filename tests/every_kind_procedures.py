"""One procedure of every kind, for the tests that run a sequencer and an engine in separate
processes (their procedure sets must describe themselves identically): a plain one, a
dependent one (OLLP), an input stream with atomic batches feeding a dataflow with an EE
trigger, a nested transaction, a tuple-based and a time-based window and an output stream."""

from ordo.procedures.args import Int, Str
from ordo.procedures.contract import Procedure, Table
from ordo.procedures.streams import Nested, Stream, Window

TABLES = [Table("kind_stock", default=0), Table("kind_name", default=None), Table("kind_seen", default=0)]


def _stock(args):
    key = ("kind_stock", args["item"])
    return [key], [key]


def _restock(ctx, args):
    ctx.write("kind_stock", args["item"], ctx.read("kind_stock", args["item"]) + args["qty"])


def _name(ctx, args):
    ctx.write("kind_name", args["name"], args["item"])


def _named_recon(args):
    return [("kind_name", args["name"])]


def _named_keys(args, assumed):
    item = assumed[("kind_name", args["name"])]
    keys = [("kind_stock", item)] if type(item) is int else []
    return keys, keys


def _restock_named(ctx, args):
    item = ctx.read("kind_name", args["name"])
    if item is None:
        ctx.abort("no such name")
    ctx.write("kind_stock", item, ctx.read("kind_stock", item) + args["qty"])


def _every_item(args):
    keys = [("kind_stock", item) for item in range(4)] + [("kind_seen", 0)]
    return keys, keys


def _receive(ctx, batch):
    for arrival in batch:
        ctx.write("kind_stock", arrival["item"], ctx.read("kind_stock", arrival["item"]) + arrival["qty"])
        ctx.emit("kind_received", [arrival["item"], arrival["qty"]])
    return len(batch)


def _count(ctx, batch):
    for item, qty in batch:
        ctx.window_insert("kind_recent", [item, qty])
    ctx.write("kind_seen", 0, ctx.read("kind_seen", 0) + len(batch))
    ctx.emit("kind_report", {"seen": ctx.read("kind_seen", 0), "recent": len(ctx.window("kind_recent"))})


def _audit(ctx, batch):
    for item, qty in batch:
        ctx.window_insert("kind_timed", [item, qty])


def _on_received(ctx, item):  # an EE trigger: runs as each tuple is inserted
    pass


def _on_slide(ctx, rows):
    pass


PROCEDURES = [
    Procedure("kind_restock", {"item": Int(0, 3), "qty": Int(1, 100)}, _stock, _restock),
    Procedure(
        "kind_name_item", {"name": Str(16), "item": Int(0, 3)}, lambda args: ((), [("kind_name", args["name"])]), _name
    ),
    Procedure(
        "kind_restock_named",
        {"name": Str(16), "qty": Int(1, 100)},
        _named_keys,
        _restock_named,
        reconnoiter=_named_recon,
    ),
    Procedure("kind_receive", {"item": Int(0, 3), "qty": Int(1, 100)}, _every_item, _receive),
    Procedure("kind_count", {}, _every_item, _count),
    Procedure("kind_audit", {}, _every_item, _audit),
]
STREAMS = [
    Stream("kind_arrivals", consumers=["kind_receive"]),
    Stream("kind_received", producers=["kind_receive"], consumers=["kind_count", "kind_audit"], on_insert=_on_received),
    Stream("kind_report", producers=["kind_count"]),
    Window("kind_recent", owner="kind_count", rows=3, slide=1, on_slide=_on_slide),
    Window("kind_timed", owner="kind_audit", range_ms=1000, slide_ms=500),
    Nested("kind_books", ["kind_count", "kind_audit"]),
]
