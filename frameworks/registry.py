"""What a framework is, for everything outside its folder: one ``Framework`` descriptor per
framework, defined in ``frameworks/<name>/descriptor.py`` and registered in ``frameworks/__init__.py``.

A descriptor imports no framework: the parent process (``kernelmap run``, doctor, report) reads
it without importing torch, mxnet or jax. What needs the framework itself (its profiler capture, its
NVTX ranges) is a method of its ``Workload``, which only a worker imports.
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .dataparallel import DataParallel


def mixed_not_implemented() -> dict[str, dict[str, str]]:
    """``Framework.math_refusals``' default: every mixed-precision math (spec.Math.mixed) refused on both devices."""
    from .spec import Math

    why = "its workload does not implement mixed precision yet (issue 38; docs/MIXED_PRECISION.md)"
    return {device: {m.value: why for m in Math if m.mixed} for device in ("cpu", "gpu")}


@dataclass(frozen=True)
class GpuVerdict:
    """Whether a framework can use this machine's GPU, from its probe and the GPU's compute capability."""

    usable: bool
    why: str | None = None  # when not usable: one line
    fix: str | None = None  # when not usable: what would make it usable
    cpu_regardless: bool = False  # the framework has no code for this GPU at all: the CPU even under --device gpu


class NsysWindow(enum.Enum):
    """How a framework's worker bounds its nsys capture to the timed steps."""

    # cudaProfilerStart/Stop around the timed steps: nsys runs with --capture-range=cudaProfilerApi
    # and records only the window
    PROFILER_API = "cudaProfilerApi"
    # a ``kernelmap:capture`` NVTX range (adapters.canonical.CAPTURE_RANGE) around the timed steps: nsys
    # records the whole process and the nsys adapter keeps what starts inside the range. For MXNet built
    # for sm_90, whose nsys agent dies when a capture starts at cudaProfilerStart mid-run
    NVTX_RANGE = "nvtx-range"

    def nsys_flags(self) -> list[str]:
        """The ``nsys profile`` options that follow from it."""
        if self is NsysWindow.PROFILER_API:
            return ["--capture-range=cudaProfilerApi", "--capture-range-end=stop"]
        return []


MODE_NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")


@dataclass(frozen=True)
class Option:
    """A framework's own option of ``kernelmap run``: a variant of its workload (e.g. PyTorch's
    ``--custom-op jit|setuptools|cmake``). The runner makes one command-line flag of each descriptor's
    options and hands the value to that framework's workers only (``TrainConfig.options[name]``)."""

    name: str  # the key in TrainConfig.options and in the run's config; the flag is --<name, - for _>
    choices: tuple[str, ...]
    help: str
    # why the variant cannot run a mixed-precision math (spec.Math.mixed), None where it can: refused up front
    mixed_refusal: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def add_names(table: dict, names: str, canon: str, direction: str) -> None:
    """``table[name] = (canon, direction)`` for each of the space-separated ``names``."""
    for n in names.split():
        table[n] = (canon, direction)


@dataclass(frozen=True)
class Vocabulary:
    """A framework's names as its traces spell them (kept in ``frameworks/<name>/ops.py``): the adapters
    read traces with these rules and name no framework themselves."""

    # op name -> (canonical op, direction: fwd | bwd | update | none)
    ops: Mapping[str, tuple[str, str]]
    # a prefix its profiler puts before an op name (PyTorch's autograd node wrapper), dropped before the
    # lookup; a name with it is a backward context (an op run inside it is a recompute)
    backward_prefix: str = ""
    # op-name prefixes of its collective communication ranges (canonical op "collective")
    collective_prefixes: tuple[str, ...] = ()
    # copy ops that are its communication where they run in the optimizer phase of a case on several devices
    # (MXNet's KVStore push and pull: kernelmap/commlink.py)
    collective_copies: tuple[str, ...] = ()
    # op name -> (position of the weight among its inputs, transposed?): the layer from the weight's shape
    weight_args: Mapping[str, tuple[int, bool]] = field(default_factory=dict)
    # matrix products with no weight argument of their own: the layer from the two matrices' dims
    gemm_ops: tuple[str, ...] = ()
    # forward op names that a backward op also calls (not a recompute when found inside a backward node)
    not_recompute: frozenset[str] = frozenset()
    # its ops run asynchronously (engine threads), after the issuing host thread left its regions
    asynchronous: bool = False
    # namespaces in the names of its own (native) kernels, and of its own workload variants' (the custom op)
    native_kernel_marks: tuple[str, ...] = ()
    custom_kernel_marks: tuple[str, ...] = ()
    # the NVTX range texts of its ops: fields that only its op ranges carry (PyTorch's emit_nvtx ``, seq = ``),
    # or, where empty, an op range is one whose text is an op name of ``ops`` (and not ``nvtx_not_ops``)
    nvtx_op_fields: tuple[str, ...] = ()
    nvtx_not_ops: str = ""  # a regular expression: its ranges that are never an op (MXNet's C API calls)
    # op-name prefixes that only its ops have (``aten::``): an export whose ops carry them is its
    op_prefixes: tuple[str, ...] = ()
    # op name of its fused ops -> the prefix of their generated kernels' names, which name the ops each one fuses
    # (MXNet's pointwise fusion: ``_FusedOp`` runs ``FusedKernel_Activation_amp_cast_``): kernelmap/adapters/fused_ops.py
    fused_ops: Mapping[str, str] = field(default_factory=dict)

    def lookup(self, name: str) -> tuple[str, str] | None:
        """(canonical op, direction) of one op name (its ``backward_prefix`` dropped), or None."""
        if self.backward_prefix and name.startswith(self.backward_prefix):
            name = name[len(self.backward_prefix):]
        if self.collective_prefixes and name.startswith(self.collective_prefixes):
            return ("collective", "none")
        return self.ops.get(name)

    def nvtx_op(self, text: str) -> bool:
        """Whether an NVTX range of this text is one of its ops (``kernelmap:`` ranges never are)."""
        if self.nvtx_op_fields:
            return any(f in text for f in self.nvtx_op_fields)
        return bool(text) and not text.startswith("kernelmap:") and not (
            self.nvtx_not_ops and re.match(self.nvtx_not_ops, text))


CUDNN9_LOG = {"CUDNN_LOGLEVEL_DBG": "3"}  # cuDNN 9's API log (3 = info)
ANY_OP = ("*",)  # Framework.cpu_library_entry_ops: every op of its trace runs its own library calls
# the worker passes a framework's shared_algorithms_env tells apart: the clean trials (the only processes that write
# a case's algorithms; kernelmap.worker's --pass clean) and the counters pass under ncu (kernelmap.run.counters)
CLEAN_PASS, COUNTERS_PASS = "clean", "counters"


@dataclass(frozen=True)
class Framework:
    name: str  # the key everywhere: results, records, CLI choices
    label: str  # for people: PyTorch, MXNet, JAX
    color: str  # its colour in every figure
    import_names: tuple[str, ...]  # modules that must be importable
    install_fix: str  # one line: how to install it
    probe: str  # Python source that prints one JSON line of facts (doctor, device decision)
    gpu_verdict: Callable[[dict[str, Any], tuple[int, int] | None, str | None], GpuVerdict]
    trace_source: str  # the records source of its profiler trace (the framework pass)
    modes: tuple[str, ...]  # execution modes it is benchmarked in (history keys); the first is its default
    pass_env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # extra env of a capture pass
    # the variable that makes its cuDNN log API calls, given its worker environment (cuDNN 9:
    # CUDNN_LOGLEVEL_DBG=3; cuDNN 8: CUDNN_LOGINFO_DBG=1)
    cudnn_log_env: Callable[[Mapping[str, str] | None], Mapping[str, str]] = lambda worker_env: CUDNN9_LOG
    # extra environment of its doctor probe and its workers on a GPU of this compute capability ("9.0"),
    # e.g. the tree of an MXNet built for it; None where there is none
    worker_env: Callable[[str | None], Mapping[str, str] | None] | None = None
    # how its Workload bounds the nsys capture on the GPU, given its worker environment; None: it
    # opens no window (its nsys pass is skipped)
    nsys_window: Callable[[Mapping[str, str] | None], NsysWindow | None] = lambda worker_env: None
    # its libs pass runs under nsys (its own profiler records no kernels): the kernels the logged calls
    # launch are recorded in the same process, in its nsys window (RUN_DIR/<fw>/bs<N>/libs/nsys.sqlite)
    libs_under_nsys: bool = False
    # `kernelmap` subcommands of its own: name -> (module with add_arguments/main, one-line help)
    commands: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    # extra environment of its workers that must run on the CPU (a GPU build told to stay off the GPU)
    cpu_env: Mapping[str, str] = field(default_factory=dict)
    # environment variables of its own that the manifest records (they change how it runs)
    recorded_env: tuple[str, ...] = ()
    # modes that run only on a GPU (CUDA graphs): on the CPU they are skipped with a note
    gpu_only_modes: frozenset[str] = frozenset()
    # the maths (spec.Math values) its workload cannot run, per device: {device: {math: why}}; the runner skips
    # such a case with the reason (frameworks.math_refusal), never runs it in fp32 under the label. The default:
    # mixed precision not implemented (a framework whose workload implements it says so in its descriptor)
    math_refusals: Mapping[str, Mapping[str, str]] = field(default_factory=mixed_not_implemented)
    # what this machine lacks for a math its workload runs elsewhere: (device, math) -> why, or None where it can;
    # read from the machine itself (the CPU's flags), never by importing the framework: the runner skips such a
    # case with the reason before any work, as it does ``math_refusals``' (frameworks.math_refusal)
    machine_math_refusal: Callable[[str, str], str | None] = lambda device, math: None
    # older command-line switches that name one of its modes: ``--hybridize`` -> hybridized
    mode_flags: Mapping[str, str] = field(default_factory=dict)
    # one line per mode, for --help and the docs: what the mode runs
    mode_help: Mapping[str, str] = field(default_factory=dict)
    # the environment that makes every process of one case (its clean trials and capture passes) run the
    # same library algorithms, given the case's file of them (``RunDir.algorithm_file``) and its worker
    # environment: the first process chooses (autotunes) and writes them, the others read them. {} where
    # the framework cannot share them (each process then chooses its own; kernelmap/calllink.py names
    # the kernels of a pass whose choice differs from the libs pass's). The third argument is the worker's pass
    # (``CLEAN_PASS``, ``COUNTERS_PASS``, another capture pass's name)
    shared_algorithms_env: Callable[..., Mapping[str, str]] = lambda path, worker_env, pass_name=None: {}
    # what a pass (its name) of a case ran instead where the case's shared algorithms file (``path``) was not there
    # to read, or None: the counters pass's note says it (an XLA process that autotunes under ncu died)
    shared_algorithms_note: Callable[[str, str], str | None] = lambda path, pass_name: None
    # per CPU library (oneDNN, BLAS): the ops of its profiler trace that run that library's calls (the n-th
    # call of a layer and direction is the n-th such op: attribution.link_onednn); ANY_OP where its ops are
    # flat; {} where its trace has no such ops
    cpu_library_entry_ops: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # its profiler trace names the library call that launched each kernel (XLA's custom calls): links made
    # in the trace itself (attribution.LINK_IN_TRACE), not by joining a library log of another pass
    library_calls_in_trace: bool = False
    # its profiler trace's op records are the framework's ops (False: XLA's are the compiled program's HLO
    # operations), counted as the run's "ops"
    trace_ops_are_framework_ops: bool = True
    # marks in the names of kernels of its own (its workload variants', e.g. PyTorch's custom op) that compute
    # a bias gradient: such a kernel's direction is bwd_bias, as the libraries' (adapters/_trace.py)
    bias_grad_kernel_marks: tuple[str, ...] = ()
    # `kernelmap doctor`'s report on what its own options need here (JSON-able), given whether this machine
    # has a GPU, and its lines of text for that report; None where it has no such options
    option_tools: Callable[[bool], Any] | None = None
    option_tool_lines: Callable[[Any], list[str]] = lambda report: []
    # modes whose traced steps do not call the model's ops one by one: {mode: why} (a compiler fuses them
    # into generated kernels; a replayed graph launches none); the report does not count op calls there
    uncounted_call_modes: Mapping[str, str] = field(default_factory=dict)
    # modes whose timed steps replay CUDA graphs captured before them: {mode: why}. Their library calls are made
    # while warming up and capturing, none in a replayed step: the report counts them, never per step
    replay_modes: Mapping[str, str] = field(default_factory=dict)
    # modes that need this many untimed warm-up steps in every pass (a CUDA graph is captured at the last of
    # them): {mode: steps}; the runner gives the libs pass at least that many, and refuses a smaller --warmup
    min_warmup: Mapping[str, int] = field(default_factory=dict)
    # its training step's memory per image, in float32 values of the model's forward
    # (spec.activation_floats_per_image): kernelmap/options.py refuses a batch size whose estimate does not fit
    train_memory_factor: float = 1.0
    # its op names, as its traces spell them (frameworks/<name>/ops.py); None where its trace's own adapter
    # holds the rules of the format (XLA's HLO ops: adapters/xla_trace.py)
    vocabulary: Vocabulary | None = None
    # how it trains on N devices (frameworks/dataparallel.py, its parallel.py); None: one device only
    data_parallel: DataParallel | None = None

    def __post_init__(self) -> None:
        if not self.modes:
            raise ValueError(f"{self.name}: a framework has at least one mode")
        bad = [m for m in (*self.gpu_only_modes, *self.mode_flags.values(), *self.uncounted_call_modes, *self.mode_help,
                           *self.min_warmup, *self.replay_modes)
               if m not in self.modes]
        if bad:
            raise ValueError(f"{self.name}: {bad} are not among its modes {self.modes}")
        if any(not MODE_NAME.match(m) for m in self.modes):
            raise ValueError(f"{self.name}: mode names are lower-case words joined by '-': {self.modes}")

    @property
    def default_mode(self) -> str:
        return self.modes[0]

    def modes_on(self, device: str) -> tuple[str, ...]:
        """Its modes that can run on ``device`` (cpu | gpu)."""
        return tuple(m for m in self.modes if device == "gpu" or m not in self.gpu_only_modes)


    options: tuple[Option, ...] = ()  # its own options of `kernelmap run` (workload variants)

    def own_env(self) -> dict[str, str]:
        """Its own environment on this machine's GPU (``worker_env``), {} where it has none."""
        return dict((self.worker_env(None) or {}) if self.worker_env else {})

    @property
    def python_env_var(self) -> str:
        """The environment variable naming the interpreter its workers run under (else ours)."""
        return f"KERNELMAP_PYTHON_{self.name.upper()}"

    def python(self, overrides: Mapping[str, str] | None = None) -> str | None:
        """Its workers' interpreter: ``--python NAME=PATH``, else ``$KERNELMAP_PYTHON_<NAME>``, else None."""
        if overrides and self.name in overrides:
            return overrides[self.name]
        return os.environ.get(self.python_env_var) or None


def no_gpu(gpu_problem: str | None) -> GpuVerdict:
    """The verdict on a machine without a usable NVIDIA GPU (shared by every framework)."""
    why = f"no NVIDIA GPU found ({gpu_problem})" if gpu_problem else "no NVIDIA GPU found"
    return GpuVerdict(False, why, "run on a machine with an NVIDIA GPU and driver")
