"""Framework-specific code behind one interface.

``spec`` is framework-free: the model, the training recipe, the weight file and the data order.
``pytorch`` and ``mxnet`` each define a class ``Workload`` with the same methods. Nothing here
imports a framework at module level; ``load_workload`` imports the one asked for, on demand.
"""

from __future__ import annotations

import importlib

FRAMEWORKS = ("pytorch", "mxnet", "jax")


def load_workload(name: str):
    """Return the ``Workload`` class of framework ``name`` (imports that framework)."""
    if name not in FRAMEWORKS:
        raise ValueError(f"unknown framework {name!r}; choose from {FRAMEWORKS}")
    return importlib.import_module(f"kernelmap.frameworks.{name}.workload").Workload
