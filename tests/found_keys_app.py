"""An app mixing procedures without ANALYZE with declared ones over one small table
(`--app tests.found_keys_app:app`): tests/test_found_keys.py."""

import ordo
from ordo import Int, List

app = ordo.App("found_keys")
app.table("gs", default=0, partitioner="modulo")
KEYS = 8


@app.procedure(
    args={"keys": List(Int(0, KEYS - 1), min_len=1, max_len=2), "value": Int(-5, 12)}, writes=[("gs", "keys")]
)
def put(ctx, args):
    for key in args["keys"]:
        ctx.write("gs", key, args["value"])


@app.procedure(args={"key": Int(0, KEYS - 1), "amount": Int(0, 9)}, keys=[("gs", "key")])
def add(ctx, args):
    ctx.write("gs", args["key"], ctx.read("gs", args["key"]) + args["amount"])
    return ctx.read("gs", args["key"])


@app.procedure(args={"a": Int(0, KEYS - 1), "b": Int(0, KEYS - 1), "amount": Int(0, 9)}, home=("gs", "a"))
def move(ctx, args):
    """A transfer: its keys are its arguments, but it says so nowhere."""
    if ctx.read("gs", args["a"]) < args["amount"]:
        ctx.abort("insufficient")
    ctx.write("gs", args["a"], ctx.read("gs", args["a"]) - args["amount"])
    ctx.write("gs", args["b"], ctx.read("gs", args["b"]) + args["amount"])


@app.procedure(args={"key": Int(0, KEYS - 1), "hops": Int(1, 3)}, home=("gs", "key"))
def chase(ctx, args):
    """Follows values as keys: which keys it touches depends on what it reads."""
    key = args["key"]
    for _ in range(args["hops"]):
        key = abs(ctx.read("gs", key)) % KEYS
    ctx.write("gs", key, ctx.read("gs", key) + 1)
    return key


@app.procedure(args={"keys": List(Int(0, KEYS - 1), min_len=1, max_len=3)}, home=lambda args: ("gs", args["keys"][0]))
def clear(ctx, args):
    """Data-dependent deletes."""
    for key in args["keys"]:
        if ctx.read("gs", key) % 2 == 0:
            ctx.delete("gs", key)
