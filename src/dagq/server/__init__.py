"""``dagq server``: the HTTP job API (FastAPI + uvicorn), an optional extra.

The package imports FastAPI only in its submodules, so ``import dagq.server`` stays
cheap and :func:`require_extra` can say what to install when the extra is missing.
See docs/architecture.md (interfaces) for where the server sits: it is one more client
of the store, beside the CLI, and any number of servers may run at once.
"""

from __future__ import annotations

import importlib.util

from dagq.errors import UsageError

#: The distributions of the ``server`` extra, by the module each provides.
EXTRA_MODULES = ("fastapi", "uvicorn", "sse_starlette")
INSTALL_HINT = "pip install 'dagq[server]'"


def require_extra() -> None:
    """Raise UsageError naming the install command when the ``server`` extra is missing."""
    missing = [name for name in EXTRA_MODULES if _missing(name)]
    if missing:
        raise UsageError(
            f"dagq server needs the server extra ({', '.join(missing)} not installed): "
            f"{INSTALL_HINT}"
        )


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):  # a module blocked (set to None in sys.modules)
        return True
