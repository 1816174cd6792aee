"""Flow control: a queue's rate limit, and the Worker's and the Pump's settings."""
