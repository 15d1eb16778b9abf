"""Feeds the bank (examples/bank.py) and prints each outcome."""

import os

import ordo

client = ordo.Client(os.environ["ORDO_BOOTSTRAP_SERVERS"], os.environ["ORDO_NAMESPACE"])
client.wait_for_topics()  # `ordo run` creates them
ids = [
    client.submit("deposit", {"account": 1, "amount": 100}),
    client.submit("transfer", {"src": 1, "dst": 2, "amount": 30}),
    client.submit("transfer", {"src": 2, "dst": 1, "amount": 500}),
]
outcomes = client.wait(ids, timeout=60)
for request_id in ids:
    outcome = outcomes[request_id]
    print(outcome["status"], outcome["result"], outcome["error"])
client.close()
