"""The optional C helpers (``_native.c``, built by setup.py where a C compiler is found): the Kineto
scanner, op nesting, SQLite columns, object codes. Each has a Python twin that gives the same answers;
``helpers`` is the built module, or None where it was not built. A leaf of the package (it imports
nothing of kernelmap but the extension), so ``strings`` and the adapters import it downward.
"""

from __future__ import annotations

try:
    from . import _native as helpers
except ImportError:  # pragma: no cover - depends on the build
    helpers = None

# the SQLite reader (nsys): not built where sqlite3's library cannot be opened (Windows)
sqlite = helpers if helpers is not None and hasattr(helpers, "query") else None
