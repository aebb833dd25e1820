"""MXNet's profiler unlinks the file its ``set_config`` is given. The nsys and libs passes, which keep no
MXNet profile, once gave it ``os.devnull``: run as root, that deleted /dev/null on the GPU machine, and a
torch.compile worker of the same run then died with ``FileNotFoundError: '/dev/null'``. These tests run
the real MXNet (CPU) in a subprocess: the hazard itself, and the private scratch file the window uses."""

from __future__ import annotations

import textwrap

from conftest import run_framework

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, tempfile
    from pathlib import Path
    import mxnet as mx
    from kernelmap.frameworks.mxnet import workload

    # the hazard: a file that exists is gone once MXNet's profiler is configured with it
    victim = Path(tempfile.mkdtemp()) / "victim"
    victim.write_text("kept?")
    mx.profiler.set_config(profile_all=True, aggregate_stats=False, filename=str(victim))
    victim_gone = not victim.exists()

    with workload.profiler_scratch_file() as sink:
        folder = sink.parent
        fresh = sorted(p.name for p in folder.iterdir())
        mx.profiler.set_config(profile_all=True, aggregate_stats=False, filename=str(sink))
        mx.profiler.set_state("run")
        mx.nd.waitall()
        mx.profiler.set_state("stop")
    print(json.dumps({"victim_gone": victim_gone, "sink": str(sink), "fresh": fresh,
                      "folder_left": folder.exists(), "devnull": os.devnull,
                      "devnull_is_char_device": os.path.exists(os.devnull)
                                                and not os.path.isfile(os.devnull)}))
    """
)


def test_mxnet_profiler_gets_a_private_scratch_file_never_dev_null():
    out = run_framework("mxnet", ["-c", SCRIPT])
    assert out["victim_gone"] is True  # why the window must never name a file that anything else uses
    assert out["sink"] != out["devnull"] and not out["sink"].startswith("/dev/")
    assert out["fresh"] == []  # a folder of its own, empty: nothing of anyone else's to unlink
    assert out["folder_left"] is False  # removed afterwards
    assert out["devnull_is_char_device"] is True


def test_no_framework_workload_hands_os_devnull_to_a_profiler():
    """The MXNet descriptor's windows: ``os.devnull`` appears nowhere as a profiler's output file."""
    from pathlib import Path

    import kernelmap.frameworks as fw

    root = Path(fw.__file__).resolve().parent
    offenders = [f"{p.relative_to(root)}:{i}" for p in sorted(root.rglob("*.py"))
                 for i, line in enumerate(p.read_text().splitlines(), 1)
                 if "filename=os.devnull" in line.replace(" ", "")]
    assert offenders == [], offenders
