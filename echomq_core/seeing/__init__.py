"""Seeing: Prometheus metrics, reads for browsing and inspection, the dashboard's paths."""
