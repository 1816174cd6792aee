"""EchoMQ Airflow triggers; one class per module."""
