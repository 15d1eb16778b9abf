"""alias: transactions whose keys depend on stored data (Calvin's OLLP). A deposit or a
transfer names accounts by alias; which account an alias names is stored, and may be
rebound while the transaction waits for its turn. Such procedures declare a
reconnaissance (procedures/ollp.py): their sets come from the bindings they assume, and
they are re-sequenced when a binding changed before their turn."""

from __future__ import annotations

import random
from typing import Iterator

from ordo.procedures.args import Int, Str
from ordo.procedures.contract import Procedure, Table
from ordo.procedures.workloads.sampling import request

ALIASES = 100
ACCOUNTS = 50
AMOUNT = Int(0, 10**12)
TABLES = [Table("alias", default=None), Table("alias_account")]


def _account(assumed: dict, alias: str):
    account = assumed[("alias", alias)]
    return account if type(account) is int else None


def _bind_keys(args):
    return (), [("alias", args["alias"])]


def _bind(ctx, args):
    ctx.write("alias", args["alias"], args["account"])


def _deposit_recon(args):
    return [("alias", args["alias"])]


def _deposit_keys(args, assumed):
    account = _account(assumed, args["alias"])
    keys = [] if account is None else [("alias_account", account)]
    return keys, keys


def _deposit(ctx, args):
    account = ctx.read("alias", args["alias"])
    if account is None:
        ctx.abort("unknown alias")
    ctx.write("alias_account", account, ctx.read("alias_account", account) + args["amount"])


def _transfer_recon(args):
    return [("alias", args["src"]), ("alias", args["dst"])]


def _transfer_keys(args, assumed):
    accounts = [_account(assumed, args["src"]), _account(assumed, args["dst"])]
    keys = [("alias_account", a) for a in accounts if a is not None]
    return keys, keys


def _transfer(ctx, args):
    src, dst = ctx.read("alias", args["src"]), ctx.read("alias", args["dst"])
    if src is None or dst is None:
        ctx.abort("unknown alias")
    amount = args["amount"]
    balance = ctx.read("alias_account", src)
    if balance < amount:
        ctx.abort("insufficient funds")
    ctx.write("alias_account", src, balance - amount)  # debit first: src == dst leaves it unchanged
    ctx.write("alias_account", dst, ctx.read("alias_account", dst) + amount)


alias_bind = Procedure("alias_bind", {"alias": Str(64), "account": Int(0)}, _bind_keys, _bind)
alias_deposit = Procedure(
    "alias_deposit", {"alias": Str(64), "amount": AMOUNT}, _deposit_keys, _deposit, reconnoiter=_deposit_recon
)
alias_transfer = Procedure(
    "alias_transfer",
    {"src": Str(64), "dst": Str(64), "amount": AMOUNT},
    _transfer_keys,
    _transfer,
    reconnoiter=_transfer_recon,
)

PROCEDURES = [alias_bind, alias_deposit, alias_transfer]

KNOBS = {
    "aliases": (int, ALIASES, "aliases, each bound once at the start"),
    "accounts": (int, ACCOUNTS, "accounts aliases are bound to"),
    "rebind": (float, 0.1, "share of rebinds in the mix"),
    "transfer": (float, 0.6, "share of transfers in the mix (the rest are deposits)"),
    "unknown": (float, 0.02, "share of deposits and transfers naming an alias never bound"),
}


def generate(
    count: int,
    seed: int = 0,
    aliases: int = ALIASES,
    accounts: int = ACCOUNTS,
    rebind: float = 0.1,
    transfer: float = 0.6,
    unknown: float = 0.02,
) -> Iterator[dict]:
    """The first `aliases` requests bind every alias (fewer if count is smaller); then a mix
    of rebinds, deposits and transfers."""
    if aliases < 1 or accounts < 1:
        raise ValueError("aliases and accounts must be >= 1")
    rng = random.Random(seed)

    def name() -> str:
        if rng.random() < unknown:
            return f"unbound-{rng.randrange(aliases)}"
        return f"a{rng.randrange(aliases)}"

    for i in range(count):
        if i < aliases:
            yield request("alias", seed, i, "alias_bind", {"alias": f"a{i}", "account": rng.randrange(accounts)})
            continue
        draw = rng.random()
        if draw < rebind:
            args = {"alias": f"a{rng.randrange(aliases)}", "account": rng.randrange(accounts)}
            yield request("alias", seed, i, "alias_bind", args)
        elif draw < rebind + (1 - rebind) * transfer:
            args = {"src": name(), "dst": name(), "amount": rng.randint(1, 60)}
            yield request("alias", seed, i, "alias_transfer", args)
        else:
            yield request("alias", seed, i, "alias_deposit", {"alias": name(), "amount": rng.randint(1, 100)})
