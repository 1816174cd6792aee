"""Airflow plugins of the provider: the EchoMQ dashboard in the api-server."""
