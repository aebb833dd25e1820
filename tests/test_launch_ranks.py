"""A case run one process per device (PyTorch DDP): the worker launches its ranks (``dataparallel.launch``) and no
rank outlives it, whatever ends it; under nsys, nsys neither signals it nor stops waiting for its ranks.

The 4x H200 (session 11): PyTorch's x2 nsys pass at bs 1024 exited 143. nsys said "The target application
terminated. One or more process it created re-parented. Waiting for termination of re-parented processes"; its
target is the launcher, which waits for both ranks unless a signal ends it, and 143 is 128 + SIGTERM. Here a
launcher is sent SIGTERM (as a profiler signals its target), SIGINT and SIGKILL, with real ranks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from kernelmap.frameworks import dataparallel
from kernelmap.frameworks.case import CaseKey
from kernelmap.frameworks.registry import NsysWindow

from kernelmap import frameworks
from kernelmap.errors import KernelmapError
from kernelmap.run import case as run_case
from kernelmap.run import devices as run_devices
from kernelmap.run import processes as run_processes

# a rank (argv: folder, the rank that dies of SIGTERM at once or -1, seconds): its pid into rank<r>.pid, then it
# sleeps (the step); with die_with_launcher as the workers call it
RANK = textwrap.dedent("""
    import os, signal, sys, time
    from kernelmap.frameworks import dataparallel
    dataparallel.die_with_launcher()
    r = os.environ[dataparallel.RANK_ENV]
    open(os.path.join(sys.argv[1], "rank" + r + ".tmp"), "w").write(str(os.getpid()))
    os.rename(os.path.join(sys.argv[1], "rank" + r + ".tmp"), os.path.join(sys.argv[1], "rank" + r + ".pid"))
    if r == sys.argv[2]:  # this rank dies of SIGTERM once the other runs (its pid file written: else it could be
        # stopped before writing it, and the test not find it)
        deadline = time.monotonic() + 60
        while len([f for f in os.listdir(sys.argv[1]) if f.endswith(".pid")]) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(float(sys.argv[3]))
""")
LAUNCHER = textwrap.dedent("""
    import sys
    from kernelmap.frameworks import dataparallel
    rank = [sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]]
    sys.exit(dataparallel.launch([rank, rank]))
""")


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie no longer does: a container's init may never reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _start(tmp_path: Path, sleep_s: float = 60.0, rank_code: str = RANK) -> tuple[subprocess.Popen, list[int]]:
    """The launcher of two ranks in a process group of its own (as nsys runs its target), once both ranks run."""
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, rank_code, str(tmp_path), "-1", str(sleep_s)],
                            stderr=subprocess.PIPE, text=True, process_group=0)
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"rank{r}.pid").is_file() for r in (0, 1)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() is not None else "slow"
        time.sleep(0.05)
    return proc, [int((tmp_path / f"rank{r}.pid").read_text()) for r in (0, 1)]


def _cleanup(pids: list[int]) -> None:
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_launcher_sent_sigterm_ends_its_ranks_before_it_ends(tmp_path):
    proc, ranks = _start(tmp_path)
    try:
        os.kill(proc.pid, signal.SIGTERM)  # the launcher alone, as a profiler signals its target
        rc = proc.wait(timeout=30)
        left = [pid for pid in ranks if _alive(pid)]  # at the moment the launcher is gone
        err = proc.stderr.read()
    finally:
        _cleanup(ranks)
    assert rc == 128 + signal.SIGTERM  # as nsys reported it: 143
    assert left == []  # before: the launcher died at once, both ranks slept on (re-parented)
    assert "got SIGTERM" in err and "ranks still running (0, 1)" in err and "no rank outlives it" in err


def test_a_launcher_killed_outright_takes_its_ranks_along(tmp_path):
    """SIGKILL leaves the launcher no time to forward anything: the kernel sends each rank SIGTERM
    (``die_with_launcher``)."""
    proc, ranks = _start(tmp_path)
    try:
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in ranks) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [pid for pid in ranks if _alive(pid)]
    finally:
        _cleanup(ranks)
    assert left == []


def test_a_rank_dead_of_a_signal_is_said_and_stops_the_other(tmp_path):
    """A rank that dies of SIGTERM: the launcher exits 143 (not Python's 241 for -15), names the rank and the
    signal, and stops the other rank."""
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, RANK, str(tmp_path), "1", "60"],
                            stderr=subprocess.PIPE, text=True, process_group=0)
    try:
        rc = proc.wait(timeout=60)
        err = proc.stderr.read()
        ranks = [int((tmp_path / f"rank{r}.pid").read_text()) for r in (0, 1)]
        left = [pid for pid in ranks if _alive(pid)]
    finally:
        _cleanup([int(p.read_text()) for p in tmp_path.glob("rank*.pid")])
    assert rc == 143 and left == []
    assert "rank 1 of 2 died of SIGTERM" in err


def test_die_with_launcher_does_nothing_outside_a_launch(monkeypatch):
    monkeypatch.delenv(dataparallel.LAUNCHER_ENV, raising=False)
    dataparallel.die_with_launcher()  # this test process goes on
    monkeypatch.setenv(dataparallel.LAUNCHER_ENV, str(os.getppid()))
    dataparallel.die_with_launcher()  # its parent is alive: nothing now (the kernel's signal only at its death)


# --- nsys around a worker that launches ranks ---------------------------------------------------------------
def test_nsys_of_a_multiprocess_case_neither_signals_its_target_nor_stops_waiting(tmp_path, monkeypatch):
    """PyTorch x2's nsys pass: ``--kill none --wait all`` (not for one process, whose flags stay as they were)."""
    worker = ["python", "-m", "kernelmap.worker"]
    two, _ = run_processes.nsys_commands("nsys", tmp_path, worker, NsysWindow.PROFILER_API, processes=2)
    one, _ = run_processes.nsys_commands("nsys", tmp_path, worker, NsysWindow.PROFILER_API)
    assert two[two.index("--kill"):two.index("--kill") + 4] == ["--kill", "none", "--wait", "all"]
    assert two[-len(worker):] == worker and "--kill" not in one and "--wait" not in one
    # the case decides: PyTorch on 2 devices runs 2 processes under nsys; MXNet on 2 devices one
    calls = []
    monkeypatch.setattr(run_processes, "run_worker", lambda cmd, **kw: calls.append(cmd))
    monkeypatch.setattr(run_case, "nsys_report", lambda out: out / "nsys.nsys-rep")
    for fw, n in (("pytorch", 2), ("mxnet", 2), ("pytorch", 1)):
        key = CaseKey(fw, frameworks.get(fw).default_mode, "fp32", n, 64)
        c = run_case.CaseRun(key, run_devices.Decision(fw, "gpu", "gpu", None), {}, "{}", tmp_path / fw / str(n),
                             "nsys", None, 1, {})
        c._under_nsys(tmp_path / fw / str(n), worker, NsysWindow.PROFILER_API, "label", {}, tmp_path / "log", None)
    profiles = [cmd for cmd in calls if cmd[1] == "profile"]
    assert ["--kill" in cmd for cmd in profiles] == [True, False, False]


@pytest.mark.parametrize("rc, said", [(143, "128 + SIGTERM"), (137, "128 + SIGKILL"), (1, None), (300, None)])
def test_an_exit_status_above_128_names_its_signal(rc, said):
    got = run_processes.signal_said(rc)
    assert (got is None) if said is None else (said in got)


def test_the_runner_says_which_signal_an_exit_status_of_143_means():
    with pytest.raises(KernelmapError, match=r"worker exited 143 \(128 \+ SIGTERM: .*\): gone"):
        run_processes.run_worker(["sh", "-c", "echo gone >&2; exit 143"], label="pytorch-x2 bs 1024 (nsys pass, gpu)",
                                 batch_size=1024, forward_stderr=False)


def test_a_launcher_with_its_own_handler_gets_the_signal_after_its_ranks_are_gone(tmp_path):
    """``kernelmap parity`` launches ranks from the CLI, whose SIGINT handler must still see a Ctrl-C."""
    code = textwrap.dedent("""
        import signal, sys
        from kernelmap.frameworks import dataparallel
        def handler(signum, frame):
            raise KeyboardInterrupt
        signal.signal(signal.SIGINT, handler)
        rank = [sys.executable, "-c", sys.argv[1], sys.argv[2], "-1", "60"]
        try:
            dataparallel.launch([rank, rank])
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            sys.exit(130)
        sys.exit(1)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code, RANK, str(tmp_path)], stderr=subprocess.PIPE, text=True,
                            process_group=0)
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"rank{r}.pid").is_file() for r in (0, 1)) and time.monotonic() < deadline:
        time.sleep(0.05)
    ranks = [int((tmp_path / f"rank{r}.pid").read_text()) for r in (0, 1)]
    try:
        os.kill(proc.pid, signal.SIGINT)
        rc = proc.wait(timeout=30)
        left = [pid for pid in ranks if _alive(pid)]
        err = proc.stderr.read()
    finally:
        _cleanup(ranks)
    assert rc == 130 and left == [] and err.rstrip().endswith("interrupted") and "got SIGINT" in err


def test_a_signal_the_launcher_ignores_stays_ignored(tmp_path):
    """Under ``nohup`` SIGHUP is ignored: the launcher does not take it up (it would have forwarded it and ended the
    run with 129), and its ranks, started with it ignored, run on: rc 0 once they are done."""
    ignoring = "import signal; signal.signal(signal.SIGHUP, signal.SIG_IGN)\n" + LAUNCHER
    proc = subprocess.Popen([sys.executable, "-c", ignoring, RANK, str(tmp_path), "-1", "3"],
                            stderr=subprocess.PIPE, text=True, process_group=0)
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"rank{r}.pid").is_file() for r in (0, 1)):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    ranks = [int((tmp_path / f"rank{r}.pid").read_text()) for r in (0, 1)]
    try:
        os.killpg(proc.pid, signal.SIGHUP)  # the hang-up reaches the launcher and its ranks alike
        rc = proc.wait(timeout=60)
        err = proc.stderr.read()
    finally:
        _cleanup(ranks)
    assert rc == 0, err
    assert "SIGHUP" not in err


def test_a_signal_after_the_ranks_ended_is_the_launchers_exit_status(tmp_path):
    """A SIGTERM that reaches the launcher once both ranks have ended (here: sent to itself as the wait for its ranks
    returns, before the launcher returns): the launcher was signalled, so it exits 143, not its ranks' 0."""
    late = textwrap.dedent("""
        import os, signal, sys
        from kernelmap.frameworks import dataparallel
        wait = dataparallel._wait_ranks
        def then_signalled(procs, deadline, received):
            rc = wait(procs, deadline, received)
            assert all(p.poll() == 0 for p in procs)  # both ranks ended, and well
            os.kill(os.getpid(), signal.SIGTERM)
            return rc
        dataparallel._wait_ranks = then_signalled
        rank = [sys.executable, "-c", sys.argv[1], sys.argv[2], "-1", "0"]
        sys.exit(dataparallel.launch([rank, rank]))
    """)
    proc = subprocess.run([sys.executable, "-c", late, RANK, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr  # before: 0, the signal dropped
    assert "got SIGTERM" in proc.stderr and "ranks still running (none)" in proc.stderr


# argv: folder; rank 1 ignores SIGTERM (a rank stuck where SIGTERM does not end it) and says it runs; rank 0 then fails
STUCK_RANK = textwrap.dedent("""
    import os, signal, sys, time
    from kernelmap.frameworks import dataparallel
    r = os.environ[dataparallel.RANK_ENV]
    if r == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open(os.path.join(sys.argv[1], "rank1.tmp"), "w").write(str(os.getpid()))
        os.rename(os.path.join(sys.argv[1], "rank1.tmp"), os.path.join(sys.argv[1], "rank1.pid"))
        time.sleep(120)
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(sys.argv[1], "rank1.pid")) and time.monotonic() < deadline:
        time.sleep(0.02)
    sys.exit(3)
""")


def test_after_one_rank_fails_a_rank_that_outlives_sigterm_is_killed_after_the_grace(tmp_path):
    """Rank 0 exits 3; rank 1 ignores the SIGTERM the launcher sends it: after ``FAILED_RANK_GRACE_S`` (1 s here) it
    is killed, and the launcher exits 3 (before: it waited on for rank 1, here until its 30 s timeout: 124)."""
    code = textwrap.dedent("""
        import sys
        from kernelmap.frameworks import dataparallel
        dataparallel.FAILED_RANK_GRACE_S = 1.0
        rank = [sys.executable, "-c", sys.argv[1], sys.argv[2]]
        sys.exit(dataparallel.launch([rank, rank], timeout=30))
    """)
    assert dataparallel.FAILED_RANK_GRACE_S <= 10  # a few seconds
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code, STUCK_RANK, str(tmp_path)], capture_output=True, text=True,
                          timeout=90)
    took = time.monotonic() - t0
    stuck = int((tmp_path / "rank1.pid").read_text())
    left = _alive(stuck)
    _cleanup([stuck])
    assert proc.returncode == 3, proc.stderr
    assert not left and took < 20, took
    assert "rank(s) 1 of 2 still running 1.0 s after SIGTERM (another rank failed): killed" in proc.stderr
