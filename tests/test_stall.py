"""The stall guard (kernelmap/stall.py): a worker that hangs has every thread's stack written into its log and
its process group killed once past its stall limit, its case failed with one line; the run goes on. On the H200s
two MXNet GPU workers hung before their first convolution with nothing in their logs and the run waited 15+
minutes; here a worker is made to hang by the test hook (``stall.HANG_ENV``) on the CPU."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import require_framework

from kernelmap import stall
from kernelmap.errors import KernelmapError
from kernelmap.run import processes

# a worker stand-in that starts as the worker does (faulthandler on the signal), starts a child in its process
# group, and hangs in the hook
HANGER = ("import subprocess, sys; from kernelmap import stall; stall.dump_stacks_on_signal(); "
          "child = subprocess.Popen(['sleep', '600']); print(child.pid, flush=True); "
          "stall.hang_for_test('mxnet', 'clean', 1024)")


GDB = shutil.which("gdb") is not None


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_hung_worker_leaves_its_stacks_in_its_log_and_its_group_killed(tmp_path):
    log, out = tmp_path / "logs" / "mxnet-bs1024-clean-1.log", tmp_path / "stdout"
    env = {**os.environ, stall.HANG_ENV: "mxnet/clean/*"}
    t0 = time.monotonic()
    with pytest.raises(KernelmapError) as err:
        processes.run_worker([sys.executable, "-c", HANGER], label="mxnet bs 1024 (clean pass trial 1/1, gpu)",
                             batch_size=1024, env=env, stdout_path=out, forward_stderr=False, log_path=log,
                             stall_s=2)
    took = time.monotonic() - t0
    native = ", native: gdb" if GDB else ""
    assert str(err.value) == (
        "mxnet bs 1024 (clean pass trial 1/1, gpu): stalled: still running after its stall limit of 2 s "
        f"(kernelmap run --stall-limit), its process group killed; every thread's stack (Python: signal SIGUSR1{native}) "
        "in the run's logs/mxnet-bs1024-clean-1.log")
    assert 2 + stall.DUMP_WAIT_S <= took < 2 + 3 * stall.DUMP_WAIT_S + (2 * stall.NATIVE_TIMEOUT_S if GDB else 0)
    text = log.read_text()
    assert "kernelmap-worker: KERNELMAP_TEST_HANG=mxnet/clean/*: hanging" in text
    # faulthandler's dump of the hung main thread: where it waits, in the hook, called from the script
    dump = text[text.index("Current thread"):]
    assert dump.splitlines()[0].startswith("Current thread 0x") and "(most recent call first):" in dump
    assert f'File "{Path(stall.__file__)}"' in dump and "in hang_for_test" in dump and "in wait" in dump
    assert 'File "<string>", line 1 in <module>' in dump
    child = int(out.read_text().split()[0])
    assert not _alive(child)  # the worker's own child went with its group
    if not GDB:
        assert "kernelmap run: no native stacks: gdb is not on PATH" in text
        return
    # then gdb's native stacks of both processes of the group: the Python worker (its main thread waiting on a
    # lock in the hook) and its sleep child, which was not sent the signal (it has no handler: it would have died)
    heads = [line for line in text.splitlines() if line.startswith("kernelmap run: native stacks of pid ")]
    assert len(heads) == 2 and heads[1] == f"kernelmap run: native stacks of pid {child} (gdb: thread apply all bt)"
    assert text.index("Current thread") < text.index(heads[0])
    worker_part, child_part = text[text.index(heads[0]):text.index(heads[1])], text[text.index(heads[1]):]
    assert "Thread 1 " in worker_part and "futex" in worker_part and "Py_RunMain" in worker_part
    assert '"sleep"' in child_part and "clock_nanosleep" in child_part


def test_a_worker_within_its_limit_is_left_alone(tmp_path):
    processes.run_worker([sys.executable, "-c", "import time; time.sleep(0.5)"], label="quick", batch_size=1,
                         forward_stderr=False, log_path=tmp_path / "logs" / "q.log", stall_s=30)
    assert (tmp_path / "logs" / "q.log").read_text() == ""


@pytest.mark.parametrize("code", [0, 139])
def test_a_workers_leftover_children_are_killed_when_it_exits(tmp_path, code):
    """A worker (here ncu's stand-in) that exits, cleanly or crashed, while a child it started lives on: the child
    is killed with the group and the log says so (on the H200s ncu died of SIGSEGV under JAX and its target
    kept 75% of the GPU's memory: every later case on that GPU ran out of memory); a worker with no leftovers
    gets no such line."""
    log, out = tmp_path / "logs" / "jax-bs64-counters.log", tmp_path / "stdout"
    leaver = ("import subprocess, sys; child = subprocess.Popen(['sleep', '600']); print(child.pid, flush=True); "
              f"sys.exit({code})")
    t0 = time.monotonic()
    if code:
        with pytest.raises(KernelmapError, match="worker exited 139"):
            processes.run_worker([sys.executable, "-c", leaver], label="jax bs 64 (counters pass under ncu, gpu)",
                                 batch_size=64, stdout_path=out, forward_stderr=False, log_path=log, stall_s=60)
    else:
        processes.run_worker([sys.executable, "-c", leaver], label="jax bs 64 (counters pass under ncu, gpu)",
                             batch_size=64, stdout_path=out, forward_stderr=False, log_path=log, stall_s=60)
    assert time.monotonic() - t0 < 8  # not the tee's 10 s wait on a pipe the leftover holds open
    child = int(out.read_text().split()[0])
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)
    assert "processes of this worker's process group were still running after it exited" in log.read_text()
    assert f"pid {child} sleep; killed" in log.read_text()  # named: which process was left
    processes.run_worker([sys.executable, "-c", "print(1)"], label="clean", batch_size=1, stdout_path=out,
                         forward_stderr=False, log_path=tmp_path / "logs" / "clean.log", stall_s=60)
    assert "still running after it exited" not in (tmp_path / "logs" / "clean.log").read_text()


def test_the_default_limit_scales_with_steps_and_batch_size():
    # the hold's hung MXNet clean trial: 5 warm-up + 20 steps at bs 1024 on the GPU, then the 10,000 test images
    assert stall.limit_s("gpu", 1024, 25, 10_000) == 600 + (25 + 10) * 5.0
    assert stall.limit_s("gpu", 64, 25) == stall.limit_s("gpu", 1024, 25) == 725.0  # a GPU step: bs <= 1024 alike
    assert stall.limit_s("gpu", 2048, 25) == 600 + 25 * 5.0 * 2
    assert stall.limit_s("cpu", 64, 105) == 600 + 105 * 15.0
    assert stall.limit_s("cpu", 1024, 105) == 600 + 105 * 15.0 * 16


def test_an_epochs_limit_counts_the_steps_the_worker_runs():
    """Under --epochs the worker trains each epoch's full batches (spec.steps_per_epoch: the partial batch dropped);
    the stall limit counts the same steps (it counted a ceiling: 60,000 images at bs 128 are 468 steps, not 469)."""
    from types import SimpleNamespace

    from kernelmap.frameworks import spec

    from kernelmap.run.case import CaseRun

    assert stall.worker_steps(128, 5, None, 2, 60_000) == 2 * spec.steps_per_epoch(60_000, 128) == 936
    assert stall.worker_steps(128, 5, 20, None, 60_000) == 25
    case = SimpleNamespace(stall_limit=None, train={"epochs": 2}, data={"n_train": 60_000, "n_test": 10_000}, bs=128,
                           decision=SimpleNamespace(device="cpu"))
    assert CaseRun._stall(case, None, 5) == stall.limit_s("cpu", 128, 936)
    assert CaseRun._stall(case, None, 5, evaluates=True) == stall.limit_s("cpu", 128, 936, 10_000)


@pytest.mark.parametrize(("text", "ok"), [("0", 0.0), ("90", 90.0), ("-1", None), ("inf", None), ("soon", None)])
def test_stall_limit_option(text, ok):
    if ok is None:
        with pytest.raises(argparse.ArgumentTypeError):
            stall.seconds(text)
    else:
        assert stall.seconds(text) == ok


@pytest.mark.slow
def test_a_run_fails_the_hung_case_and_goes_on(tmp_path):
    """End to end on the CPU: PyTorch at bs 32 and 64, the bs 32 clean worker made to hang; --stall-limit 20."""
    require_framework("pytorch")
    out = tmp_path / "run"
    env = {**os.environ, stall.HANG_ENV: "pytorch/clean/bs32"}
    r = subprocess.run([sys.executable, "-m", "kernelmap.cli", "run", "--framework", "pytorch", "--device", "cpu",
                        "--data", "synthetic", "--steps", "3", "--warmup", "1", "--batch-size", "32", "64",
                        "--trials", "1", "--max-repeats", "0", "--stall-limit", "20", "--out", str(out), "--json"],
                       capture_output=True, text=True, env=env, timeout=600)
    line = ("kernelmap run: pytorch bs 32 (clean pass trial 1/1, cpu): stalled: still running after its stall limit "
            "of 20 s (kernelmap run --stall-limit), its process group killed; every thread's stack (Python: signal "
            f"SIGUSR1{', native: gdb' if GDB else ''}) in the run's logs/pytorch-bs32-clean-1.log; pytorch bs 32 left "
            "out of the run")
    assert line in r.stderr.splitlines(), r.stderr[-3000:]
    assert r.returncode == 3, r.stderr[-3000:]
    dump = (out / "logs" / "pytorch-bs32-clean-1.log").read_text()
    assert "Current thread 0x" in dump and "in hang_for_test" in dump and "kernelmap/worker.py" in dump
    assert not GDB or "kernelmap run: native stacks of pid " in dump
    results = json.loads((out / "results.json").read_text())
    assert [(r["batch_size"], r["n_trials"]) for r in results] == [(64, 1)]  # the other case ran on
    assert not (out / "pytorch" / "bs32").exists() and (out / "pytorch" / "bs64" / "clean-1.json").is_file()


def test_a_ddp_rank_leaves_its_process_group_on_a_finished_pass():
    """worker.leave_group in a rank (gloo, one process of one: the rendezvous of env://) destroys the group wrap
    joined; outside a launched rank it does nothing."""
    require_framework("pytorch")
    code = ("import os, socket, torch.distributed as dist; from torch import nn\n"
            "from kernelmap import worker; from kernelmap.frameworks import dataparallel\n"
            "from kernelmap.frameworks.pytorch import parallel\n"
            "worker.leave_group('pytorch'); before = dist.is_initialized()\n"  # not a rank yet: nothing to leave
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]; s.close()\n"
            "os.environ.update(dataparallel.rank_env(0, 1, port))\n"
            "parallel.wrap(nn.Linear(2, 2), 1, 'cpu'); joined = dist.is_initialized()\n"
            "worker.leave_group('pytorch'); print(before, joined, dist.is_initialized())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["False", "True", "False"]


CRASH = """
import ctypes, sys
from kernelmap import stall
if sys.argv[1] == "guarded":
    stall.dump_stacks_on_signal()  # what the worker does first
import mxnet
mxnet.nd.zeros((2, 2)).wait_to_read()
print("mxnet loaded", flush=True)
ctypes.string_at(0)  # a crash inside a library call, as the H200 workers' first GPU operator
"""


@pytest.mark.parametrize("guarded", [True, False])
def test_a_worker_that_crashes_dies_of_its_signal_with_its_stack_not_in_mxnets_handler(guarded):
    """The H200s' MXNet workers crashed at their first GPU operator and then hung in libmxnet's SIGSEGV handler
    (print, stack walk, exit() waiting on the engine) until the stall limit. With the worker's faulthandler set
    first, MXNet installs no handler: the process dies of SIGSEGV at once, its Python stack in its log. Control:
    without it, MXNet's own handler runs ('Segmentation fault: 11', exit status 255 here on the CPU)."""
    require_framework("mxnet")
    proc = subprocess.run([sys.executable, "-c", CRASH, "guarded" if guarded else "bare"], capture_output=True,
                          text=True, timeout=120)
    assert "mxnet loaded" in proc.stdout, proc.stderr[-2000:]
    if guarded:
        assert proc.returncode == -11, proc.stderr[-2000:]
        assert "Fatal Python error: Segmentation fault" in proc.stderr and "in string_at" in proc.stderr
        assert "Segmentation fault: 11" not in proc.stderr
    else:
        assert "Segmentation fault: 11" in proc.stderr and proc.returncode != -11


def test_a_crashed_worker_is_named_by_its_signal_and_its_log(tmp_path):
    log = tmp_path / "logs" / "mxnet-bs64-clean-1.log"
    script = "from kernelmap import stall; stall.dump_stacks_on_signal(); import ctypes; ctypes.string_at(0)"
    with pytest.raises(KernelmapError) as info:
        processes.run_worker([sys.executable, "-c", script], label="mxnet bs 64 (clean pass trial 1/1, gpu)",
                             batch_size=64, log_path=log, forward_stderr=False, stall_s=60)
    assert str(info.value) == ("mxnet bs 64 (clean pass trial 1/1, gpu): worker died of SIGSEGV (a crash inside "
                               "the framework or a library it loaded); every thread's Python stack in the run's "
                               "logs/mxnet-bs64-clean-1.log")
    assert "Fatal Python error: Segmentation fault" in log.read_text()


@pytest.mark.parametrize(("signum", "said"), [
    (signal.SIGKILL, "worker killed (SIGKILL: the kernel's out-of-memory killer or another process)"),
    (signal.SIGTERM, "worker stopped by SIGTERM from another process"),
    (signal.SIGABRT, "worker died of SIGABRT (a crash inside the framework or a library it loaded); every "
                     "thread's Python stack in the run's logs/x.log"),
])
def test_a_killed_worker_is_not_called_a_crash(signum, said):
    """Only a crash leaves stacks (faulthandler); a kill from outside (the OOM killer, kill -9) leaves none."""
    assert processes.died_of(signum, Path("/r/logs/x.log")) == said
