"""Issue 25 on a real GPU run: tests/data/gpu_link_run/{all,hyb}, the trimmed run directories of
benches/gpu_link.sh (PyTorch, MXNet imperative and JAX at batch 64, 256 and 1024; MXNet hybridized), each
normalised again here. Skipped (with the reason) until that fixture is in tests/data.

* every library kernel linked to its call: >= 99% of library-kernel time per framework x batch size x
  source, every unlinked kernel named with a reason;
* calls per step are the model's: every ``library calls per step`` self-check row passes, for every
  framework, mode and batch size;
* exact linked counts per framework against an independent reader (stdlib json / sqlite3 / the HLO text):
  the libs pass's own kernels (PyTorch's Kineto, MXNet's nsys) all owned by a logged call; the timing passes'
  library kernels counted from the raw files."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import sqlite3
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
FIXTURE = DATA / "gpu_link_run"
RUNS = ("all", "hyb")
BATCHES = (64, 256, 1024)
MIN_SHARE = 0.99
pytestmark = pytest.mark.skipif(not (FIXTURE / "all" / "manifest.json").is_file(),
                                reason="tests/data/gpu_link_run (benches/gpu_link.sh's gpu_link_run.tar.xz) not in place")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    from kernelmap.normalise import normalise_run_dir

    base = tmp_path_factory.mktemp("link")
    out = {}
    for name in RUNS:
        if (FIXTURE / name).is_dir():
            shutil.copytree(FIXTURE / name, base / name)
            normalise_run_dir(base / name)
            out[name] = base / name
    return out


def _attr(d: Path) -> dict:
    return json.loads((d / "attribution.json").read_text())


def test_every_framework_batch_and_mode_ran(runs):
    have = {(r["framework"], r["batch_size"]) for r in _attr(runs["all"])["runs"].values()}
    assert have == {(fw, bs) for fw in ("pytorch", "mxnet", "jax") for bs in BATCHES}
    assert {r["batch_size"] for r in _attr(runs["hyb"])["runs"].values()} == set(BATCHES)


def test_library_kernel_time_linked_at_least_99_percent_and_every_remainder_named(runs):
    for d in runs.values():
        for name, run in _attr(d)["runs"].items():
            for src, b in run["by_source"].items():
                assert b["library_kernels"] > 0, (name, src)
                assert b["library_kernel_time_linked_share"] >= MIN_SHARE, (name, src, b["library_unlinked_top"])
                assert all(u["reason"] for u in b["library_unlinked_top"])
                assert b["library_kernels_linked"] + b["library_kernels_unlinked"] == b["library_kernels"]


def test_library_calls_per_step_are_the_models(runs):
    from kernelmap.reports import analysis as A
    from kernelmap.reports import checks as C

    for name, d in runs.items():
        ch = C.self_checks([A.load_run(d)])
        lib = ch[ch["check"] == C.Check.LIBRARY_CALLS]
        fws = ("pytorch", "mxnet", "jax") if name == "all" else ("mxnet",)
        assert len(lib) == 6 * len(fws) * len(BATCHES), lib
        assert (lib["status"] == C.PASS).all(), lib[lib["status"] != C.PASS]
        # counted in their steps, never over the logged steps with warm-up and autotuning in them
        assert not lib["detail"].str.contains("logged steps").any()


# --- independent readers ------------------------------------------------------------------------
# PyTorch's entry points into cuDNN and cuBLAS: a kernel whose innermost launching op is one of these
LIBRARY_ENTRY_OPS = ("aten::cudnn_convolution", "aten::convolution_backward", "aten::addmm", "aten::mm")


def _kineto_library_kernels(path: Path) -> tuple[int, int]:
    """(count, total ns) of the library kernels of a PyTorch Kineto trace, from the raw Chrome trace:
    kernel -> runtime call (correlation) -> the innermost cpu_op around it on its thread is a library entry
    point (``LIBRARY_ENTRY_OPS``), and the kernel is not PyTorch's own (``at::native``)."""
    ev = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    ops: dict = {}
    for e in ev:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op":
            ops.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e.get("dur", 0), e["name"]))
    launch = {e["args"]["correlation"]: e for e in ev if e.get("ph") == "X"
              and e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    n = t = 0
    for e in ev:
        if e.get("ph") != "X" or e.get("cat") != "kernel" or "at::native" in e["name"]:
            continue
        r = launch.get(e["args"].get("correlation"))
        around = [o for o in ops.get((r["pid"], r["tid"]), []) if o[0] <= r["ts"] <= o[1]] if r else []
        if not around or max(around)[2] not in LIBRARY_ENTRY_OPS:
            continue
        n += 1
        t += round(e["dur"] * 1000)
    return n, t


def _open_sqlite(path: Path, tmp: Path) -> sqlite3.Connection:
    db = tmp / (path.name + ".plain")
    db.write_bytes(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes())
    return sqlite3.connect(db)


def test_pytorch_exact_counts(runs):
    from kernelmap import attribution  # noqa: F401  (the package under test is importable)

    d = runs["all"]
    attr = _attr(d)
    for bs in BATCHES:
        run = attr["runs"][f"pytorch/bs{bs}"]
        libs_n, _ = _kineto_library_kernels(d / "pytorch" / f"bs{bs}" / "libs" / "trace.json.gz")
        assert run["libs_trace_library_kernels"] == run["libs_trace_kernels_owned"] == libs_n
        assert run["libs_trace_kernels_owned_by_time"] > 0 and run["log_clock_offset_ns"] is not None
        n, t = _kineto_library_kernels(d / "pytorch" / f"bs{bs}" / "trace.json.gz")
        k = run["by_source"]["kineto"]
        assert (k["library_kernels"], k["library_kernel_time_ns"]) == (n, t)
        assert k["library_kernels_linked"] == n - k["library_kernels_unlinked"]


def test_mxnet_libs_pass_owns_its_kernels(runs, tmp_path):
    for name in RUNS:
        d = runs[name]
        for bs in BATCHES:
            run = _attr(d)["runs"][f"mxnet/bs{bs}"]
            assert run["libs_trace"].endswith(("nsys.sqlite", "nsys.sqlite.gz"))
            assert run["libs_trace_kernels_owned"] == run["libs_trace_library_kernels"] > 0
            # the nsys pass's kernels, from the export: every kernel the run's attribution counted
            f = next((d / "mxnet" / f"bs{bs}").glob("nsys.sqlite*"))
            con = _open_sqlite(f, tmp_path)
            total = con.execute("select count(*) from CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
            b = run["by_source"]["nsys"]
            assert 0 < b["library_kernels"] <= b["kernels"] <= total


def test_jax_exact_counts(runs):
    d = runs["all"]
    for bs in BATCHES:
        folder = d / "jax" / f"bs{bs}"
        hlo = next(folder.glob("*.hlo.txt*"))
        text = (gzip.decompress(hlo.read_bytes()) if hlo.suffix == ".gz" else hlo.read_bytes()).decode()
        targets = {m.group(1) for m in re.finditer(
            r'^\s*(?:ROOT )?%([\w.\-]+) = .*custom_call_target="__cu(?:dnn|blas)\$', text, re.M)}
        ev = json.loads(gzip.decompress((folder / "trace.json.gz").read_bytes()))["traceEvents"]
        pname = {e["pid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("name") == "process_name"}
        kern = [e for e in ev if e.get("ph") == "X" and pname.get(e["pid"], "").startswith("/device:")
                and "memcpy_details" not in e.get("args", {}) and "Memset_details" not in e.get("args", {})]
        direct = [e for e in kern if e["args"].get("hlo_op") in targets]
        b = _attr(d)["runs"][f"jax/bs{bs}"]["by_source"]["xla_trace"]
        # every kernel of a library custom call, and those a CUDA graph replays (placed by the schedule)
        assert b["library_kernels_linked"] >= len(direct) > 0
        assert b["library_kernels_linked"] == b["library_kernels"]
