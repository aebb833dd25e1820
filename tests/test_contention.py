"""kernelmap.contention: CPU windows from /proc/stat and getrusage, the contention rule, GPU states from
nvidia-smi, summaries. /proc/stat lines are real ones of the 2-core test machine (kernel 6.18), taken
one second apart; the figures are worked out by hand in each test."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from kernelmap import contention
from kernelmap.contention import CpuSources, CpuWindow

# /proc/stat's aggregate line: user nice system idle iowait irq softirq steal guest guest_nice
STAT_0 = "cpu  16282 0 5199 25300 1711 0 211 526 0 0\ncpu0 6106 0 2553 13391 727 0 83 262 0 0\n"
STAT_1 = "cpu  16374 0 5209 25397 1712 0 211 527 0 0\ncpu0 6152 0 2558 13440 727 0 83 262 0 0\n"
# busy = user + nice + system + irq + softirq: 16282 + 5199 + 211 = 21692, then 21794 (+102 jiffies = 1.02 s)
OLD_KERNEL = "cpu  16282 0 5199 25300 1711 0 211\n"  # no steal column (Linux < 2.6.11)


def scripted(stats, owns, walls, ncpu=2, load=1.35, clk_tck=100):
    """CpuSources that return the given readings in turn (start, then stop)."""
    it_stat, it_own, it_wall = iter(stats), iter(owns), iter(walls)
    return CpuSources(proc_stat=lambda: next(it_stat), own_cpu_s=lambda: next(it_own),
                      wall_s=lambda: next(it_wall), load1=lambda: load, clk_tck=clk_tck, ncpu=ncpu)


def window(own_s: float, stats=(STAT_0, STAT_1), wall=(100.0, 101.0), ncpu=2) -> dict:
    return CpuWindow.start(scripted(stats, (0.25, 0.25 + own_s), wall, ncpu=ncpu)).stop()


def test_parse_proc_stat_reads_busy_and_steal_of_the_aggregate_line():
    assert contention.parse_proc_stat(STAT_0) == (21692, 526)
    assert contention.parse_proc_stat(STAT_1) == (21794, 527)
    assert contention.parse_proc_stat(OLD_KERNEL) == (21692, None)
    with pytest.raises(ValueError, match="no aggregate cpu line"):
        contention.parse_proc_stat("cpu0 1 2 3 4 5 6 7\n")


def test_other_processes_are_busy_time_less_our_own():
    w = window(own_s=0.5)  # 1.02 busy CPU-seconds in 1 s, 0.5 of them ours
    assert w["wall_s"] == 1.0 and w["own_cpu_cores"] == 0.5
    assert w["other_cpu_cores"] == 0.52 and w["steal_cores"] == 0.01
    assert w["resolution_cores"] == 0.02 and w["ncpu"] == 2 and w["load1"] == 1.35
    assert w["measured"] is True and w["contended"] is True  # 0.52 - 0.02 >= 0.25
    quiet = window(own_s=1.0)
    assert quiet["other_cpu_cores"] == 0.02 and quiet["contended"] is False
    assert window(own_s=1.5)["other_cpu_cores"] == 0.0  # never below zero
    half = window(own_s=0.5, wall=(10.0, 12.0))  # the same ticks over 2 s
    assert half["other_cpu_cores"] == 0.26 and half["resolution_cores"] == 0.01


def test_the_rule_threshold_and_the_tick_slack():
    base = {"measured": True, "ncpu": 2, "steal_cores": 0.0, "resolution_cores": 0.02}
    assert contention.other_cpu_threshold(2) == 0.25 and contention.other_cpu_threshold(16) == 1.6
    assert contention.is_contended({**base, "other_cpu_cores": 0.27}) is True
    assert contention.is_contended({**base, "other_cpu_cores": 0.26}) is False  # within the counters' slack
    assert contention.is_contended({**base, "ncpu": 16, "other_cpu_cores": 1.5}) is False  # 10% of 16 cores
    assert contention.is_contended({**base, "ncpu": 16, "other_cpu_cores": 1.7}) is True
    assert contention.is_contended({**base, "other_cpu_cores": 0.0, "steal_cores": 0.12}) is True
    assert contention.is_contended({**base, "other_cpu_cores": 0.0, "steal_cores": 0.11}) is False
    # the H200 machine (16 cores), a 0.1 s window: 6 ticks of steal, 0.6 cores, on cores this process need not use
    assert contention.steal_threshold(2) == 0.1 and contention.steal_threshold(16) == 0.8
    assert contention.is_contended({**base, "ncpu": 16, "other_cpu_cores": 0.0, "steal_cores": 0.6,
                                    "resolution_cores": 0.2}) is False
    assert contention.is_contended({**base, "ncpu": 16, "other_cpu_cores": 0.0, "steal_cores": 1.0,
                                    "resolution_cores": 0.2}) is True
    assert contention.is_contended({**base, "other_cpu_cores": None, "measured": False}) is None


def test_without_proc_stat_a_window_is_not_measured():
    w = CpuWindow.start(scripted((None, None), (0.0, 0.4), (5.0, 6.0))).stop()
    assert (w["measured"], w["contended"], w["other_cpu_cores"]) == (False, None, None)
    assert w["own_cpu_cores"] == 0.4 and "/proc/stat cannot be read" in w["why_not"]
    s = contention.summarise([w])
    assert s["contended"] is None and s["text"] == "not measured: /proc/stat cannot be read here"
    assert s["windows"] == 1 and s["windows_measured"] == 0 and s["other_cpu_cores_max"] is None


def test_summarise_names_the_worst_window():
    busy, quiet = window(own_s=0.5), window(own_s=1.0)
    s = contention.summarise([quiet, busy, quiet])
    assert s["contended"] is True and s["text"] == "other processes used up to 0.5 of 2 cores"
    assert s["reasons"] == [s["text"]]
    assert (s["windows"], s["windows_contended"], s["other_cpu_cores_max"]) == (3, 1, 0.52)
    assert s["other_cpu_cores_median"] == 0.02 and s["steal_cores_max"] == 0.01 and s["load1_max"] == 1.35
    q = contention.summarise([quiet])
    assert q["contended"] is False and q["text"] == "quiet: other processes used at most 0.02 of 2 cores"
    assert q["gpu_other_processes"] is None and q["gpu_clock_reasons"] == []
    one = contention.summarise([busy])
    assert one["text"] == "other processes used 0.5 of 2 cores"  # one window: no "up to"


# --- GPU: nvidia-smi output as the H100 machine's driver prints it ------------------------------------
UUID = "GPU-8f6c0a4e-2b1d-4f39-9a53-2f1d0e6c7b11"
OTHER_UUID = "GPU-0b3e9d1c-7a54-4e2f-8c61-5d9a3f2e1c07"


def fake_smi(gpus: str, apps: str, event_field_valid: bool = True, calls=None):
    def run(args):
        if calls is not None:
            calls.append(list(args))
        if args[0].startswith("--query-gpu"):
            if "clocks_event_reasons.active" in args[0] and not event_field_valid:
                return 2, ('Field "clocks_event_reasons.active" is not a valid field to query.\n\n'
                           "Run nvidia-smi --help-query-gpu for a list of valid fields\n")
            return 0, gpus
        return 0, apps
    return run


def test_gpu_state_reads_clocks_reasons_and_other_processes():
    gpus = f"0, {UUID}, 1755, 1980, 0x0000000000000000\n1, {OTHER_UUID}, 345, 1980, 0x0000000000000001\n"
    apps = f"4242, {UUID}\n777, {UUID}\n999, {OTHER_UUID}\n"
    g = contention.gpu_state(fake_smi(gpus, apps), own_pid=4242, visible="0")
    assert g == {"index": 0, "sm_clock_mhz": 1755.0, "max_sm_clock_mhz": 1980.0, "clock_reasons": [],
                 "compute_processes": [777]}
    assert contention.gpu_contention(g) == ["1 other process on the GPU (pid 777)"]
    second = contention.gpu_state(fake_smi(gpus, apps), own_pid=999, visible="1")
    assert second["clock_reasons"] == ["GPU idle"] and second["compute_processes"] == []
    assert contention.gpu_contention(second) == []  # idle is not contention
    by_uuid = contention.gpu_state(fake_smi(gpus, apps), own_pid=999, visible=OTHER_UUID)
    assert by_uuid["index"] == 1


def test_gpu_processes_not_visible_and_slowdown_reasons():
    gpus = f"0, {UUID}, 1410, 1980, 0x0000000000000048\n"  # HW slowdown + HW thermal slowdown
    g = contention.gpu_state(fake_smi(gpus, ""), own_pid=4242, visible="")  # our own pid not listed
    assert g["compute_processes"] is None
    assert g["clock_reasons"] == ["HW slowdown", "HW thermal slowdown"]
    assert contention.gpu_contention(g) == ["GPU clocks held down (HW slowdown, HW thermal slowdown)"]
    s = contention.summarise([window(own_s=1.0)], [g, None])
    assert s["contended"] is True and s["text"] == "GPU clocks held down (HW slowdown, HW thermal slowdown)"
    assert s["gpu_clock_reasons"] == ["HW slowdown", "HW thermal slowdown"] and s["gpu_other_processes"] is None
    power = contention.gpu_state(fake_smi(f"0, {UUID}, 1700, 1980, 0x0000000000000004\n", ""), own_pid=1)
    assert power["clock_reasons"] == ["SW power cap"] and contention.gpu_contention(power) == []
    na = contention.gpu_state(fake_smi(f"0, {UUID}, 1700, 1980, [N/A]\n", ""), own_pid=1)
    assert na["clock_reasons"] is None


def test_gpu_state_falls_back_to_the_throttle_field_of_older_drivers():
    calls: list[list[str]] = []
    gpus = f"0, {UUID}, 1410, 1410, 0x0000000000000000\n"
    g = contention.gpu_state(fake_smi(gpus, f"4242, {UUID}\n", event_field_valid=False, calls=calls), own_pid=4242)
    assert "clocks_event_reasons.active" in calls[0][0] and "clocks_throttle_reasons.active" in calls[1][0]
    assert g["clock_reasons"] == [] and g["compute_processes"] == []


def test_no_nvidia_smi_means_no_gpu_state():
    def missing(args):
        raise FileNotFoundError("nvidia-smi")

    assert contention.gpu_state(missing) is None
    assert contention.gpu_state(lambda args: (9, "NVIDIA-SMI has failed because it couldn't communicate "
                                                  "with the NVIDIA driver.")) is None


# --- the real clocks ----------------------------------------------------------------------------------
def test_a_busy_process_beside_the_window_is_measured():
    """A busy loop in another process for ~1 s: the window sees at least half a core of other CPU, at
    least what /proc/<pid>/stat charged that process (its CPU is not ours: never waited for within it)."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)  # past its start-up
        ticks0 = _proc_ticks(hog.pid)
        w = CpuWindow.start()
        time.sleep(1.0)
        ticks1 = _proc_ticks(hog.pid)
        w = w.stop()
    finally:
        hog.kill()
        hog.wait()
    hog_cores = (ticks1 - ticks0) / contention.clock_ticks() / w["wall_s"]
    assert w["measured"] and w["ncpu"] == os.cpu_count()
    assert w["other_cpu_cores"] > 0.5, w
    assert w["other_cpu_cores"] >= hog_cores - w["resolution_cores"] - 0.05, (w, hog_cores)
    assert w["own_cpu_cores"] < 0.2  # this process slept


def test_our_own_busy_loop_is_our_own_cpu():
    w = CpuWindow.start()
    t_end = time.perf_counter() + 0.8
    while time.perf_counter() < t_end:
        pass
    w = w.stop()
    assert 0.3 < w["own_cpu_cores"] <= 1.05, w  # one thread, busy (shared with whatever else runs here)


def _proc_ticks(pid: int) -> int:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))


def test_a_proc_stat_that_misses_our_own_cpu_is_not_measured():
    """gVisor's /proc/stat stays at zero: a window there would read 'quiet' whatever ran beside it."""
    frozen = "cpu  0 0 0 0 0 0 0 0 0 0\n"
    w = CpuWindow.start(scripted((frozen, frozen), (0.0, 0.9), (5.0, 6.0))).stop()
    assert (w["measured"], w["contended"], w["other_cpu_cores"]) == (False, None, None)
    assert w["why_not"] == ("/proc/stat counted 0.00 busy CPU-seconds while this process alone used 0.90: its "
                            "counters do not see this machine's processes (a sandbox?)")
    # counting half of our own time, within two ticks, is still measured (children reaped in the window)
    w = CpuWindow.start(scripted((STAT_0, STAT_1), (0.0, 2.0), (5.0, 6.0))).stop()
    assert w["measured"] and w["other_cpu_cores"] == 0.0
    assert not CpuWindow.start(scripted((STAT_0, STAT_1), (0.0, 2.2), (5.0, 6.0))).stop()["measured"]


# --- a case of several processes: the other ranks and their launcher are the case's own ---------------------------
def test_the_cases_other_processes_are_not_other_processes():
    """A rank of a 2-device case (PyTorch DDP: one process per device) counted the other rank's core as another
    process's: on the 2-core machine every such pass read BUSY. Its case's other processes (``case_cpu_s``: the
    launcher and the other ranks) are left out of "other" and said apart."""
    cases = iter((3.0, 3.4))  # the other rank used 0.4 CPU-seconds in the window
    src = CpuSources(proc_stat=iter((STAT_0, STAT_1)).__next__, own_cpu_s=iter((0.25, 0.75)).__next__,
                     wall_s=iter((100.0, 101.0)).__next__, load1=lambda: 1.35, case_cpu_s=lambda: next(cases),
                     clk_tck=100, ncpu=2)
    w = CpuWindow.start(src).stop()
    # 1.02 busy CPU-seconds: 0.5 ours, 0.4 the other rank's, 0.12 others'
    assert (w["own_cpu_cores"], w["case_cpu_cores"], w["other_cpu_cores"]) == (0.5, 0.4, 0.12)
    assert w["contended"] is False  # 0.12 - 0.02 < 0.25; with the other rank counted: 0.52, contended
    assert window(own_s=0.5)["case_cpu_cores"] is None and window(own_s=0.5)["contended"] is True  # one process


class _Machine:
    """A machine whose clocks move only when read: the case's /proc walk (``case_cpu_s``) costs this process 0.3
    CPU-seconds (30 ticks busy in /proc/stat, 0.3 s own), as the real walk is this process's CPU; nothing else runs,
    and the other rank is idle."""

    def __init__(self) -> None:
        self.busy, self.own, self.wall = 21692, 0.25, 100.0

    def stat(self) -> str:
        return f"cpu  {self.busy} 0 0 25300 1711 0 0 526 0 0\n"

    def case_cpu_s(self) -> float:
        self.busy, self.own = self.busy + 30, self.own + 0.3
        return 3.0

    def sources(self) -> CpuSources:
        return CpuSources(proc_stat=self.stat, own_cpu_s=lambda: self.own, wall_s=lambda: self.wall,
                          load1=lambda: 1.0, case_cpu_s=self.case_cpu_s, clk_tck=100, ncpu=2)


def test_the_case_walk_is_this_processs_own_cpu_not_another_processs():
    """The walk's CPU falls between the two /proc/stat reads (busy) and must fall between the two own reads too:
    read stat, own, case at the start and case, own, stat at the stop. Read case between stat and own (as before)
    and the two walks (0.6 CPU-seconds in a 1 s window) read as 0.6 cores of other processes: BUSY on 2 cores."""
    m = _Machine()
    w = CpuWindow.start(m.sources())
    m.wall += 1.0
    w = w.stop()
    assert (w["own_cpu_cores"], w["case_cpu_cores"], w["other_cpu_cores"], w["contended"]) == (0.6, 0.0, 0.0, False)


def test_case_cpu_is_none_for_a_case_of_one_process():
    assert contention.case_cpu_s(world="1") is None and contention.case_cpu_s(world="") is None


# a launcher (the worker that starts the ranks) that spends CPU, starts one rank that spends CPU and waits, then a
# second rank that reads case_cpu_s; each reports its own process_time (clock_gettime: not /proc)
_SPIN = "import time\nt = time.process_time() + {s}\nwhile time.process_time() < t: pass\n"
_RANK_BUSY = _SPIN.format(s=0.3) + "import sys\nprint(time.process_time(), flush=True)\nsys.stdin.read()\n"
_RANK_READS = "from kernelmap import contention\nprint(contention.case_cpu_s(), flush=True)\n"
_LAUNCHER = _SPIN.format(s=0.2) + f"""import os, subprocess, sys
env = dict(os.environ, {contention.WORLD_ENV}="2")
busy = subprocess.Popen([sys.executable, "-c", {_RANK_BUSY!r}], env=env, stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE, text=True)
busy_cpu = float(busy.stdout.readline())
before = time.process_time()
seen = float(subprocess.run([sys.executable, "-c", {_RANK_READS!r}], env=env, capture_output=True,
                            text=True, check=True).stdout)
after = time.process_time()
busy.communicate("")
print(busy_cpu, before, after, seen)
"""


def test_case_cpu_reads_the_launcher_and_the_other_ranks_from_proc():
    out = subprocess.run([sys.executable, "-c", _LAUNCHER], capture_output=True, text=True, check=True, timeout=120)
    busy_cpu, before, after, seen = (float(x) for x in out.stdout.split())
    tick = 1 / contention.clock_ticks()
    # /proc gives each process's user and system time in whole ticks, each cut down (two processes here: up to 4
    # ticks under their clocks): the launcher's between its two reads, the busy rank's
    assert busy_cpu >= 0.3 and before >= 0.2
    assert before + busy_cpu - 4 * tick <= seen <= after + busy_cpu + 4 * tick, (busy_cpu, before, after, seen)


# --- which other processes: the window names those that used the most of it --------------------------------------
def _table(*rows):
    return {pid: contention.Proc(ppid, name, ticks, 0) for pid, ppid, name, ticks in rows}


def test_a_window_names_the_other_processes_that_used_most_of_it():
    """On the 2x H200 every 1-device case read "other processes used 28.9-31.3 of 32 cores" and said nothing of
    whom: an orphaned ncu target (pid 8715) of an earlier run set. The window now names them from /proc's tables at
    its two ends: the ones of at least 0.1 cores, most first, three at most; one that started within it: all its CPU."""
    before = _table((8715, 1, "python3.12", 1000), (20, 1, "sshd", 50), (30, 1, "idle", 7), (40, 1, "small", 0))
    after = _table((8715, 1, "python3.12", 1000 + 2950), (20, 1, "sshd", 62), (30, 1, "idle", 7), (40, 1, "small", 5),
                   (55, 1, "new", 30))
    src = CpuSources(proc_stat=iter((STAT_0, STAT_1)).__next__, own_cpu_s=iter((0.25, 0.75)).__next__,
                     wall_s=iter((100.0, 101.0)).__next__, load1=lambda: 1.35, clk_tck=100, ncpu=2,
                     processes=iter((before, after)).__next__)
    w = CpuWindow.start(src).stop()
    # 29.5 cores (2950 ticks in 1 s: the table's own figure, not the machine's 2), 0.3 (new), 0.12 (sshd); 0.05 left out
    assert [(t["pid"], t["name"], t["cores"]) for t in w["top_other"]] == [(8715, "python3.12", 29.5), (55, "new", 0.3),
                                                                          (20, "sshd", 0.12)]
    assert all(t["command"] == t["name"] for t in w["top_other"])  # no /proc/<pid>/cmdline of these pids here
    s = contention.summarise([w, {**w, "top_other": [{**w["top_other"][0], "cores": 28.0}]}])
    assert s["text"] == "other processes used up to 0.5 of 2 cores (most: pid 8715 python3.12, 29.5 cores)"
    assert [(t["pid"], t["cores"]) for t in s["top_other"]] == [(8715, 29.5), (55, 0.3), (20, 0.12)]
    assert window(own_s=0.5)["top_other"] is None  # sources without process tables: not named, text as before
    assert contention.summarise([window(own_s=0.5)])["text"] == "other processes used 0.5 of 2 cores"


def test_a_busy_process_is_named_with_its_command_line():
    hog = subprocess.Popen([sys.executable, "-c", "while True:\n pass", "kernelmap-test-hog", "--out=/no/such/dir/x.json"])
    try:
        time.sleep(0.3)
        w = CpuWindow.start()
        time.sleep(1.0)
        w = w.stop()
    finally:
        hog.kill()
        hog.wait()
    named = {t["pid"]: t for t in w["top_other"]}
    assert hog.pid in named, w["top_other"]
    assert named[hog.pid]["cores"] >= 0.3
    # one line, path-free: the program's basename, each absolute path of its arguments its basename
    assert named[hog.pid]["command"] == f"{os.path.basename(sys.executable)} -c while True: pass kernelmap-test-hog " \
                                        "--out=x.json"
    assert os.getpid() not in named


# --- saved figures name no folder of the machine they ran on ----------------------------------------------------
def test_path_free_cuts_each_absolute_path_to_its_basename():
    cut = contention.path_free
    assert cut("/work/main/.nox/frameworks/bin/python -m kernelmap.worker --framework pytorch --out "
               "/work/main/runs/r1/pytorch/bs64") == "python -m kernelmap.worker --framework pytorch --out bs64"
    assert cut("/usr/bin/python3 /tmp/pytest-of-root/x/run.py --log=/var/log/a.log,/var/log/b.log") == \
        "python3 run.py --log=a.log,b.log"
    # a relative path, a ratio and a path cut short by the summary stay as they are but for the folders
    assert cut(".nox/frameworks/bin/python -c 1/2") == ".nox/frameworks/bin/python -c 1/2"
    assert cut("other processes used 1.2 of 2 cores (most: pid 3863 /work/main/.nox/frameworks/bin/python "
               "/work/main/.nox/fra..., 1.0 cores)") == \
        "other processes used 1.2 of 2 cores (most: pid 3863 python fra..., 1.0 cores)"


def test_a_command_line_is_stored_path_free(tmp_path):
    """The window's commands come from /proc/<pid>/cmdline: stored path-free, then cut to ``CMDLINE_CHARS``."""
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cmdline").write_bytes(b"/work/main/.nox/frameworks/bin/python\0-m\0kernelmap.worker\0"
                                              b"--out\0/work/main/runs/r1/pytorch/bs64\0")
    assert contention.command_line(42, "python", str(tmp_path)) == "python -m kernelmap.worker --out bs64"


def test_saved_busy_marks_are_read_path_free(tmp_path):
    """The real runs saved before commands were cut (the 2-core VM's bench: its step benchmarks and its passes)
    name /work/main/.nox/...: their readers give them path-free (the report prints what they give)."""
    import gzip
    import json
    from pathlib import Path

    from kernelmap.reports.analyses.base import Busy

    from kernelmap.history.keys import CONTENTION, run_entries
    from kernelmap.history.storage import list_runs
    from kernelmap.history.trend import load_history

    data = Path(__file__).parent / "data"
    saved = next((data / "cpu_bench_storage").rglob("0009_*.json.gz"))
    raw = [b["extra_info"][CONTENTION]["text"] for b in json.loads(gzip.decompress(saved.read_bytes()))["benchmarks"]
           if (b.get("extra_info") or {}).get(CONTENTION)]
    assert any("/work/main/" in t for t in raw)  # as saved
    dst = tmp_path / saved.parent.name
    dst.mkdir()
    (dst / saved.name.removesuffix(".gz")).write_bytes(gzip.decompress(saved.read_bytes()))
    texts = load_history(tmp_path)["contention_text"].dropna().tolist()
    compared = [e.contention for r in list_runs(tmp_path) for e in run_entries(r)[0] if e.contention]  # compare's
    assert len(texts) == len(raw) and not any("/work/" in t for t in texts)
    assert "(most: pid 3863 python fra..., " in " ".join(texts)
    assert [c["text"] for c in compared] == texts and not any("/work/" in t["command"] for c in compared
                                                              for t in c.get("top_other") or ())
    results = json.loads((data / "cpu_bench_busy" / "results.json").read_text())
    passes = [p for r in results for p in r["passes"].values() if isinstance(p, dict) and p.get("contention")]
    assert any("/work/main/" in p["contention"]["text"] for p in passes)  # as saved
    assert not any("/work/" in Busy.of(p).text for p in passes)
