"""The commands of ``dagq``, one module per command or family, each imported only when
used (the group in :mod:`dagq.cli` lists them by name)."""
