"""What else used the machine while a timed window ran: CPU time of other processes, steal, load, and
on the GPU other processes and the clocks' slowdown reasons. Figures, not guesses (issue 29).

A CPU window (``CpuWindow.start()`` ... ``.stop()``) reads three clocks at both ends:

- the machine's busy CPU time: the ``cpu`` line of ``/proc/stat``, user + nice + system + irq +
  softirq jiffies (idle and iowait are not busy; steal is counted on its own), / ``SC_CLK_TCK``;
- this process's own CPU time: ``getrusage`` of itself and of its waited-for children;
- the wall clock (``time.perf_counter``).

Other processes' CPU = busy CPU-seconds - own CPU-seconds - the case's other processes' CPU-seconds, clamped at
0; every figure is given in *cores*: CPU-seconds per wall-second. Steal (time the hypervisor gave another guest) in
cores too. The case's other processes (``case_cpu_s``): where this process is one rank of a case that runs one
process per device (PyTorch DDP: ``dataparallel.WORLD_ENV`` > 1), the worker that launched the ranks and the other
ranks; they are this run's own, not "other processes" (each rank of a 2-device case counted the other's core as
contention: on a 2-core machine always BUSY). Which other processes (``top_others``): /proc's process tables at the
window's two ends name the ones that used the most of it, with their command lines (on the 2x H200 every 1-device
case read "other processes used 28.9-31.3 of 32 cores" and nothing said it was an orphaned ncu target), each absolute
path in them cut to its basename (``path_free``: a saved figure names no folder of the machine it ran on; readers of
figures saved before apply it too).

``is_contended`` is the one rule (constants below): other processes used at least
``max(OTHER_CPU_MIN_CORES, OTHER_CPU_SHARE x NCPU)`` cores, or steal took at least
``max(STEAL_MIN_CORES, STEAL_SHARE x NCPU)``, each beyond the counters' resolution (``TICK_SLACK`` ticks of ``/proc/stat``
per window, in cores of that window). On the GPU (``gpu_state``, from nvidia-smi) another process
with a context on the device, or a clock slowdown reason of ``CONTENDED_CLOCK_REASONS`` (hardware
slowdown, thermal, power brake), counts as contention. Where ``/proc/stat`` cannot be read (not
Linux) a window says "not measured" (``contended`` None); without nvidia-smi ``gpu_state`` is None.

Nothing here imports a framework.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .frameworks.dataparallel import WORLD_ENV

NCPU: int = os.cpu_count() or 1

# --- the rule ------------------------------------------------------------------------------------
OTHER_CPU_MIN_CORES = 0.25  # other processes' CPU at or above this many cores is contention ...
OTHER_CPU_SHARE = 0.10  # ... or this share of the machine's cores, whichever is larger
STEAL_MIN_CORES = 0.10  # the hypervisor took at least this many cores from this guest ...
STEAL_SHARE = 0.05  # ... or this share of its cores (steal on a core this process does not use slows it not)
TICK_SLACK = 2  # /proc/stat ticks per window that a figure may be off by (sampling + truncation)
# /proc/stat must count at least this share of our own CPU time, else its counters do not see this
# machine's processes (gVisor's /proc/stat, for one, stays at zero): the window is not measured.
SEEN_OWN_SHARE = 0.5
RULE = (f"contended where other processes used >= max({OTHER_CPU_MIN_CORES} cores, {OTHER_CPU_SHARE:.0%} of the "
        f"cores) or steal >= max({STEAL_MIN_CORES} cores, {STEAL_SHARE:.0%} of the cores), each beyond {TICK_SLACK} /proc/stat ticks per window; "
        "on the GPU: another process on the device, or a clock slowdown reason (hardware slowdown, thermal, "
        "power brake)")

PROC_STAT = "/proc/stat"
# /proc/stat's cpu line: user nice system idle iowait irq softirq steal guest guest_nice (guest time
# is already inside user and nice).
_BUSY_FIELDS = (0, 1, 2, 5, 6)
_STEAL_FIELD = 7

# NVML's clock event reasons (nvmlClocksEventReasons; nvidia-smi's clocks_event_reasons.active bitmask).
CLOCK_REASONS = {
    0x1: "GPU idle",
    0x2: "applications clocks setting",
    0x4: "SW power cap",
    0x8: "HW slowdown",
    0x10: "sync boost",
    0x20: "SW thermal slowdown",
    0x40: "HW thermal slowdown",
    0x80: "HW power brake slowdown",
    0x100: "display clock setting",
}
# Reasons that say something other than this process held the clocks down.
CONTENDED_CLOCK_REASONS = frozenset({"HW slowdown", "SW thermal slowdown", "HW thermal slowdown",
                                     "HW power brake slowdown"})
GPU_FIELDS = ("index", "uuid", "clocks.sm", "clocks.max.sm")
GPU_REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")  # newer, older drivers
NVIDIA_SMI_TIMEOUT_S = 20


# --- CPU ------------------------------------------------------------------------------------------
def parse_proc_stat(text: str) -> tuple[int, int | None]:
    """(busy jiffies, steal jiffies or None where the kernel has no steal column) of /proc/stat's
    aggregate ``cpu`` line."""
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            values = [int(v) for v in parts[1:]]
            if len(values) < 7:
                raise ValueError(f"{PROC_STAT}: a cpu line of {len(values)} fields: {line!r}")
            steal = values[_STEAL_FIELD] if len(values) > _STEAL_FIELD else None
            return sum(values[i] for i in _BUSY_FIELDS), steal
    raise ValueError(f"{PROC_STAT}: no aggregate cpu line")


def read_proc_stat() -> str | None:
    """The text of /proc/stat, or None where there is none (not Linux)."""
    try:
        with open(PROC_STAT) as fh:
            return fh.read()
    except OSError:
        return None


def own_cpu_s() -> float:
    """CPU-seconds (user + system) of this process and of its children that it has waited for."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        total += r.ru_utime + r.ru_stime
    return total


# /proc/<pid>/stat after the command's ")": state ppid pgrp ...; utime stime, cutime cstime at these places
_STAT_PPID, _STAT_OWN, _STAT_CHILDREN = 1, slice(11, 13), slice(13, 15)
TOP_OTHERS = 3  # the other processes a window names, those that used the most CPU in it ...
TOP_MIN_CORES = 0.1  # ... each at least this many cores
CMDLINE_CHARS = 100  # of a named process's command line (the busiest one's first 60 in a summary's text)
TEXT_COMMAND_CHARS = 60


@dataclass(frozen=True)
class Proc:
    """One process as /proc/<pid>/stat has it."""

    ppid: int
    name: str  # the command's name (stat's comm, at most 15 characters)
    ticks: int  # user + system
    child_ticks: int  # its waited-for children's user + system


def process_table(proc_root: str = "/proc") -> dict[int, Proc]:
    """Every process /proc lists (one that ends while it is read is left out)."""
    table = {}
    for entry in os.scandir(proc_root):
        if not entry.name.isdigit():
            continue
        try:
            with open(os.path.join(entry.path, "stat")) as fh:
                text = fh.read()
            head, _, rest = text.rpartition(")")
            fields = rest.split()
            table[int(entry.name)] = Proc(int(fields[_STAT_PPID]), head.partition("(")[2],
                                          sum(int(v) for v in fields[_STAT_OWN]),
                                          sum(int(v) for v in fields[_STAT_CHILDREN]))
        except (OSError, IndexError, ValueError):
            continue
    return table


def rank_of_several(world: str | None = None) -> bool:
    """Whether this process is one rank of a case of several processes (``world``, else $``WORLD_ENV``, above 1)."""
    world = os.environ.get(WORLD_ENV) if world is None else world
    return (world or "").isdigit() and int(world) >= 2


def case_pids(table: dict[int, Proc], pid: int | None = None, ppid: int | None = None) -> set[int]:
    """This rank's case's other processes in ``table``: its parent (the worker that launched the ranks) and its
    parent's other children (the other ranks)."""
    pid = os.getpid() if pid is None else pid
    ppid = os.getppid() if ppid is None else ppid
    return {q for q, p in table.items() if q != pid and (q == ppid or p.ppid == ppid)}


def case_cpu_s(proc_root: str = "/proc", pid: int | None = None, ppid: int | None = None,
               world: str | None = None) -> float | None:
    """CPU-seconds (user + system, with their waited-for children's) of this case's other processes (``case_pids``),
    read from /proc/<pid>/stat, where this process is a rank of several (``rank_of_several``); None for a case of
    one process."""
    if not rank_of_several(world):
        return None
    table = process_table(proc_root)
    return sum(table[q].ticks + table[q].child_ticks for q in case_pids(table, pid, ppid)) / clock_ticks()


def command_line(pid: int, name: str, proc_root: str = "/proc") -> str:
    """Process ``pid``'s command line, path-free (``path_free``; its first ``CMDLINE_CHARS`` characters), else
    ``name``."""
    try:
        with open(os.path.join(proc_root, str(pid), "cmdline"), "rb") as fh:
            line = " ".join(fh.read(4 * CMDLINE_CHARS).replace(b"\0", b" ").decode(errors="replace").split())
    except OSError:
        return name
    return _cut(path_free(line), CMDLINE_CHARS) or name


# an absolute path in a command line: a word's start, or after "=" (--out=/x/y), ":" or "," (a list of them)
ABSOLUTE_PATH = re.compile(r"(?<![^\s=:,(\[])/[^\s=:,;)\]]*")


def path_free(text: str) -> str:
    """``text`` (a command line, a summary's words) with each absolute path cut to its basename
    (``/work/main/.nox/frameworks/bin/python -m kernelmap.worker --out=/tmp/r/x`` reads ``python -m kernelmap.worker
    --out=x``): what a saved run says of other processes leaks no local folder and reads the same on any machine."""
    return ABSOLUTE_PATH.sub(lambda m: m.group().rstrip("/").rpartition("/")[2] or m.group(), text)


def path_free_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """A saved ``summarise`` (or a window) with ``path_free`` words: its text, reasons and processes' commands (one
    saved before ``command_line`` cut them)."""
    out = dict(summary)
    if isinstance(out.get("text"), str):
        out["text"] = path_free(out["text"])
    if isinstance(out.get("reasons"), list):
        out["reasons"] = [path_free(r) if isinstance(r, str) else r for r in out["reasons"]]
    if isinstance(out.get("top_other"), list):
        out["top_other"] = [{**t, "command": path_free(t["command"])} if isinstance(t, dict)
                            and isinstance(t.get("command"), str) else t for t in out["top_other"]]
    return out


def _cut(text: str, n: int) -> str:
    return text[:n - 3] + "..." if len(text) > n else text


def top_others(before: dict[int, Proc], after: dict[int, Proc], wall_s: float, clk_tck: int,
               exclude: set[int], proc_root: str = "/proc") -> list[dict[str, Any]]:
    """The processes but ``exclude`` that used the most CPU between two process tables (``TOP_OTHERS`` of them, each
    at least ``TOP_MIN_CORES``; one that started between them: all its CPU), most first: {"pid", "name", "cores",
    "command"}."""
    rows = []
    for pid, p in after.items():
        b = before.get(pid)
        if pid in exclude or wall_s <= 0 or (b is not None and b.name != p.name):
            continue
        cores = (p.ticks - (b.ticks if b is not None else 0)) / clk_tck / wall_s
        if cores >= TOP_MIN_CORES:
            rows.append({"pid": pid, "name": p.name, "cores": _round(cores)})
    rows.sort(key=lambda r: -r["cores"])
    return [{**r, "command": command_line(r["pid"], r["name"], proc_root)} for r in rows[:TOP_OTHERS]]


def load1() -> float | None:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def clock_ticks() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK"))
    except (AttributeError, ValueError, OSError):
        return 100


@dataclass(frozen=True)
class CpuSources:
    """Where a ``CpuWindow`` reads its clocks (tests give their own)."""

    proc_stat: Callable[[], str | None] = read_proc_stat
    own_cpu_s: Callable[[], float] = own_cpu_s
    wall_s: Callable[[], float] = time.perf_counter
    load1: Callable[[], float | None] = load1
    case_cpu_s: Callable[[], float | None] = case_cpu_s
    clk_tck: int = clock_ticks()
    ncpu: int = NCPU
    processes: Callable[[], dict[int, Proc] | None] = lambda: None  # the process tables the top others come from


SYSTEM = CpuSources(processes=process_table)


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


@dataclass
class CpuWindow:
    """One timed window's view of the machine; start it and stop it outside the timed blocks."""

    sources: CpuSources
    wall0: float
    own0: float
    stat0: str | None
    case0: float | None = None
    procs0: dict[int, Proc] | None = None

    @classmethod
    def start(cls, sources: CpuSources = SYSTEM) -> CpuWindow:
        procs = sources.processes()
        # the case's /proc walk inside the own-CPU bracket (own first at start, last at stop): its CPU is this
        # process's, counted busy by /proc/stat between the two stat reads, so it must be counted own too
        stat = sources.proc_stat()
        wall = sources.wall_s()
        own = sources.own_cpu_s()
        case = sources.case_cpu_s()
        return cls(sources, wall, own, stat, case, procs)

    def stop(self) -> dict[str, Any]:
        """{"wall_s", "own_cpu_cores", "case_cpu_cores", "other_cpu_cores", "steal_cores", "ncpu", "load1",
        "resolution_cores", "measured", "why_not", "contended", "top_other"}: cores = CPU-seconds per wall-second of
        the window; ``case_cpu_cores``: the case's other processes (``case_cpu_s``; None for a case of one process),
        left out of "other"; ``top_other``: the other processes that used the most of it (``top_others``; None where
        the sources read no process tables)."""
        src = self.sources
        case1 = src.case_cpu_s()  # before own: see ``start``
        own1 = src.own_cpu_s()
        wall1 = src.wall_s()
        stat1 = src.proc_stat()
        procs1 = src.processes()
        wall = wall1 - self.wall0
        own = own1 - self.own0
        case = None if self.case0 is None or case1 is None else max(case1 - self.case0, 0.0)
        window: dict[str, Any] = {
            "wall_s": _round(wall), "own_cpu_cores": _round(own / wall) if wall > 0 else None,
            "case_cpu_cores": _round(case / wall) if case is not None and wall > 0 else None,
            "other_cpu_cores": None, "steal_cores": None, "ncpu": src.ncpu, "load1": src.load1(),
            "resolution_cores": None, "measured": False, "why_not": None,
        }
        if self.stat0 is None or stat1 is None:
            window["why_not"] = f"{PROC_STAT} cannot be read here"
        elif wall <= 0:
            window["why_not"] = "the window took no time"
        else:
            busy0, steal0 = parse_proc_stat(self.stat0)
            busy1, steal1 = parse_proc_stat(stat1)
            busy_s = (busy1 - busy0) / src.clk_tck
            if busy_s + TICK_SLACK / src.clk_tck < SEEN_OWN_SHARE * own:
                window["why_not"] = (f"{PROC_STAT} counted {busy_s:.2f} busy CPU-seconds while this process alone "
                                     f"used {own:.2f}: its counters do not see this machine's processes (a sandbox?)")
            else:
                window.update(
                    other_cpu_cores=_round(max(busy_s - own - (case or 0.0), 0.0) / wall),
                    steal_cores=(None if steal0 is None or steal1 is None
                                 else _round(max(steal1 - steal0, 0) / src.clk_tck / wall)),
                    resolution_cores=_round(TICK_SLACK / src.clk_tck / wall),
                    measured=True,
                )
        window["contended"] = is_contended(window)
        window["top_other"] = None
        if self.procs0 is not None and procs1 is not None:
            exclude = {os.getpid()} | (case_pids(procs1) if self.case0 is not None else set())
            window["top_other"] = top_others(self.procs0, procs1, wall, src.clk_tck, exclude)
        return window


def other_cpu_threshold(ncpu: int) -> float:
    """Cores of other processes' CPU from which a window is contended (the rule's first half)."""
    return max(OTHER_CPU_MIN_CORES, OTHER_CPU_SHARE * ncpu)


def steal_threshold(ncpu: int) -> float:
    """Cores of steal from which a window is contended (the rule's second half)."""
    return max(STEAL_MIN_CORES, STEAL_SHARE * ncpu)


def _over(cores: float | None, slack: float, threshold: float) -> bool:
    # figures are kept to 4 decimals: compare at that precision (0.12 - 0.02 is not below 0.1)
    return round((cores or 0.0) - slack, 4) >= threshold


def contended_by(window: dict[str, Any]) -> tuple[bool, bool]:
    """(other processes' CPU, steal) each at or above its threshold in ``window`` beyond its tick slack."""
    slack = window.get("resolution_cores") or 0.0
    return (_over(window.get("other_cpu_cores"), slack, other_cpu_threshold(window["ncpu"])),
            _over(window.get("steal_cores"), slack, steal_threshold(window["ncpu"])))


def is_contended(window: dict[str, Any]) -> bool | None:
    """The rule (``RULE``): None where the window was not measured."""
    if not window.get("measured"):
        return None
    return any(contended_by(window))


# --- GPU ------------------------------------------------------------------------------------------
def _run_nvidia_smi(args: Sequence[str]) -> tuple[int, str]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise FileNotFoundError("nvidia-smi")
    proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S)
    return proc.returncode, proc.stdout + proc.stderr


def clock_reasons(mask: str) -> list[str] | None:
    """Names of the reasons set in nvidia-smi's ``clocks_event_reasons.active`` ("0x...."); None where
    the driver reports none ("[N/A]", "[Not Supported]")."""
    try:
        bits = int(mask.strip(), 16)
    except ValueError:
        return None
    names = [name for bit, name in CLOCK_REASONS.items() if bits & bit]
    unknown = bits & ~sum(CLOCK_REASONS)
    return names + ([f"unknown reason 0x{unknown:x}"] if unknown else [])


def _number(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None


def _chosen_gpu(rows: list[list[str]], visible: str | None) -> list[str]:
    """The row of the GPU this process uses: the first of CUDA_VISIBLE_DEVICES (index or UUID), else the first."""
    first = (visible or "").split(",")[0].strip()
    for row in rows:
        if first and (row[0] == first or row[1] == first or (first.startswith("GPU-") and row[1].startswith(first))):
            return row
    return rows[0]


def gpu_state(run: Callable[[Sequence[str]], tuple[int, str]] = _run_nvidia_smi, own_pid: int | None = None,
              visible: str | None = None) -> dict[str, Any] | None:
    """The GPU this process uses, as nvidia-smi reports it now: {"index", "sm_clock_mhz", "max_sm_clock_mhz",
    "clock_reasons": [str] | None, "compute_processes": [pids of other processes with a context on the GPU]
    | None (where this process is not in nvidia-smi's list: another PID namespace, processes not visible)}.
    None without nvidia-smi or where it reports no GPU."""
    own_pid = os.getpid() if own_pid is None else own_pid
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    try:
        for reasons_field in GPU_REASON_FIELDS:
            rc, out = run([f"--query-gpu={','.join((*GPU_FIELDS, reasons_field))}", "--format=csv,noheader,nounits"])
            if rc == 0 or reasons_field not in out:  # an older driver names the field as not valid: try the next
                break
        if rc != 0:
            return None
        rows = [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.count(",") >= 4]
        if not rows:
            return None
        index, uuid, sm, sm_max, mask = _chosen_gpu(rows, visible)[:5]
        rc, apps = run(["--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"])
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    pids: list[int] | None = None
    if rc == 0:
        on_gpu = [int(p) for p, _, g in (line.partition(",") for line in apps.splitlines())
                  if p.strip().isdigit() and g.strip() == uuid]
        pids = sorted(p for p in on_gpu if p != own_pid) if own_pid in on_gpu else None
    return {"index": int(index) if index.isdigit() else index, "sm_clock_mhz": _number(sm),
            "max_sm_clock_mhz": _number(sm_max), "clock_reasons": clock_reasons(mask), "compute_processes": pids}


def gpu_contention(state: dict[str, Any]) -> list[str]:
    """Why one ``gpu_state`` is contended ([] where it is not)."""
    why = []
    others = state.get("compute_processes")
    if others:
        why.append(f"{len(others)} other process{'es' if len(others) > 1 else ''} on the GPU "
                   f"(pid {', '.join(str(p) for p in others)})")
    held = [r for r in state.get("clock_reasons") or () if r in CONTENDED_CLOCK_REASONS]
    if held:
        why.append(f"GPU clocks held down ({', '.join(held)})")
    return why


# --- summaries ----------------------------------------------------------------------------------
def summarise(windows: Iterable[dict[str, Any]], gpu: Iterable[dict[str, Any] | None] = ()) -> dict[str, Any]:
    """One figure of many windows (a trial, a pass, a case's trials) and of the GPU states read around
    them: contended where any measured window is (``is_contended``) or any GPU state is (``gpu_contention``);
    None where no window was measured and the GPU says nothing against it. ``text``: what a reader sees."""
    windows = list(windows)
    states = [g for g in gpu if g]
    measured = [w for w in windows if w.get("measured")]
    ncpu = next((w["ncpu"] for w in windows if w.get("ncpu")), NCPU)
    other = [w["other_cpu_cores"] for w in measured]
    steal = [w["steal_cores"] for w in measured if w.get("steal_cores") is not None]
    loads = [w["load1"] for w in windows if w.get("load1") is not None]
    busy = [w for w in measured if is_contended(w)]
    busy_other = [w for w in busy if contended_by(w)[0]]
    busy_steal = [w for w in busy if contended_by(w)[1]]
    up_to = "up to " if len(measured) > 1 else ""
    reasons: list[str] = []
    top = tops_of(busy_other)
    if busy_other:
        most = "".join(f" (most: pid {t['pid']} {_cut(t['command'], TEXT_COMMAND_CHARS)}, {t['cores']:.1f} cores)"
                       for t in top[:1])  # the others in top_other: the console's column stays one short line
        reasons.append(f"other processes used {up_to}{max(other):.1f} of {ncpu} cores{most}")
    if busy_steal:
        reasons.append(f"the hypervisor stole {up_to}{max(steal):.1f} cores")
    gpu_reasons = list(dict.fromkeys(r for s in states for r in gpu_contention(s)))
    reasons += gpu_reasons
    seen_pids = [s["compute_processes"] for s in states if s.get("compute_processes") is not None]
    if reasons:
        contended: bool | None = True
        text = "; ".join(reasons)
    elif measured:
        contended = False
        text = f"quiet: other processes used at most {max(other):.2f} of {ncpu} cores"
    else:
        contended = None
        why = next((w["why_not"] for w in windows if w.get("why_not")), "no timed window")
        text = f"not measured: {why}"
    return {
        "contended": contended, "reasons": reasons, "text": text,
        "other_cpu_cores_max": max(other) if other else None,
        "other_cpu_cores_median": _round(statistics.median(other)) if other else None,
        "steal_cores_max": max(steal) if steal else None,
        "load1_max": max(loads) if loads else None,
        "ncpu": ncpu, "windows": len(windows), "windows_measured": len(measured), "windows_contended": len(busy),
        "gpu_other_processes": max(len(p) for p in seen_pids) if seen_pids else None,
        "gpu_clock_reasons": sorted({r for s in states for r in s.get("clock_reasons") or ()}),
        "top_other": top,
    }


def tops_of(windows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The other processes the windows name (``top_other``), each once with its most cores, most first
    (``TOP_OTHERS`` of them)."""
    best: dict[int, dict[str, Any]] = {}
    for w in windows:
        for t in w.get("top_other") or ():
            if t["pid"] not in best or t["cores"] > best[t["pid"]]["cores"]:
                best[t["pid"]] = t
    return sorted(best.values(), key=lambda t: -t["cores"])[:TOP_OTHERS]
