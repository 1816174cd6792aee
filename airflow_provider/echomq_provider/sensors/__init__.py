"""EchoMQ Airflow sensors; one class per module."""
