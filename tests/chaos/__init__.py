"""Fault-injection suites: chaos on a real Cluster, server restarts, connection faults."""
