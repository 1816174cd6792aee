"""EchoMQ Airflow hooks; one class per module."""
