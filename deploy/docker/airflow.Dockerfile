# Airflow with the EchoMQ provider and the Celery provider: the image of every Airflow
# component in deploy/airflow/docker-compose.yml (scheduler, triggerer, api-server,
# dag-processor, celery worker). Built from the repository root:
#   docker build -f deploy/docker/airflow.Dockerfile -t echomq-airflow .
FROM apache/airflow:3.3.2-python3.11
COPY --chown=airflow:root . /opt/echomq
RUN pip install --no-cache-dir /opt/echomq /opt/echomq/airflow_provider \
    "apache-airflow-providers-celery" "celery<5.7" psycopg2-binary asyncpg
COPY --chown=airflow:root airflow_provider/echomq_provider/example_dags /opt/airflow/dags
