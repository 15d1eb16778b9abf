"""Built-in workloads of BENCHMARKS.md. Each module has TABLES, PROCEDURES, KNOBS
(name -> (type, default, help)) and generate(count, seed, **knobs) -> request dicts."""

from ordo.procedures.workloads import alias, gs, micro, ob, sl, tp, tpcc, voter, ycsbt

ALL_WORKLOADS = {
    "micro": micro,
    "sl": sl,
    "gs": gs,
    "ob": ob,
    "tp": tp,
    "alias": alias,
    "tpcc": tpcc,
    "voter": voter,
    "ycsbt": ycsbt,
}


def summary(module) -> str:
    """A workload's first sentence, from its module's docstring."""
    text = " ".join((module.__doc__ or "").split())
    name = module.__name__.rsplit(".", 1)[-1]
    text = text[len(name) + 2 :] if text.startswith(f"{name}: ") else text
    return text.split(". ")[0].rstrip(".") + "." if text else ""
