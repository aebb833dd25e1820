"""What the runner says when a case on several GPUs fails because one GPU has no memory free, from the logs of the
2x H200 run (``kernelmap run --framework all --device gpu --devices 1 2 --profile comm --batch-size 1024``, GPU 1
held by a leftover process: tests/data/gpu_x2_busy_gpu/, the run's own worker logs). A stand-in worker writes a real
log to its stderr as the worker did and then ends as the worker did (exit 1, SIGABRT, or waits for ever):

- JAX x2: device 1 could not allocate (82 tries down to 21.11 MiB), device 0 then waited at the all-reduce's
  clique rendezvous for ever; the runner waited for its 150 s stall limit. Now it stops the worker 60 s after
  XLA's stuck line where nothing follows it (``processes.XlaDeviceWait``) and says why;
- MXNet x2: died of SIGABRT, cuBLAS's "Create cublas handle failed" (status 3, ALLOC_FAILED) in the log only;
  now the message names the C++ exception and the status;
- PyTorch x2: rank 1 exited 1, NCCL's "Failed to CUDA calloc async 8 bytes"; now said to be GPU memory."""

from __future__ import annotations

import gzip
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

from kernelmap.errors import KernelmapError
from kernelmap.run import processes

DATA = Path(__file__).parent / "data" / "gpu_x2_busy_gpu"
LABEL = "{fw}-x2 bs 1024 (clean pass trial 1/1, gpu)"


def _log(name: str) -> str:
    path = DATA / name
    return gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()


def _stand_in(text: str, then: str) -> list[str]:
    """A worker that writes ``text`` to its stderr (as the worker did, faulthandler on as the worker has it), then
    runs ``then``."""
    return [sys.executable, "-c", "import sys; from kernelmap import stall; stall.dump_stacks_on_signal(); "
            f"sys.stderr.write({text!r}); sys.stderr.flush(); {then}"]


def _jax_until_stuck() -> tuple[str, list[str]]:
    """The JAX x2 worker's log up to XLA's stuck rendezvous (what it wrote before the runner acted), and the sizes
    device 1's allocator tried in turn."""
    text = _log("jax-x2-bs1024-clean-1.log.gz")
    end = text.index("\n", text.index("may be stuck")) + 1
    head = text[:end]
    return head, re.findall(r"\] \[1\] Failed to allocate device memory of (\S+) ", head)


def test_the_jax_worker_waiting_for_a_device_without_memory_is_stopped_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(processes, "XLA_GRACE_S", 2.0)  # 60 s in a run: a unit test below holds that
    head, sizes = _jax_until_stuck()
    assert len(sizes) == 82 and sizes[0] == "104.85GiB" and sizes[-1] == "21.11MiB"
    log = tmp_path / "logs" / "jax-x2-bs1024-clean-1.log"
    t0 = time.monotonic()
    with pytest.raises(KernelmapError) as info:
        processes.run_worker(_stand_in(head, "import time; time.sleep(600)"), label=LABEL.format(fw="jax"),
                             batch_size=1024, log_path=log, forward_stderr=False, stall_s=150)
    took = time.monotonic() - t0
    assert took < 60  # the stall limit was 150 s; the stacks' wait is 5 s
    msg = str(info.value)
    assert msg.startswith("jax-x2 bs 1024 (clean pass trial 1/1, gpu): stopped ")
    assert re.search(r"stopped \d+ s in, not left to its stall limit: XLA's device 1 could not allocate GPU memory "
                     r"\(Failed to allocate device memory of 21\.11MiB: out of memory, the last of 82 tries\) and "
                     r"another device waits for it at a collective \(\"This thread has been waiting for `\[0\] "
                     r"\[rank=0\] \[run_id=-1872174331\] Acquire clique: devices=2:\[0,1\]; ", msg), msg
    assert "may be stuck\", then no line for 2 s), a wait XLA never ends" in msg
    native = ", native: gdb" if shutil.which("gdb") else ""
    assert msg.endswith(f"its process group killed; every thread's stack (Python: signal SIGUSR1{native}) in the "
                        "run's logs/jax-x2-bs1024-clean-1.log")
    assert "\n" not in msg and "Thread 0x" in log.read_text()  # the stacks are in the log


def test_an_allocation_retried_to_success_and_a_slow_rendezvous_alone_are_not_a_hang(tmp_path):
    """XLA's allocator retries smaller until one fits (the lines without the stuck rendezvous): the worker goes on
    and ends well. A rendezvous that waits without any device out of memory (a slow compile on one device) is left
    to the stall limit."""
    head, _ = _jax_until_stuck()
    oom_only = "".join(x for x in head.splitlines(keepends=True) if "may be stuck" not in x)
    processes.run_worker(_stand_in(oom_only, "import time; time.sleep(2)"), label="jax-x2", batch_size=1024,
                         log_path=tmp_path / "a.log", forward_stderr=False, stall_s=150)
    stuck_only = "".join(x for x in head.splitlines(keepends=True) if "may be stuck" in x)
    with pytest.raises(KernelmapError) as info:
        processes.run_worker(_stand_in(stuck_only, "import time; time.sleep(600)"), label="jax-x2", batch_size=1024,
                             log_path=tmp_path / "b.log", forward_stderr=False, stall_s=3)
    assert str(info.value).startswith("jax-x2: stalled: still running after its stall limit of 3 s")


def test_the_mxnet_workers_abort_names_cublas_and_its_status(tmp_path):
    text = _log("mxnet-x2-bs1024-clean-1.log")
    before = text[:text.index("Fatal Python error")]  # what libmxnet wrote; faulthandler writes the rest again
    log = tmp_path / "logs" / "mxnet-x2-bs1024-clean-1.log"
    with pytest.raises(KernelmapError) as info:
        processes.run_worker(_stand_in(before, "import os; os.abort()"), label=LABEL.format(fw="mxnet"),
                             batch_size=1024, log_path=log, forward_stderr=False, stall_s=60)
    assert str(info.value) == (
        "mxnet-x2 bs 1024 (clean pass trial 1/1, gpu): worker died of SIGABRT (a crash inside the framework or a "
        "library it loaded: dmlc::Error: stream_gpu-inl.h:133: Check failed: err == CUBLAS_STATUS_SUCCESS (3 vs. 0) "
        ": Create cublas handle failed (cuBLAS status 3 is CUBLAS_STATUS_ALLOC_FAILED: cuBLAS could not allocate GPU "
        "memory)); every thread's Python stack in the run's logs/mxnet-x2-bs1024-clean-1.log; the GPU ran out of "
        "memory: another process may hold it (nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory)")


def test_the_pytorch_ranks_nccl_allocation_is_said_to_be_gpu_memory(tmp_path):
    text = _log("pytorch-x2-bs1024-clean-1.log")
    with pytest.raises(KernelmapError) as info:
        processes.run_worker(_stand_in(text, "sys.exit(1)"), label=LABEL.format(fw="pytorch"), batch_size=1024,
                             log_path=tmp_path / "p.log", forward_stderr=False, stall_s=60)
    assert str(info.value) == (
        "pytorch-x2 bs 1024 (clean pass trial 1/1, gpu): worker exited 1: [rank1]: Failed to CUDA calloc async 8 "
        "bytes; rank 1's GPU ran out of memory: another process may hold it (nvidia-smi "
        "--query-compute-apps=pid,gpu_uuid,used_memory)")


@pytest.mark.parametrize(("text", "cause"), [
    ("", ""),
    ("Fatal Python error: Aborted\n", ""),
    ("terminate called after throwing an instance of 'std::runtime_error'\n  what():  bad thing\n",
     "std::runtime_error: bad thing"),
    ("terminate called after throwing an instance of 'dmlc::Error'\n  what():  [01:02:03] /a/b/c.h:7: Check failed: "
     "err == CUBLAS_STATUS_SUCCESS (14 vs. 0) : x\n",
     "dmlc::Error: c.h:7: Check failed: err == CUBLAS_STATUS_SUCCESS (14 vs. 0) : x (cuBLAS status 14 is "
     "CUBLAS_STATUS_INTERNAL_ERROR)"),
])
def test_crash_cause(text, cause):
    assert processes.crash_cause(text) == cause


class _Clock:
    """A clock the test moves (XlaDeviceWait's ``clock``)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


STUCK = ("E1127 14:25:04.080677   11930 rendezvous.cc:116] [id=0] This thread has been waiting for `[0] [rank=0] "
         "[run_id=-1872174331] Acquire clique: devices=2:[0,1]; local_participants=2; communication_id=0; "
         "incarnations=[]` for 10 seconds and may be stuck. Expected 2 threads to join the rendezvous, but not all of "
         "them arrived on time.")
# XLA's line when that rendezvous ends after all (xla/service/rendezvous.cc, as printed in a slow 8-GPU clique)
UNSTUCK = ("E0915 03:15:25.101290     395 rendezvous.cc:130] [id=6] This thread is unstuck waiting for `[1] [rank=1] "
           "[run_id=2012504188] Initialize clique: devices=8:[0,1,2,3,4,5,6,7]; local_participants=8; "
           "communication_id=0; incarnations=[]` after 32.941385531s. All threads joined the rendezvous on time "
           "however the leader took long time to complete it. Warning above was a false-positive. Perhaps the "
           "timeout is too short.")
# tsl's BFC allocator on an autotuning try its caller can do without (as printed in TensorFlow GPU runs)
NOT_A_FAILURE = ("2021-11-05 09:30:48.424570: W tensorflow/core/common_runtime/bfc_allocator.cc:271] Allocator "
                 "(GPU_0_bfc) ran out of memory trying to allocate 2.55GiB with freed_by_count=0. The caller "
                 "indicates that this is not a failure, but may mean that there could be performance gains if more "
                 "memory were available.")


def _seen(lines, clock: _Clock) -> processes.XlaDeviceWait:
    w = processes.XlaDeviceWait(grace_s=60, clock=clock)
    for line in lines:
        w.see(line)
    return w


def test_the_real_jax_hang_is_stopped_after_60_s_of_silence_after_the_stuck_line():
    head, _ = _jax_until_stuck()
    clock = _Clock()
    w = _seen(head.splitlines(), clock)
    assert not w.found.is_set()  # the stuck line alone: a rendezvous slower than 10 s may yet end
    clock.now += 59.9
    assert not w.found.is_set()
    clock.now += 0.1
    assert w.found.is_set() and w.device == "1" and w.tries == 82 and w.found_after(1000.0) == 60.0


def test_a_step_down_that_succeeded_then_a_slow_rendezvous_is_not_a_hang():
    """The counters pass's JAX worker on the busy GPU 1 (tests/data/gpu_x2_busy_gpu/jax-bs64-counters.log, the 2x
    H200 run): XLA's allocator stepped down from 104.85 GiB to 36.56 GiB, the next size fit (silently) and the worker
    went on. A slow first NCCL clique after it warns "may be stuck" and ends "unstuck": no stop, however long after."""
    lines = (DATA / "jax-bs64-counters.log").read_text().splitlines()
    sizes = [x.split(" of ")[1].split(" ")[0] for x in lines if "Failed to allocate device memory" in x]
    assert len(sizes) == 11 and sizes[0] == "104.85GiB" and sizes[-1] == "36.56GiB" and lines[-1] == "Segmentation fault"
    clock = _Clock()
    w = _seen([*lines[:-1], STUCK], clock)
    clock.now += 32.9
    w.see(UNSTUCK)
    clock.now += 600
    assert not w.found.is_set()


def test_an_autotuning_allocation_that_is_not_a_failure_then_a_slow_rendezvous_is_not_a_hang():
    clock = _Clock()
    w = _seen([NOT_A_FAILURE, STUCK], clock)
    clock.now += 600
    assert not w.found.is_set() and w.device is None


def test_any_line_after_the_stuck_line_restarts_the_wait():
    head, _ = _jax_until_stuck()
    clock = _Clock()
    w = _seen(head.splitlines(), clock)
    clock.now += 50
    w.see("2026-11-27 14:25:54 some progress")
    clock.now += 50
    assert not w.found.is_set()
    clock.now += 10
    assert w.found.is_set() and w.found_after(1000.0) == 110.0


def test_xla_device_wait_reads_the_bfc_allocators_line_too():
    """Mid-run (not at start) XLA's BFC allocator says it (the format of tsl's bfc_allocator.cc, as reported in
    multi-GPU hangs); the device is the allocator's; a rendezvous line before any out-of-memory line is nothing."""
    clock = _Clock()
    w = processes.XlaDeviceWait(grace_s=60, clock=clock)
    w.see("E1127 14:25:04.080677   11930 rendezvous.cc:116] [id=0] This thread has been waiting for `x` for 10 "
          "seconds and may be stuck. Expected 2 threads to join the rendezvous, but not all of them arrived on time.")
    clock.now += 100
    assert not w.found.is_set()
    w.see("W1127 14:25:00.000000   11819 bfc_allocator.cc:514] Allocator (GPU_3_bfc) ran out of memory trying to "
          "allocate 22.66GiB (rounded to 24331616256)requested by op")
    w.see("E1127 14:25:14.080677   11930 rendezvous.cc:116] [id=0] This thread has been waiting for `y` for 10 "
          "seconds and may be stuck.")
    clock.now += 60
    assert w.found.is_set() and w.device == "3" and w.tries == 1
    assert w.said().startswith("XLA's device 3 could not allocate GPU memory (ran out of memory trying to allocate "
                               "22.66GiB) and another device waits for it at a collective (\"This "
                               "thread has been waiting for `y` for 10 seconds and may be stuck\", then no line for "
                               "60 s)")
