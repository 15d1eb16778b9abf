"""Built-in workloads of BENCHMARKS.md. Each module has TABLES, PROCEDURES, KNOBS
(name -> (type, default, help)) and generate(count, seed, **knobs) -> request dicts."""

from procedures.workloads import alias, gs, micro, ob, sl, tp, tpcc, voter, ycsbt

ALL_WORKLOADS = {"micro": micro, "sl": sl, "gs": gs, "ob": ob, "tp": tp, "alias": alias, "tpcc": tpcc,
                 "voter": voter, "ycsbt": ycsbt}
