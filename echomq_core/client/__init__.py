"""The entry points users hold: :class:`EchoMQ` / :class:`AsyncEchoMQ` and their queues."""
