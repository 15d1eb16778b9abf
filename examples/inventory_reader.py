"""Reads what the inventory (examples/inventory.py) wrote: its low-stock alerts, its stock
changes since a batch, and the outcomes, as typed records; stops after 3 s without news."""

import os
import sys

import ordo

client = ordo.Client(os.environ["ORDO_BOOTSTRAP_SERVERS"], os.environ["ORDO_NAMESPACE"])
since = int(sys.argv[1]) if len(sys.argv) > 1 else "beginning"  # a batch number, or the beginning
for alert in client.read_stream("low_stock", start=since, idle=3):
    print(f"batch {alert.batch}: low stock {alert.value}")
for change in client.read_changes(table="stock", start=since, idle=3):
    print(f"batch {change.batch}: stock{change.key} = {change.value}")
for outcome in client.read_outcomes(start=since, idle=3):
    print(f"batch {outcome.batch}: {outcome.status} {outcome.result}")
