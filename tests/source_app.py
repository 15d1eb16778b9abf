"""An app whose orders come from a topic a plain Kafka producer writes (`ordo run --app
tests.source_app:app`): tests/test_sources.py. The topic's name comes from the
environment, so each test run has its own."""

import os

import ordo

ORDERS_TOPIC = os.environ.get("ORDO_TEST_ORDERS_TOPIC", "orders")


def order_args(record: ordo.SourceRecord) -> dict:
    order = record.json()
    return {"sku": order["sku"], "qty": order["qty"]}


app = ordo.App("shop", sources=[ordo.Source(ORDERS_TOPIC, proc="place_order", args=order_args)])
app.table("ordered", default=0)


@app.procedure(args={"sku": ordo.Str(), "qty": ordo.Int()}, keys=[("ordered", "sku")])
def place_order(ctx, args):
    ctx.write("ordered", args["sku"], ctx.read("ordered", args["sku"]) + args["qty"])
