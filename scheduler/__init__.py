"""Scheduling and execution: the schedulers, the partition worker, the coordinator."""
