"""dagq's version: the one place it is written (pyproject.toml reads it from here).

A constant, so a process that reports its version (a worker's record) does not import
importlib.metadata to find it — a tenth of the start-up of ``dagq run``.
"""

VERSION = "0.1.0"
