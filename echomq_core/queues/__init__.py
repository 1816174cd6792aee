"""Queues and jobs on the server: every queue operation (add, claim, complete, fail, ...), written
once as generators; the workers registry; per-minute throughput."""
