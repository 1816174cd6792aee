"""The Pump: carries cross-queue fan-in signals to their parents, and keeps queues moving."""
