"""TPC-C's consistency conditions (clause 3.3.2) 1-4, 8, 9 and 12, checked over stored
records as `ordo dump` prints them ({"table", "key", "value"}, keys as JSON arrays)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable


def violations(records: Iterable[dict[str, Any]]) -> list[str]:
    """Every violated condition, one line each; an empty list when all hold."""
    warehouses, districts, customers = {}, {}, {}
    max_order: dict[tuple, int] = defaultdict(int)
    new_orders: dict[tuple, list[int]] = defaultdict(list)
    ol_cnt: dict[tuple, int] = defaultdict(int)
    lines: dict[tuple, int] = defaultdict(int)
    order_owner: dict[tuple, int] = {}
    delivered: dict[tuple, int] = defaultdict(int)  # (w, d, c) -> delivered ol_amount
    delivered_lines: list[tuple] = []
    history_w: dict[int, int] = defaultdict(int)
    history_d: dict[tuple, int] = defaultdict(int)
    for record in records:
        table, key, value = (
            record["table"],
            tuple(record["key"]) if type(record["key"]) is list else record["key"],
            record["value"],
        )
        if table == "warehouse":
            warehouses[key[0]] = value
        elif table == "district":
            districts[key] = value
        elif table == "customer":
            customers[key] = value
        elif table == "orders":
            w, d, o = key
            max_order[(w, d)] = max(max_order[(w, d)], o)
            ol_cnt[(w, d)] += value["o_ol_cnt"]
            order_owner[key] = value["o_c_id"]
        elif table == "new_order":
            new_orders[key[:2]].append(key[2])
        elif table == "order_line":
            lines[key[:2]] += 1
            if value["ol_delivery_d"] is not None:
                delivered_lines.append((key[:3], value["ol_amount"]))
        elif table == "history":
            history_w[value["h_w_id"]] += value["h_amount"]
            history_d[(value["h_w_id"], value["h_d_id"])] += value["h_amount"]
    for order, amount in delivered_lines:  # delivered lines, by their order's customer
        w, d, _ = order
        delivered[(w, d, order_owner.get(order))] += amount

    out: list[str] = []
    for w, row in sorted(warehouses.items()):
        total = sum(v["d_ytd"] for (dw, _), v in districts.items() if dw == w)
        if row["w_ytd"] != total:
            out.append(f"1: warehouse {w}: w_ytd {row['w_ytd']} != sum(d_ytd) {total}")
        if row["w_ytd"] != history_w[w]:
            out.append(f"8: warehouse {w}: w_ytd {row['w_ytd']} != sum(h_amount) {history_w[w]}")
    for (w, d), row in sorted(districts.items()):
        ids = new_orders[(w, d)]
        if row["d_next_o_id"] - 1 != max_order[(w, d)] or (ids and max(ids) != max_order[(w, d)]):
            out.append(
                f"2: district {w},{d}: d_next_o_id - 1 = {row['d_next_o_id'] - 1}, max(o_id) = "
                f"{max_order[(w, d)]}, max(no_o_id) = {max(ids) if ids else None}"
            )
        if ids and max(ids) - min(ids) + 1 != len(ids):
            out.append(f"3: district {w},{d}: new orders {min(ids)}..{max(ids)} but {len(ids)} rows")
        if ol_cnt[(w, d)] != lines[(w, d)]:
            out.append(f"4: district {w},{d}: sum(o_ol_cnt) {ol_cnt[(w, d)]} != order lines {lines[(w, d)]}")
        if row["d_ytd"] != history_d[(w, d)]:
            out.append(f"9: district {w},{d}: d_ytd {row['d_ytd']} != sum(h_amount) {history_d[(w, d)]}")
    for (w, d, c), row in sorted(customers.items()):
        if row["c_balance"] + row["c_ytd_payment"] != delivered[(w, d, c)]:
            out.append(
                f"12: customer {w},{d},{c}: c_balance + c_ytd_payment = "
                f"{row['c_balance'] + row['c_ytd_payment']} != delivered ol_amount {delivered[(w, d, c)]}"
            )
    if not warehouses or not districts:
        out.append("no TPC-C population found")
    return out
