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


def case_key(name: str, mode: str | None) -> str:
    """The key of framework ``name`` run in ``mode`` in a run directory and its reports: the framework's
    name for its default mode (runs made before modes were keyed read the same), ``<name>-<mode>`` else."""
    d = get(name)
    if mode is None or mode == d.default_mode:
        return name
    if mode not in d.modes:
        raise ValueError(f"{name} has no mode {mode!r}; its modes: {', '.join(d.modes)}")
    return f"{name}-{mode}"


def split_key(key: str) -> tuple[str, str | None]:
    """(framework, mode) of a ``case_key``; the mode is None for a bare framework name (its default mode,
    or a run made before modes were keyed); (key, None) for a key no registered framework makes."""
    if key in REGISTRY:
        return key, None
    for name, d in REGISTRY.items():
        if key.startswith(name + "-") and key[len(name) + 1:] in d.modes:
            return name, key[len(name) + 1:]
    return key, None


def replay_reason(key: str) -> str | None:
    """Why case ``key``'s timed steps replay CUDA graphs (its descriptor's ``replay_modes``), else None."""
    name, mode = split_key(key)
    return REGISTRY[name].replay_modes.get(mode) if name in REGISTRY and mode else None


def key_label(key: str) -> str:
    """A case key for people: ``PyTorch``, ``PyTorch cuda-graph``."""
    name, mode = split_key(key)
    return REGISTRY[name].label + (f" {mode}" if mode else "") if name in REGISTRY else key


def key_color(key: str) -> str | None:
    """The colour of a case key's framework (None for an unknown one)."""
    name, _ = split_key(key)
    return REGISTRY[name].color if name in REGISTRY else None


def key_order(keys) -> list[str]:
    """Case keys in registry order: frameworks as registered, each framework's modes as its descriptor
    lists them; keys no framework makes last, sorted."""
    def rank(key: str) -> tuple:
        name, mode = split_key(key)
        if name not in REGISTRY:
            return (len(REGISTRY), 0, key)
        return (FRAMEWORKS.index(name), REGISTRY[name].modes.index(mode or REGISTRY[name].default_mode), key)

    return sorted(dict.fromkeys(keys), key=rank)
