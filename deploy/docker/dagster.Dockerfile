# Dagster with the EchoMQ integration and PostgreSQL storage: the image of the webserver, the
# daemon and the code server in deploy/dagster/docker-compose.yml. Built from the root:
#   docker build -f deploy/docker/dagster.Dockerfile -t echomq-dagster .
FROM python:3.11-slim
COPY . /opt/echomq
RUN pip install --no-cache-dir /opt/echomq /opt/echomq/dagster_integration dagster-webserver \
    dagster-postgres
ENV DAGSTER_HOME=/opt/dagster/home
COPY deploy/dagster/dagster.yaml deploy/dagster/workspace.yaml /opt/dagster/home/
COPY examples/dagster /opt/dagster/app
WORKDIR /opt/dagster/app
