"""Procedures that name their keys in every way Ordo offers, each taking its key from a
request's arguments, for the tests that throw values of every type at them
(tests/test_hardening_keys.py): a key path on an Optional with a default, a list key path,
a composite key path, ANALYZE, a reconnaissance, a home function, and a triggered step of
a dataflow. Every procedure adds 1 at each key it names."""

from ordo.procedures.args import Int, List, Object, Optional, Str
from ordo.procedures.contract import Procedure, Table
from ordo.procedures.streams import Stream

TABLES = [Table("kt", default=0), Table("kt_mod", default=0, partitioner="modulo")]
ANY = {"v": Object()}  # {"v": {"k": <any JSON value>}}


def _raw(args):
    return args["v"].get("k")


def _bump_all(ctx, keys):
    for table, key in keys:
        ctx.write(table, key, ctx.read(table, key) + 1)


def _path_keys(args):
    return [("kt", args["k"])]


def _bump_one(ctx, args):
    _bump_all(ctx, [("kt", args["k"])])


def _bump_list(ctx, args):
    _bump_all(ctx, [("kt", k) for k in args["ks"]])


def _bump_pair(ctx, args):
    _bump_all(ctx, [("kt", (args["a"], args["b"]))])


def _analyzed(args):
    keys = [("kt", _raw(args)), ("kt_mod", _raw(args))]
    return keys, keys


def _bump_analyzed(ctx, args):
    _bump_all(ctx, [("kt", _raw(args)), ("kt_mod", _raw(args))])


def _recon(args):
    return [("kt", _raw(args))]


def _recon_sets(args, assumed):
    keys = [("kt_mod", _raw(args))]
    return keys, keys


def _bump_recon(ctx, args):
    ctx.read("kt", _raw(args))
    _bump_all(ctx, [("kt_mod", _raw(args))])


def _home(args):
    return "kt", _raw(args)


def _bump_home(ctx, args):
    _bump_all(ctx, [("kt", _raw(args))])


def _emit_keys(args):
    return [("kt", "emitted")], [("kt", "emitted")]


def _emit(ctx, args):
    _bump_all(ctx, [("kt", "emitted")])
    ctx.emit("key_events", [_raw(args)])


def _consume(ctx, batch):
    _bump_all(ctx, [("kt", emitted[0]) for emitted in batch])


PROCEDURES = [
    Procedure("key_optional", {"k": Optional(Int(), default=0)}, None, _bump_one, home=("kt", "k")),
    Procedure("key_list", {"ks": List(Str(16))}, lambda a: ([("kt", k) for k in a["ks"]],) * 2, _bump_list),
    Procedure("key_pair", {"a": Str(16), "b": Int()}, lambda a: ([("kt", (a["a"], a["b"]))],) * 2, _bump_pair),
    Procedure("key_analyzed", ANY, _analyzed, _bump_analyzed),
    Procedure("key_recon", ANY, _recon_sets, _bump_recon, reconnoiter=_recon),
    Procedure("key_home", ANY, None, _bump_home, home=_home),
    Procedure("key_emit", ANY, _emit_keys, _emit),
    Procedure("key_consume", {}, lambda a: ([("kt", _raw(a))],) * 2, _consume),
]
STREAMS = [Stream("key_events", producers=["key_emit"], consumers=["key_consume"])]
