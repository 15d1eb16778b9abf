"""An inventory: stock per (warehouse, item), shipments that abort when stock runs short,
restocking by SKU name (its item is looked up in storage: a dependent transaction), and
deliveries that arrive as atomic batches on an input stream, counted in a window of the
last five and announced on an output stream. Run it with `ordo run --app inventory:app`.

    ordo submit … --proc name_sku --args '{"sku": "bolt", "item": 7}'
    ordo submit … --proc deliver --args '{"batch": [{"warehouse": 1, "item": 7, "qty": 40}]}'
    ordo submit … --proc ship --args '{"warehouse": 1, "item": 7, "qty": 5}'
    ordo submit … --proc restock_sku --args '{"warehouse": 1, "sku": "bolt", "qty": 10}'
"""

import ordo
from ordo import Int, Str

app = ordo.App("inventory")


@app.table(partition_by=0)  # (warehouse, item): a warehouse's stock stays on one partition
class stock:
    default = 0


app.table("sku", default=None)  # SKU name -> item number
app.table("delivered", default=0)  # warehouse -> units delivered so far
app.table("low", default=0)  # warehouse -> low-stock alerts raised
LOW_MARK = 10


@app.procedure(args={"sku": Str(32), "item": Int(0, 999)}, writes=[("sku", "sku")])
def name_sku(ctx, args):
    ctx.write("sku", args["sku"], args["item"])


# Keys from the arguments: ANALYZE is derived (read and write stock[warehouse, item]).
@app.procedure(
    args={"warehouse": Int(0, 99), "item": Int(0, 999), "qty": Int(1, 10_000)},
    keys=[("stock", ("warehouse", "item")), ("low", "warehouse")],
)
def ship(ctx, args):
    key = (args["warehouse"], args["item"])
    left = ctx.read("stock", key) - args["qty"]
    if left < 0:
        ctx.abort(f"only {left + args['qty']} of item {args['item']} in warehouse {args['warehouse']}")
    ctx.write("stock", key, left)
    if left < LOW_MARK:
        ctx.write("low", args["warehouse"], ctx.read("low", args["warehouse"]) + 1)
        ctx.emit("low_stock", {"warehouse": args["warehouse"], "item": args["item"], "left": left})
    return left


# Which item a SKU names is in storage: the keys depend on a stored value (OLLP).
@app.procedure(args={"warehouse": Int(0, 99), "sku": Str(32), "qty": Int(1, 10_000)})
class restock_sku:
    def reconnoiter(args):
        return [("sku", args["sku"])]

    def analyze(args, assumed):
        item = assumed[("sku", args["sku"])]
        keys = [] if item is None else [("stock", (args["warehouse"], item))]
        return keys, keys

    def run(ctx, args):
        item = ctx.read("sku", args["sku"])
        if item is None:
            ctx.abort(f"unknown SKU {args['sku']!r}")
        key = (args["warehouse"], item)
        ctx.write("stock", key, ctx.read("stock", key) + args["qty"])
        return ctx.read("stock", key)


def _delivery_keys(args):
    lines = args["batch"]
    stock_keys = [("stock", (line["warehouse"], line["item"])) for line in lines]
    counters = [("delivered", line["warehouse"]) for line in lines]
    return stock_keys, stock_keys + counters


# A request to `deliver` carries an atomic batch of lines: all are received, or none.
@app.procedure(args={"warehouse": Int(0, 99), "item": Int(0, 999), "qty": Int(1, 10_000)}, analyze=_delivery_keys)
def deliver(ctx, lines):
    for line in lines:
        key = (line["warehouse"], line["item"])
        ctx.write("stock", key, ctx.read("stock", key) + line["qty"])
        ctx.emit("received", [line["warehouse"], line["qty"]])
    return len(lines)


def _tally_keys(args):
    counters = [("delivered", line["warehouse"]) for line in args["batch"]]
    return counters, counters


# Triggered by every delivery: counts units per warehouse and keeps the last five lines.
@app.procedure(args={}, analyze=_tally_keys)
def tally(ctx, received):
    for warehouse, qty in received:
        ctx.write("delivered", warehouse, ctx.read("delivered", warehouse) + qty)
        ctx.window_insert("recent", [warehouse, qty])
    return len(ctx.window("recent"))


app.stream("deliveries", consumers=["deliver"])  # input: atomic batches
app.stream("received", producers=["deliver"], consumers=["tally"])
app.stream("low_stock", producers=["ship"])  # output: <ns>.stream.low_stock
app.window("recent", owner="tally", rows=5, slide=1)
