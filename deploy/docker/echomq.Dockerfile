# The EchoMQ processes: `echomq worker` (your handlers, from --app) and `echomq pump`, with
# the Prometheus metrics and /healthz (the `metrics` extra). Built from the repository root:
#   docker build -f deploy/docker/echomq.Dockerfile -t echomq .
# Your handlers: COPY your module into /app (the working directory is importable by --app);
# the image carries the examples' handlers there already.
FROM python:3.11-slim
COPY . /opt/echomq
RUN pip install --no-cache-dir "/opt/echomq[metrics]"
WORKDIR /app
COPY examples/airflow/echomq_worker.py examples/dagster/workers.py /app/
USER nobody
ENTRYPOINT ["echomq"]
