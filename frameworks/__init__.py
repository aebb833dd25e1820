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
from .registry import ANY_OP as ANY_OP
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


def of_trace_source(source: str) -> Framework:
    """The framework whose profiler writes the trace format ``source`` (its descriptor's ``trace_source``)."""
    for d in REGISTRY.values():
        if d.trace_source == source:
            return d
    raise KeyError(f"no framework writes {source!r} traces")


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


def load_parallel(name: str):
    """Framework ``name``'s data-parallel module (``frameworks/<name>/parallel.py``; imports that framework)."""
    get(name)
    return importlib.import_module(f"kernelmap.frameworks.{name}.parallel")


def parse_python(items: list[str]) -> dict[str, str]:
    """``--python FRAMEWORK=PATH`` arguments as {framework: interpreter} (ValueError naming a bad one)."""
    out = {}
    for item in items:
        fw, sep, path = item.partition("=")
        if not sep or fw not in REGISTRY or not path:
            raise ValueError(f"--python {item!r}: expected FRAMEWORK=PATH with FRAMEWORK one of {', '.join(FRAMEWORKS)}")
        out[fw] = path
    return out


# --- execution modes: the vocabulary every descriptor owns ----------------------------------------
ALL_MODES = "all"  # `--mode all`: every mode of every framework
MODES: tuple[str, ...] = tuple(dict.fromkeys(m for d in REGISTRY.values() for m in d.modes))


def mode_choices() -> tuple[str, ...]:
    """``--mode`` choices: every registered mode, then ``all``."""
    return (*MODES, ALL_MODES)


def modes_to_run(name: str, asked: list[str] | tuple[str, ...] | None, device: str) -> tuple[list[str], dict[str, str]]:
    """The modes framework ``name`` runs for ``--mode`` values ``asked`` on ``device``, and why it skips each
    other asked mode there ({mode: reason}). ``all`` (or a list holding it): all its modes; no mode of its own
    asked (or nothing asked): its default mode. A mode that needs a GPU, on the CPU: skipped."""
    d = get(name)
    asked = list(asked or ())
    bad = [m for m in asked if m not in mode_choices()]
    if bad:
        raise ValueError(f"--mode {', '.join(bad)}: choose from {', '.join(mode_choices())}")
    want = list(d.modes) if ALL_MODES in asked else [m for m in d.modes if m in asked] or [d.default_mode]
    usable = d.modes_on(device)
    skipped = {m: f"it needs a GPU; {d.label} runs on the {device.upper()} here" for m in want if m not in usable}
    return [m for m in want if m in usable], skipped


# --- math modes: which framework runs which spec.Math on which device ---------------------------------------
def math_refusal(name: str, math: str, device: str) -> str | None:
    """Why framework ``name`` cannot run ``math`` (a spec.Math value) on ``device`` (cpu | gpu), None where it
    can: a GPU-only math (TF32) on the CPU, else its descriptor's ``math_refusals``, else what this machine lacks
    for it (its descriptor's ``machine_math_refusal``: MXNet's bf16 on a CPU without AVX-512)."""
    from .spec import Math

    d = get(name)
    m = Math(math)
    if device != "gpu" and m.gpu_only:
        return f"{m.value} is a GPU math (the CPU has no TF32); {d.label} runs on the {device.upper()} here"
    why = (d.math_refusals.get(device) or {}).get(m.value) or d.machine_math_refusal(device, m.value)
    return f"{d.label} cannot run {m.value} on the {device.upper()}: {why}" if why else None
