"""``python -m dagq``: the ``dagq`` command."""

from dagq.cli import main

main(prog_name="dagq")
