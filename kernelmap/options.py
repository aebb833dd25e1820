"""``kernelmap run``'s options checked together, before any work: a bad value or combination is refused with one
line naming the option and why (exit 2), instead of a worker failing minutes into the run.

Pure functions of the parsed arguments and of what they are handed (the training set's size, the memory free
where the run will train): ``validate`` is what the runner calls, after listing the GPUs and before it probes a
framework. ``free_memory`` is the one function here that looks at the machine (/proc/meminfo, nvidia-smi).

What is checked:
- the modes: each ``--mode`` one of a chosen framework's; each batch size given once;
- the counts (``--batch-size``, ``--steps``, ``--epochs``, ``--warmup``, ``--trials``, ``--threads``,
  ``--max-repeats``, ``--repeat-budget``, ``--seed``): each at least its least value; ``--lr`` finite, above 0;
- each batch size against the training set: every step trains on a full batch (``spec.PARTIAL_BATCH_NOTE``), so
  a batch larger than the training set is refused, and so is ``--epochs`` that leaves no step after the warm-up;
- each batch size against the memory free: a training step's estimated memory (``estimate_bytes``) against the
  GPU's free memory (nvidia-smi) or the host's available RAM (``MemAvailable``); the refusal names the device's
  capacity (``Memory.capacity_bytes``) and, on a GPU, the processes nvidia-smi says hold its memory;
- with ``--devices`` above 1 on the GPU, every device against its slice of the batch for each N asked (B / N images;
  device 0 against B / min N: ``check_devices_memory``, each visible GPU read by ``devices_free``, matched to CUDA's
  device by nvidia-smi's row in PCI bus order: ``CUDA_ORDER_ENV``).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

from kernelmap import frameworks
from kernelmap.errors import KernelmapError
from kernelmap.frameworks import spec

GIB = 1 << 30
MIB = 1 << 20
# The memory estimate of a training step: the forward's values per image (spec.activation_floats_per_image, as
# float32) times the framework's train_memory_factor (its descriptor: what the backward adds, gradients and
# workspaces, measured on the CPU), times the batch size, plus a fixed part: the framework and its libraries and
# the data set in memory (host), the CUDA context and libraries (GPU).
FIXED_BYTES = {"cpu": 2 * GIB, "gpu": 1 * GIB}
DEVICES = tuple(FIXED_BYTES)


# the words every memory refusal says (memory_problem); benches/option_sweep.py knows a memory refusal by them
MEMORY_NEED = "a training step needs about"


@dataclass(frozen=True)
class Holder:
    """A process holding a GPU's memory, as ``nvidia-smi --query-compute-apps`` lists it."""

    pid: int
    name: str
    used_bytes: int


@dataclass(frozen=True)
class Memory:
    """Memory free where the run trains, as read before the run."""

    device: str  # cpu | gpu
    where: str  # what was read: "host RAM (MemAvailable)", "GPU 0 (NVIDIA H100 ..., nvidia-smi memory.free)"
    free_bytes: int
    # what the device has for processes, whoever holds it now: a GPU's memory.free + memory.used (its total less
    # the driver's reserve), the host's MemTotal; None where it was not read
    capacity_bytes: int | None = None
    holders: tuple[Holder, ...] = ()  # the GPU's compute processes and their memory (nvidia-smi), largest first

    @property
    def unit(self) -> str:
        """The device alone: "GPU 1", "host RAM"."""
        return self.where.split(" (")[0]

    def capacity(self) -> Memory:
        """This device as if nothing else held its memory: what an expectation of what fits is made of."""
        if self.capacity_bytes is None:
            return self
        return Memory(self.device, f"{self.unit} capacity", self.capacity_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "where": self.where, "free_bytes": self.free_bytes,
                "capacity_bytes": self.capacity_bytes,
                "holders": [{"pid": h.pid, "name": h.name, "used_bytes": h.used_bytes} for h in self.holders]}


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def chosen(args: argparse.Namespace) -> list[str]:
    """The frameworks ``--framework`` names (all of them for ``all``)."""
    return list(frameworks.FRAMEWORKS) if args.framework == "all" else [args.framework]


# --- the counts -------------------------------------------------------------------------------
def least_values(args: argparse.Namespace) -> list[tuple[str, float | None, float]]:
    """(flag, value given, least value) of every count ``kernelmap run`` takes (None: not given)."""
    counts: list[tuple[str, float | None, float]] = [("--batch-size", bs, 1) for bs in args.batch_size]
    counts += [("--steps", args.steps if args.epochs is None else None, 1), ("--epochs", args.epochs, 1),
               ("--warmup", args.warmup, 0), ("--trials", args.trials, 1), ("--threads", args.threads, 1),
               ("--max-repeats", args.max_repeats, 0), ("--repeat-budget", args.repeat_budget, 0),
               ("--seed", args.seed, 0)]  # numpy's generators take no negative seed
    return counts


def check_counts(args: argparse.Namespace) -> None:
    """KernelmapError naming the first count below its least value (or not a number: nan), or a learning rate
    that is not a finite number above 0."""
    for flag, value, least in least_values(args):
        if value is not None and not value >= least:
            raise KernelmapError(f"{flag} {value:g}: must be at least {least:g}")
    if not (math.isfinite(args.lr) and args.lr > 0):
        raise KernelmapError(f"--lr {args.lr:g}: must be a finite number above 0")


def check_modes(args: argparse.Namespace) -> None:
    """KernelmapError for a ``--mode`` (or a switch naming one, ``--hybridize``) that no framework asked for has:
    it ran their default mode instead, without a word."""
    names = chosen(args)
    for mode in dict.fromkeys(m for m in getattr(args, "mode", None) or () if m != frameworks.ALL_MODES):
        if not any(mode in frameworks.get(fw).modes for fw in names):
            have = "; ".join(f"{frameworks.get(fw).label}: {', '.join(frameworks.get(fw).modes)}" for fw in names)
            raise KernelmapError(f"--mode {mode}: not a mode of --framework {args.framework} ({have})")


def check_maths(args: argparse.Namespace) -> None:
    """KernelmapError for a ``--math`` given twice, and, on a device given (``--device cpu|gpu``), for a math that
    no framework asked for can run there (``frameworks.math_refusal``: fp16 on the CPU, TF32 on the CPU, mixed
    precision a workload does not implement): it would run nothing, or fp32 under its label. Where some of them
    can, the others' cases are skipped with a note (kernelmap/run/cli.py: math_cases)."""
    maths = list(getattr(args, "math", None) or ())
    twice = [x for i, x in enumerate(maths) if x in maths[:i]]
    if twice:
        raise KernelmapError(f"--math {' '.join(maths)}: {twice[0]} given twice")
    mixed = [x for x in maths if spec.Math(x).mixed]
    for o in (o for fw in chosen(args) for o in frameworks.get(fw).options):
        if mixed and o.mixed_refusal and getattr(args, o.name, None) is not None:
            raise KernelmapError(f"{o.flag} {getattr(args, o.name)} with --math {' '.join(mixed)}: {o.mixed_refusal}")
    device = getattr(args, "device", "auto")
    if device == "auto":  # each framework's device is decided by its probe (run/devices.py), then checked
        return
    for x in maths:
        why = [frameworks.math_refusal(fw, x, device) for fw in chosen(args)]
        if all(why):
            raise KernelmapError(f"--math {x} --device {device}: " + "; ".join(why))


def check_args(args: argparse.Namespace) -> None:
    """What the command line alone decides: the counts, the modes, the maths, each batch size given once."""
    check_counts(args)
    check_modes(args)
    check_maths(args)
    twice = [bs for i, bs in enumerate(args.batch_size) if bs in args.batch_size[:i]]
    if twice:
        raise KernelmapError(f"--batch-size {' '.join(map(str, args.batch_size))}: {twice[0]} given twice")
    check_devices(args.batch_size, getattr(args, "devices", None) or [1])


def check_devices(batch_sizes: list[int], devices: list[int]) -> None:
    """Each ``--devices`` value at least 1, given once, dividing every batch size (each device an equal slice of
    the global batch: frameworks/dataparallel.py)."""
    said = f"--devices {' '.join(map(str, devices))}"
    for i, n in enumerate(devices):
        if n < 1:
            raise KernelmapError(f"{said}: {n}: must be at least 1")
        if n in devices[:i]:
            raise KernelmapError(f"{said}: {n} given twice")
        for bs in batch_sizes:
            if bs % n:
                raise KernelmapError(f"{said}: --batch-size {bs} is not a multiple of {n} (each device trains on an "
                                     "equal slice of the global batch)")


# --- batch sizes against the data and the memory ------------------------------------------------
def bytes_per_image(framework: str) -> float:
    """Estimated memory of one training step of ``framework`` per image of the batch."""
    return spec.activation_floats_per_image() * 4 * frameworks.get(framework).train_memory_factor


def estimate_bytes(framework: str, batch_size: int, device: str) -> int:
    """Estimated memory of one training step of ``framework`` at ``batch_size`` on ``device`` (cpu | gpu)."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, not {device!r}")
    return int(FIXED_BYTES[device] + bytes_per_image(framework) * batch_size)


def largest_fitting(framework: str, memory: Memory) -> int:
    """The largest batch size whose estimate for ``framework`` fits ``memory`` (0 where none does)."""
    return max(int((memory.free_bytes - FIXED_BYTES[memory.device]) // bytes_per_image(framework)), 0)


def holders_said(memory: Memory, most: int = 3) -> str:
    """" (pid 8715 python3.12 holds 105.0 GiB, ...)": the processes nvidia-smi says hold the GPU's memory."""
    if not memory.holders:
        return ""
    named = [f"pid {h.pid} {h.name} holds {gib(h.used_bytes)}" for h in memory.holders[:most]]
    more = len(memory.holders) - most
    return " (" + ", ".join(named) + (f" and {more} more process{'es' * (more > 1)}" if more > 0 else "") + ")"


def memory_problem(batch_size: int, names: list[str], memory: Memory) -> str | None:
    """Why ``batch_size`` does not fit ``memory`` in one of the frameworks ``names`` (None where it fits all):
    the need, what was free (of the device's capacity, and who holds the memory, where known)."""
    over = [fw for fw in names if estimate_bytes(fw, batch_size, memory.device) > memory.free_bytes]
    if not over:
        return None
    needs = ", ".join(f"{gib(estimate_bytes(fw, batch_size, memory.device))} in {frameworks.get(fw).label} "
                      f"({bytes_per_image(fw) / MIB:.2f} MiB an image, at most {largest_fitting(fw, memory):,} "
                      "images fit)" for fw in over)
    fits = [frameworks.get(fw).label for fw in names if fw not in over]
    of = "" if memory.capacity_bytes is None else f" of {gib(memory.capacity_bytes)}"
    held = ""
    if memory.capacity_bytes is not None and all(estimate_bytes(fw, batch_size, memory.device) <= memory.capacity_bytes
                                                 for fw in over):
        held = f"; it would fit {memory.unit}'s {gib(memory.capacity_bytes)} were other processes not holding it"
    return (f"{MEMORY_NEED} {needs}, estimated with {gib(FIXED_BYTES[memory.device])} fixed, and "
            f"{memory.where} had {gib(memory.free_bytes)} free{of}{holders_said(memory)}"
            + (f" ({', '.join(fits)} would fit)" if fits else "") + held)


def batch_problems(batch_size: int, n_train: int, data: str, names: list[str], memory: Memory | None) -> list[str]:
    """Why ``batch_size`` cannot train here ([] where it can): too large for the memory free, for the data."""
    why = []
    if memory is not None and (problem := memory_problem(batch_size, names, memory)):
        why.append(problem)
    if batch_size > n_train:
        why.append(f"larger than the {n_train:,} training images of the {data} data (every step trains on a full "
                   "batch; each epoch's last partial batch is dropped)")
    return why


def check_epochs(batch_size: int, n_train: int, epochs: int, warmup: int) -> None:
    """KernelmapError where ``epochs`` epochs at ``batch_size`` leave no step after the ``warmup`` steps."""
    total = epochs * spec.steps_per_epoch(n_train, batch_size)
    if total <= warmup:
        raise KernelmapError(
            f"--epochs {epochs} at --batch-size {batch_size}: {total} step{'s' * (total != 1)} (full batches of the "
            f"{n_train:,} training images), no more than the {warmup} warm-up steps (--warmup): nothing would be "
            "timed; give more epochs, a smaller batch or fewer warm-up steps")


def batch_plan(batch_sizes: list[int], n_train: int) -> dict[str, Any]:
    """The manifest's record of the partial-batch rule and what it makes of an epoch at each batch size."""
    return {"partial_batch": spec.PARTIAL_BATCH_RULE, "note": spec.PARTIAL_BATCH_NOTE,
            "per_batch_size": [spec.epoch_plan(n_train, bs) for bs in batch_sizes]}


def check_devices_memory(args: argparse.Namespace, devices_memory: list[Memory] | None) -> None:
    """KernelmapError where a device of an N-device case (``--devices``, each N asked) has not the memory free for its
    slice of the global batch (B / N images, ``memory_problem``; device 0 so meets B / min N); ``devices_memory``:
    the visible GPUs in CUDA's order (``devices_free``). On the 2x H200 GPU 1 had 0.5 GiB free (a leftover process
    held the rest) and every x2 case failed minutes in, each its own way."""
    for n in getattr(args, "devices", None) or [1]:
        for r, memory in enumerate((devices_memory or [])[:n]):
            for bs in args.batch_size:
                if problem := memory_problem(bs // n, chosen(args), memory):
                    case = f"--devices {n} " if n > 1 else ""
                    raise KernelmapError(f"{case}--batch-size {bs}: device {r} of {n} trains {bs // n:,} images a "
                                         f"step: {problem}")


def validate(args: argparse.Namespace, n_train: int, data: str, memory: Memory | None,
             devices_memory: list[Memory] | None = None) -> dict[str, Any]:
    """Refuse (KernelmapError, one line naming the option and why) any option or combination that cannot run;
    return the batch plan for the manifest (``batch_plan``, with the memory read). ``n_train``: training images
    of the data ``data`` (its kind); ``memory``: ``free_memory``'s reading, None where it could not be read;
    ``devices_memory``: ``devices_free``'s, for ``--devices`` above 1 (``check_devices_memory``: then each GPU, the
    first too, is held to its slice for each N asked, not ``memory`` to the whole batch)."""
    check_args(args)
    for bs in args.batch_size:
        why = batch_problems(bs, n_train, data, chosen(args), None if devices_memory else memory)
        if why:
            raise KernelmapError(f"--batch-size {bs}: " + "; and ".join(why))
        if args.epochs is not None:
            check_epochs(bs, n_train, args.epochs, args.warmup)
    check_devices_memory(args, devices_memory)
    return {**batch_plan(args.batch_size, n_train), "memory": None if memory is None else memory.to_dict(),
            "devices_memory": None if devices_memory is None else [m.to_dict() for m in devices_memory],
            "memory_estimate": {"fixed_bytes": FIXED_BYTES, "floats_per_image": spec.activation_floats_per_image(),
                                "bytes_per_image": {fw: bytes_per_image(fw) for fw in chosen(args)}}}


# --- what is free -------------------------------------------------------------------------------
def host_available(meminfo: str = "/proc/meminfo") -> Memory | None:
    """The host's available RAM (``MemAvailable``; its capacity ``MemTotal``), None where it cannot be read."""
    kib: dict[str, int] = {}
    try:
        with open(meminfo) as fh:
            for line in fh:
                name, _, rest = line.partition(":")
                if name in ("MemAvailable", "MemTotal") and rest.split():
                    kib[name] = int(rest.split()[0])
    except (OSError, ValueError):
        return None
    if "MemAvailable" not in kib:
        return None
    total = kib.get("MemTotal")
    return Memory("cpu", "host RAM (MemAvailable)", kib["MemAvailable"] * 1024, None if total is None else total * 1024)


SMI_GPU_QUERY = "--query-gpu=index,uuid,name,memory.free,memory.used"
SMI_APPS_QUERY = "--query-compute-apps=gpu_uuid,pid,process_name,used_memory"
# nvidia-smi lists the GPUs (and numbers them) by PCI bus id; CUDA enumerates them so only with CUDA_DEVICE_ORDER=
# PCI_BUS_ID (its default, FASTEST_FIRST, may put another GPU first, and reads $CUDA_VISIBLE_DEVICES' indices in its
# own order). ``kernelmap run`` sets it for itself and so for every worker where the user has not (``pci_order``):
# then device r of a worker is the r-th visible row of nvidia-smi. Where $CUDA_VISIBLE_DEVICES names UUIDs, CUDA
# takes them in the order named whatever the order variable says.
CUDA_ORDER_ENV = "CUDA_DEVICE_ORDER"
CUDA_ORDER_PCI = "PCI_BUS_ID"


def parse_smi_holders(text: str, uuid: str) -> tuple[Holder, ...]:
    """The processes holding GPU ``uuid``'s memory, largest first, from ``nvidia-smi SMI_APPS_QUERY
    --format=csv,noheader,nounits`` output (a process name may hold commas; a line that does not read is left out:
    the refusal stands without it)."""
    held = []
    for line in text.splitlines():
        head = line.split(",", 2)
        tail = head[-1].rsplit(",", 1)
        if len(head) < 3 or len(tail) < 2 or head[0].strip() != uuid:
            continue
        pid, name, used = head[1].strip(), tail[0].strip(), tail[1].strip()
        if pid.isdigit() and used.isdigit():
            held.append(Holder(int(pid), name, int(used) * MIB))
    return tuple(sorted(held, key=lambda h: -h.used_bytes))


def parse_smi_devices(text: str, visible: str | None, apps: str = "", order: str | None = None) -> list[Memory]:
    """The visible GPUs' free memory, in CUDA's order, from ``nvidia-smi SMI_GPU_QUERY --format=csv,noheader,nounits``
    output (each one's capacity: memory.free + memory.used, where the fifth column is there and a number);
    ``visible``: $CUDA_VISIBLE_DEVICES (indices or UUIDs; as CUDA, none past the first that names no GPU), else every
    GPU; ``apps``: ``SMI_APPS_QUERY``'s output, who holds each. A GPU whose memory.free does not read ends the list.
    ``order``: $``CUDA_ORDER_ENV`` (None: unset, so ``kernelmap run`` sets ``CUDA_ORDER_PCI``); another order than
    nvidia-smi's, with $CUDA_VISIBLE_DEVICES naming no UUIDs, matches no GPU: [] (no reading, no check)."""
    rows = [[c.strip() for c in line.split(",")] for line in text.splitlines() if line.count(",") >= 3]
    names = [x.strip() for x in visible.split(",")] if visible else [r[0] for r in rows]
    by_uuid = bool(names) and all(x.startswith(("GPU-", "MIG-")) for x in names)
    if not by_uuid and (order or CUDA_ORDER_PCI) != CUDA_ORDER_PCI:
        return []
    out = []
    for name in names:
        row = next((r for r in rows if name and name in (r[0], r[1])), None)
        if row is None or not row[3].replace(".", "").isdigit():
            break
        free = int(float(row[3]) * MIB)
        used = row[4] if len(row) > 4 and row[4].replace(".", "").isdigit() else None
        out.append(Memory("gpu", f"GPU {row[0]} ({row[2]}, nvidia-smi memory.free)", free,
                          None if used is None else free + int(float(used) * MIB), parse_smi_holders(apps, row[1])))
    return out


def parse_smi_free(text: str, visible: str | None, apps: str = "", order: str | None = None) -> Memory | None:
    """The first visible GPU's free memory (``parse_smi_devices``), None where none reads."""
    return next(iter(parse_smi_devices(text, visible, apps, order)), None)


def smi_output(smi: str, query: str) -> str | None:
    """``nvidia-smi QUERY --format=csv,noheader,nounits``'s output, None where it failed."""
    try:
        out = subprocess.run([smi, query, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def gpus_free(smi: str | None = None) -> list[Memory] | None:
    """The free memory of each visible GPU, in CUDA's order (nvidia-smi's rows, ``parse_smi_devices``), its capacity
    and who holds it; None without nvidia-smi or a reading."""
    smi = smi or shutil.which("nvidia-smi")
    if smi is None:
        return None
    gpus = smi_output(smi, SMI_GPU_QUERY)
    if gpus is None:
        return None
    return parse_smi_devices(gpus, os.environ.get("CUDA_VISIBLE_DEVICES"), smi_output(smi, SMI_APPS_QUERY) or "",
                             os.environ.get(CUDA_ORDER_ENV))


def pci_order(environ: dict[str, str] | None = None) -> None:
    """Set $``CUDA_ORDER_ENV`` to ``CUDA_ORDER_PCI`` in ``environ`` (this process's: its workers inherit it) where
    it is not set, so that CUDA numbers the GPUs as nvidia-smi does (``parse_smi_devices``)."""
    (os.environ if environ is None else environ).setdefault(CUDA_ORDER_ENV, CUDA_ORDER_PCI)


def gpu_free(smi: str | None = None) -> Memory | None:
    """The free memory of the GPU a worker will use (``gpus_free``' first), None without nvidia-smi or a reading."""
    return next(iter(gpus_free(smi) or ()), None)


def devices_free(device: str, has_gpu: bool, devices: list[int]) -> list[Memory] | None:
    """Each visible GPU's free memory where a case trains on several GPUs (``--devices`` above 1 on ``--device`` gpu,
    or auto where a GPU is listed), else None (a CPU "device" is a share of the host's memory, read once)."""
    if max(devices or [1]) > 1 and (device == "gpu" or (device == "auto" and has_gpu)):
        return gpus_free()
    return None


def free_memory(device: str, has_gpu: bool) -> Memory | None:
    """What is free where ``--device`` (auto | cpu | gpu) trains: the GPU's memory for gpu (and for auto where a
    GPU is listed: ``has_gpu``), else the host's available RAM."""
    if device == "gpu" or (device == "auto" and has_gpu):
        return gpu_free()
    return host_available()
