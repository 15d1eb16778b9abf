"""A small dataflow with an output stream, for the end-to-end streaming tests: a reading
is stored and checked; readings over the limit raise an alert on the output stream
`alerts`, counted per sensor; a sensor named "bad" makes the check abort (its reading
stays stored, no alert)."""

from ordo.procedures.args import Int, Str
from ordo.procedures.contract import Procedure, Table
from ordo.procedures.streams import Stream

TABLES = [Table("sensor_last", default=None), Table("sensor_alerts", default=0)]


def _keys(args):
    keys = [("sensor_last", args["sensor"]), ("sensor_alerts", args["sensor"])]
    return keys, keys


def _reading(ctx, args):
    ctx.write("sensor_last", args["sensor"], args["value"])
    ctx.emit("sensor_checked", [args["sensor"], args["value"]])
    return args["value"]


def _check(ctx, batch):
    for sensor, value in batch:
        if sensor == "bad":
            ctx.abort("bad sensor")
        if value > 90:
            count = ctx.read("sensor_alerts", sensor) + 1
            ctx.write("sensor_alerts", sensor, count)
            ctx.emit("alerts", {"sensor": sensor, "value": value, "alert": count})


PROCEDURES = [
    Procedure("sensor_reading", {"sensor": Str(16), "value": Int(0, 100)}, _keys, _reading),
    Procedure("sensor_check", {}, _keys, _check),
]
STREAMS = [
    Stream("sensor_checked", producers=["sensor_reading"], consumers=["sensor_check"]),
    Stream("alerts", producers=["sensor_check"]),
]
