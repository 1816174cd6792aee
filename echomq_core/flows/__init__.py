"""Flows: the plan and the parent-first add, reads of a flow (children, failures, waiting,
streaming), its lifecycle (cancel, repair, retention), growth (spawn), sharded queues, release
watchers and result frames."""
