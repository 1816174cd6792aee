"""EchoMQ's side-by-side benchmark harness (issue 8); run it with ``python -m bench.run``."""
