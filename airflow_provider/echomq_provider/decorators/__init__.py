"""EchoMQ TaskFlow decorators (``@task.echo_flow``); one per module."""
