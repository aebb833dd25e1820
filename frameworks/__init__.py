"""Framework-specific code behind one interface.

``spec`` is framework-free: the model, the training recipe, the weight file and the data order.
Each framework is one folder (``pytorch/``, ``mxnet/``, ``jax/``) holding ``Workload`` (same methods
for all) and a ``descriptor`` (what the rest of kernelmap needs to know: ``registry.Framework``), and
one line in ``REGISTRY`` below. Nothing here imports a framework at module level; ``load_workload``
imports the one asked for, on demand.
"""

from __future__ import annotations

import importlib
import re

from .jax.descriptor import DESCRIPTOR as _JAX
from .mxnet.descriptor import DESCRIPTOR as _MXNET
from .pytorch.descriptor import DESCRIPTOR as _PYTORCH
from .registry import Framework

# The registry: one line per framework. Order = column order in reports; the first is parity's reference.
REGISTRY: dict[str, Framework] = {d.name: d for d in (_PYTORCH, _MXNET, _JAX)}
FRAMEWORKS = tuple(REGISTRY)
REFERENCE = FRAMEWORKS[0]


def get(name: str) -> Framework:
    """The descriptor of ``name``; ValueError naming the choices for an unknown one."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown framework {name!r}; choose from {', '.join(FRAMEWORKS)}") from None


def deprecation_filters() -> tuple[str, ...]:
    """pytest ``filterwarnings`` lines hiding the DeprecationWarnings that a framework's own modules
    raise (MXNet 1.9.1 warns 11 times at import about numpy aliases and distutils): not ours to act on,
    and noise on a benchmark's console. A deprecation our code triggers is attributed to our module and
    still shows."""
    return tuple(f"ignore::DeprecationWarning:{re.escape(m)}(\\.|$)" for d in REGISTRY.values() for m in d.import_names)


def load_workload(name: str):
    """Return the ``Workload`` class of framework ``name`` (imports that framework)."""
    get(name)
    return importlib.import_module(f"kernelmap.frameworks.{name}.workload").Workload


def parse_python(items: list[str]) -> dict[str, str]:
    """``--python FRAMEWORK=PATH`` arguments as {framework: interpreter} (ValueError naming a bad one)."""
    out = {}
    for item in items:
        fw, sep, path = item.partition("=")
        if not sep or fw not in REGISTRY or not path:
            raise ValueError(f"--python {item!r}: expected FRAMEWORK=PATH with FRAMEWORK one of {', '.join(FRAMEWORKS)}")
        out[fw] = path
    return out
