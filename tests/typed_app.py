"""A shop whose procedures take floats, booleans, objects and optional fields."""

import ordo
from ordo import Bool, Float, Int, List, Object, Optional, Str

app = ordo.App("typed")
app.table("cart", default=None)  # cart id -> {"total": float, "lines": [...]}
app.table("notes", default=None)


@app.procedure(
    args={
        "cart": Int(0),
        "item": Str(32),
        "price": Float(0.0, 1e6),
        "qty": Optional(Int(1, 100), 1),
        "gift": Optional(Bool(), False),
        "tags": Optional(List(Str(16)), []),
    },
    keys=[("cart", "cart")],
)
def add_line(ctx, args):
    cart = ctx.read("cart", args["cart"]) or {"total": 0.0, "lines": []}
    cost = args["price"] * args["qty"] * (0.0 if args["gift"] else 1.0)
    cart = {
        "total": cart["total"] + cost,
        "lines": cart["lines"] + [[args["item"], args["price"], args["qty"], args["gift"], args["tags"]]],
    }
    ctx.write("cart", args["cart"], cart)
    return cart["total"]


@app.procedure(
    args={
        "cart": Int(0),
        "note": Object({"text": Str(200), "rating": Optional(Float(0, 5)), "extra": Optional(Object())}),
    },
    keys=[("notes", "cart")],
)
def annotate(ctx, args):
    ctx.write("notes", args["cart"], args["note"])
    return args["note"]
