"""EchoMQ Airflow operators; one class per module."""
