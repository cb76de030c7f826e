"""Load tests: ``make load`` (``python -m tests.load.load``), kept out of ``make test``."""
