"""Ctrl-C in the middle of a real CPU ``kernelmap run`` (and ``kernelmap report``): exit 130, no
output directory, no ``.partial`` leftovers, no worker left behind.

SIGINT goes to the whole process group, as a terminal's Ctrl-C does (the parent and its worker
both get it).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import require_framework

DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(autouse=True)
def _sigint_as_at_a_terminal():
    """These tests stand for Ctrl-C at a terminal. A test process started with SIGINT ignored (in the
    background of a non-interactive shell, under nohup) would pass that on, and kernelmap rightly keeps
    an ignored SIGINT ignored; so each test runs with Python's default handler, which its
    subprocesses start from too."""
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def _children(pid: int) -> list[int]:
    """All descendants of ``pid`` (from /proc), so that orphans can be looked for afterwards."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        out += [int(k) for k in kids]
        todo += [int(k) for k in kids]
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _interrupt(cmd: list[str], ready, timeout: float = 120.0, sig: int = signal.SIGINT) -> dict:
    """Start ``cmd`` in its own process group, wait until ``ready(descendants)`` is true, send
    ``sig`` (SIGINT to the whole group, as a terminal's Ctrl-C does; SIGTERM to the process only,
    as ``kill PID`` does), and return what happened."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    kids: list[int] = []
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"finished before it could be interrupted: {proc.returncode}\n{proc.stderr.read()[-3000:]}")
            kids = _children(proc.pid)
            if ready(kids):
                break
            if time.monotonic() - t0 > timeout:
                pytest.fail("never became ready to interrupt")
            time.sleep(0.05)
        t_int = time.monotonic()
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    time.sleep(0.2)
    return {"rc": proc.returncode, "stdout": out.decode(), "stderr": err.decode(), "kids": kids,
            "orphans": [k for k in kids if _alive(k)], "ready_s": t_int - t0, "exit_s": time.monotonic() - t_int}


def _leftovers(parent: Path, name: str) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith((name, f".{name}")))


def _torch_loaded_since(pid: int, since: dict) -> float:
    """Seconds since libtorch_cpu was first seen mapped into ``pid`` (0 until it is)."""
    try:
        loaded = "libtorch_cpu" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return 0.0
    if loaded:
        since.setdefault(pid, time.monotonic())
    return time.monotonic() - since[pid] if pid in since else 0.0


@pytest.mark.slow
@pytest.mark.parametrize(("stage", "sig"), [("starting", signal.SIGINT), ("training", signal.SIGINT),
                                            ("training", signal.SIGTERM)])
def test_interrupted_run_leaves_nothing(tmp_path, stage, sig):
    """``starting``: the worker process exists (still importing); ``training``: torch has been
    loaded in it for 3 s (data built, steps running). Workers run in their own process groups, so
    neither a Ctrl-C nor a ``kill`` of the parent alone may leave one behind."""
    require_framework("pytorch")
    out = tmp_path / "run1"
    since: dict = {}

    def ready(kids):
        partial = list(tmp_path.glob(".run1.*.partial"))
        workers = [k for k in kids if "kernelmap.worker" in _cmdline(k)]
        if not (workers and any((p / "pytorch" / "bs64").is_dir() for p in partial)):
            return False
        return stage == "starting" or _torch_loaded_since(workers[0], since) > 3.0

    r = _interrupt([sys.executable, "-m", "kernelmap.cli", "run", "--framework", "pytorch", "--device", "cpu",
                    "--data", "synthetic", "--steps", "500", "--batch-size", "64", "--out", str(out)], ready, sig=sig)
    print(f"run ({stage}): ready after {r['ready_s']:.1f} s, exited {r['rc']} {r['exit_s']:.2f} s after "
          f"{signal.Signals(sig).name}; stderr tail: {r['stderr'].strip().splitlines()[-1:]}")
    assert r["rc"] == 128 + sig, r["stderr"][-3000:]
    what = "interrupted" if sig == signal.SIGINT else "terminated"
    assert f"kernelmap run: {what}; nothing partial was kept" in r["stderr"]
    assert "Traceback" not in r["stderr"], r["stderr"][-3000:]
    assert not out.exists()
    assert _leftovers(tmp_path, "run1") == []
    assert r["kids"] and r["orphans"] == []


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.slow
def test_interrupted_report_leaves_nothing(tmp_path):
    """``kernelmap report`` interrupted while it draws (its .partial dir exists): nothing kept."""
    run = tmp_path / "cpu_run"
    shutil.copytree(DATA / "report_cpu_run", run)
    out = tmp_path / "rep"

    def drawing(kids):
        return any(tmp_path.glob(".rep.*.partial/*.png"))

    r = _interrupt([sys.executable, "-m", "kernelmap.cli", "report", str(run), "-o", str(out)], drawing,
                   timeout=90)
    print(f"report: ready after {r['ready_s']:.1f} s, exited {r['rc']} {r['exit_s']:.2f} s after SIGINT")
    assert r["rc"] == 130, r["stderr"][-3000:]
    assert "Traceback" not in r["stderr"]
    assert not out.exists() and _leftovers(tmp_path, "rep") == []
    assert r["orphans"] == []


class _SwallowingCommand:
    """A stand-in subcommand module: Ctrl-C arrives inside 'C code' that turns it into a TypeError
    (what pybind11's argument conversion in matplotlib did to a real SIGINT on CI)."""

    @staticmethod
    def add_arguments(parser):
        parser.add_argument("--json", action="store_true")

    @staticmethod
    def main(args):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler runs at the next bytecode; never reached in full
        except KeyboardInterrupt:
            raise TypeError("affine_transform(): incompatible function arguments") from None
        raise AssertionError("SIGINT was not delivered")


class _FailingCommand(_SwallowingCommand):
    @staticmethod
    def main(args):
        raise TypeError("a real bug, no Ctrl-C")


@pytest.mark.parametrize("as_json", [False, True])
def test_interrupt_swallowed_by_c_code_still_exits_130(monkeypatch, capsys, as_json):
    from kernelmap import cli

    monkeypatch.setitem(sys.modules, "kernelmap_fake_cmd", _SwallowingCommand)
    monkeypatch.setattr(cli, "COMMANDS", {"fake": ("kernelmap_fake_cmd", "test")})
    rc = cli.main(["fake"] + (["--json"] if as_json else []))
    out, err = capsys.readouterr()
    assert rc == 130
    assert "kernelmap fake: interrupted; nothing partial was kept" in err
    assert ('"error": "interrupted"' in out) is as_json
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler restored


def test_other_exceptions_still_propagate(monkeypatch):
    from kernelmap import cli

    monkeypatch.setitem(sys.modules, "kernelmap_fake_cmd", _FailingCommand)
    monkeypatch.setattr(cli, "COMMANDS", {"fake": ("kernelmap_fake_cmd", "test")})
    with pytest.raises(TypeError, match="a real bug"):
        cli.main(["fake"])
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_atomic_writers_refuse_to_publish_after_a_swallowed_interrupt(tmp_path):
    """A Ctrl-C that C code swallowed entirely (no exception at all) still stops the rename."""
    from kernelmap import interrupt
    from kernelmap.atomic import atomic_dir, atomic_file, atomic_path

    handler = interrupt.install()
    assert isinstance(signal.getsignal(signal.SIGINT), interrupt.Interrupt)
    try:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        except KeyboardInterrupt:
            pass  # swallowed, as a C extension might
        assert interrupt.seen()
        for writer in (atomic_dir, atomic_path, atomic_file):
            target = tmp_path / f"out-{writer.__name__}"
            with pytest.raises(KeyboardInterrupt):
                with writer(target) as handle:
                    if writer is atomic_dir:
                        (handle / "x").write_text("x")
                    elif writer is atomic_path:
                        handle.write_text("x")
                    else:
                        handle.write("x")
            assert not target.exists()
        assert sorted(p.name for p in tmp_path.iterdir()) == []
    finally:
        interrupt.uninstall(handler)
    assert not interrupt.seen()


def test_a_signal_inside_a_deferred_block_is_raised_on_leaving_it():
    """Starting a worker is not cut in two: the signal is recorded inside and raised after."""
    from kernelmap import interrupt

    handler = interrupt.install()
    try:
        reached_end = False
        with pytest.raises(KeyboardInterrupt):
            with interrupt.deferred():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)  # the handler has run by now (it records, and does not raise here)
                assert handler.seen
                reached_end = True
        assert reached_end and handler.deferring == 0
    finally:
        interrupt.uninstall(handler)
