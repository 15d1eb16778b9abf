"""A bank: accounts, deposits and transfers. Run it with `ordo run --app bank:app`."""

import ordo
from ordo import Int

app = ordo.App("bank")
app.table("account", default=0)


@app.procedure(args={"account": Int(0), "amount": Int(1)})
class deposit:
    def analyze(args):
        key = ("account", args["account"])
        return [key], [key]  # read set, write set: from the arguments alone

    def run(ctx, args):
        balance = ctx.read("account", args["account"]) + args["amount"]
        ctx.write("account", args["account"], balance)
        return balance


@app.procedure(args={"src": Int(0), "dst": Int(0), "amount": Int(1)})
class transfer:
    def analyze(args):
        keys = [("account", args["src"]), ("account", args["dst"])]
        return keys, keys

    def run(ctx, args):
        balance = ctx.read("account", args["src"])
        if balance < args["amount"]:
            ctx.abort("insufficient funds")  # nothing written is kept
        ctx.write("account", args["src"], balance - args["amount"])
        ctx.write("account", args["dst"], ctx.read("account", args["dst"]) + args["amount"])
        return balance - args["amount"]
