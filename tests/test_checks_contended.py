"""Issue 42's last part: on a busy shared machine no self-check holds against each other two figures measured in two
processes, each under contention at its own time; where the run measured a kind of time a neighbour moves less (the
ops' own CPU time, in the same pass as the wall figure) the check judges that instead, and the same relations measured
quiet still fail (reports/checks.py, reports/relations.py, checkrows.BOTH_CONTENDED_RULE).

Fixtures: tests/data/cpu_bench_busy (the default CPU bench beside the full test suite, its capture passes busy: the
bench's report failed 3 "clean vs step benchmark" and 3 "library call within its op" rows, each of two processes
measured busy, or the busy one the slower) with the step benchmarks its bench saved (tests/data/cpu_bench_storage),
unpacked as tests/test_report_bench_pages.py does; its quiet twin tests/data/cpu_bench_quiet.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from kernelmap.reports import analysis as A
from kernelmap.reports import checks as C
from kernelmap.reports import relations as R
from test_report_bench_pages import DATA, RUNS, STORAGE, unpacked

from kernelmap import schema
from kernelmap.history.trend import load_history
from kernelmap.normalise import normalise_run_dir

CONV2 = ("conv2 fwd, framework-op time: bs 64 -> 256", "conv2 fwd, CPU time of its ops: bs 64 -> 256")


@pytest.fixture(scope="module")
def benches(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("contended")
    out = {"storage": unpacked(STORAGE, tmp / "storage")}
    for which, name in RUNS.items():
        out[which] = unpacked(DATA / name, tmp / name)
        normalise_run_dir(out[which])
    return out


def _checks(run: Path, storage: Path | None = None) -> pd.DataFrame:
    return C.self_checks([A.load_run(run)], load_history(storage) if storage else None)


def _clean_ms(run: Path, fw: str, bs: int) -> float:
    """The clean pass's median step of ``fw`` bs ``bs``, read from results.json with the standard library."""
    r = next(x for x in json.loads((run / "results.json").read_text()) if x["framework"] == fw and x["batch_size"] == bs)
    return r["median_step_s"] * 1e3


def test_the_busy_bench_fails_only_its_busy_figures(benches):
    """What the bench failed besides its busy figures was two processes' figures each measured busy at its own time
    (or the busy one the slower): every such row is not checked and names both contentions."""
    c = _checks(benches["busy"], benches["storage"])
    assert c[c["status"] == C.FAIL]["check"].value_counts().to_dict() == {C.Check.QUIET: 18}
    within = c[c["check"] == C.Check.CALL_WITHIN_OP]
    both = within[within["detail"].str.contains(C.BOTH_CONTENDED_RULE, regex=False)]
    assert len(within) == 32 and set(within["status"]) == {C.NOT_CHECKED} and len(both) == 16
    assert all(d.count("pass: BUSY: ") == 2 and R.NO_SAME_PASS in d for d in both["detail"])
    every = c[c["check"] == C.Check.CLEAN_VS_BENCH]
    assert len(every) == 6 and set(every["status"]) == {C.NOT_CHECKED}  # 3 frameworks x 2 batch sizes
    assert every["detail"].str.startswith(f"not held against each other: {C.BOTH_CONTENDED_RULE}: ").sum() == 4
    bench = every[every["batch_size"] == 64].set_index("framework")
    for fw in bench.index:
        assert bench.loc[fw, "expected"] == pytest.approx(_clean_ms(benches["busy"], fw, 64), rel=1e-12)
    assert bench.loc["jax", "detail"].startswith(f"not held against each other: {C.BOTH_CONTENDED_RULE}: ")
    # PyTorch's clean pass ran quiet (12.56 ms) and its benchmark busy (26.80 ms): the busy one the slower
    assert bench.loc["pytorch", "detail"].startswith("not held against each other: the step benchmark ran under "
                                                     "contention and the other quiet, and it is the slower: ")
    assert bench.loc["pytorch", "measured"] > 2 * bench.loc["pytorch", "expected"]


def _layer_rows(run: Path) -> pd.DataFrame:
    c = _checks(run)
    return c[(c["check"] == C.Check.LAYER_VS_BATCH) & (c["framework"] == "pytorch")].set_index("subject")


def _shorten_conv2_fwd(run: Path, factor: float) -> None:
    """PyTorch bs 256's conv2 forward ops (160 events: 20 traced steps x its nested aten ops) made ``factor`` as
    long in the trace's records: less of the worker's sampled CPU time falls within them."""
    rec = schema.read_parquet(run / "records.parquet")
    hit = (rec["framework"].eq("pytorch") & rec["batch_size"].eq(256) & rec["kind"].eq("op")
           & rec["layer"].eq("conv2") & rec["direction"].eq("fwd"))
    assert int(hit.sum()) == 160
    rec.loc[hit, "dur_ns"] = (rec.loc[hit, "dur_ns"] * factor).astype(rec["dur_ns"].dtype)
    schema.write_parquet(rec, run / "records.parquet")


@pytest.mark.parametrize("which", sorted(RUNS))
def test_layer_time_vs_batch_size_is_judged_on_cpu_time_where_wall_time_is_not_held(benches, which, tmp_path):
    """The wall rows of passes run apart from their clean pass or contended are not held; the same layer's ops' own
    CPU time (the framework pass's, as the CPU-time answer shows it) is, busy or quiet, and fails a planted fall."""
    rows = _layer_rows(benches[which])
    wall, cpu = rows.loc[CONV2[0]], rows.loc[CONV2[1]]
    assert wall["status"] == C.NOT_CHECKED and wall["detail"].endswith(f"judged on its ops' CPU time instead: {CONV2[1]}")
    assert cpu["status"] == C.PASS and C.CPU_BY_INTERVALS in cpu["detail"]
    bs64, bs256 = {"busy": (2.55498, 9.598412), "quiet": (2.293478, 10.081252)}[which]  # ms a step, the CPU answer's
    assert (cpu["expected"], cpu["measured"]) == (pytest.approx(bs64, rel=1e-5), pytest.approx(bs256, rel=1e-6))
    assert ("BUSY: " in cpu["detail"]) == (which == "busy")
    d = tmp_path / which
    shutil.copytree(benches[which], d)
    _shorten_conv2_fwd(d, 0.1)
    rows = _layer_rows(d)
    assert rows.loc[CONV2[0], "status"] == C.NOT_CHECKED
    cpu = rows.loc[CONV2[1]]
    assert cpu["status"] == C.FAIL and cpu["measured"] < cpu["expected"] / 2
    assert "at bs 256 falls below bs 64 beyond noise" in cpu["detail"]


def test_the_page_says_which_calls_and_ops_are_not_comparable(benches):
    """The layer table's column beside the call and op times says what the check decided, row by row."""
    for which in RUNS:
        run = A.load_run(benches[which])
        lt = R.with_call_op_basis([run], A.layer_table([run]))
        c = _checks(benches[which])
        c = c[c["check"] == C.Check.CALL_WITHIN_OP].set_index(["framework", "batch_size", "subject"])
        lib = lt[lt["time_kind"] == "library-call time"]
        assert len(lib) == len(c) == 32
        for _, x in lib.iterrows():
            row = c.loc[(x["framework"], x["batch_size"], f"{x['layer']} {x['direction']}")]
            said = x[R.CALL_VS_OP]
            assert (said == "one basis") == (row["status"] != C.NOT_CHECKED), (said, row["status"])
            if said != "one basis":
                assert row["detail"].endswith(said.removeprefix("not comparable: "))


def test_the_overhead_figure_gives_no_overhead_of_busy_passes(benches, tmp_path, monkeypatch):
    """The profiler-overhead figure's labels: 'busy' where the capture pass or its clean pass ran contended (the
    busy bench: every capture pass, so no '+16%' of two processes each slowed by its own neighbours); the quiet
    bench keeps its changes and 'noise' (the figure's rule: timing.OverheadVerdict)."""
    from kernelmap.reports import figures as F

    def labels_of(run: Path) -> list[str]:
        drawn = []
        monkeypatch.setattr(F, "save_png", lambda fig, path: drawn.append(fig) or Path(path))
        ov = A.profiler_overhead([A.load_run(run)])
        assert F.overhead_figure(ov, tmp_path / "overhead.png") is not None
        out = [t.get_text().strip() for ax in drawn[0].axes for t in ax.texts if t.get_text().strip()]
        F.plt.close(drawn[0])
        return out
    ov = A.profiler_overhead([A.load_run(benches["busy"])])
    captured = ov[(ov["pass"] != "clean") & ov["overhead"].notna()]
    assert len(captured) == 12 and set(captured["contended"]) == {True}
    assert labels_of(benches["busy"]) == ["busy"] * 12
    quiet = labels_of(benches["quiet"])
    assert len(quiet) == 12 and "busy" not in quiet and any(x.endswith("%") for x in quiet)


def _contention_of(run: Path, fw: str, bs: int, name: str) -> dict:
    """A pass's contention record as the bench wrote it in results.json."""
    r = next(x for x in json.loads((run / "results.json").read_text()) if x["framework"] == fw and x["batch_size"] == bs)
    return r["passes"][name]["contention"]


def test_the_three_checks_decide_two_busy_processes_by_one_rule(benches, tmp_path):
    """``relations.contended_apart`` owns the decision that two figures, each measured busy in its own process at its
    own time, are not held: given the same two contention records (the busy bench's PyTorch bs 64 libs and framework
    passes, both BUSY), ``library call within its op`` (MXNet bs 64 conv1 fwd), ``layer time vs batch size`` (JAX
    conv1 fwd framework-op time, bs 64 -> 256) and ``clean vs step benchmark`` (PyTorch bs 64) planted on the quiet
    bench say the same: not checked, in its one wording. Given the quiet bench's own records of those passes, each
    holds its pair (the untouched quiet bench passes all three) and none says it."""
    from kernelmap.reports.analyses.base import Busy

    history = load_history(benches["storage"])
    subjects = {C.Check.CALL_WITHIN_OP: ("mxnet", 64, "conv1 fwd"),
                C.Check.LAYER_VS_BATCH: ("jax", 256, "conv1 fwd, framework-op time: bs 64 -> 256"),
                C.Check.CLEAN_VS_BENCH: ("pytorch", 64, "pytorch eager cpu bs 64")}
    for which, want_held in (("busy", False), ("quiet", True)):
        a, b = (_contention_of(benches[which], "pytorch", 64, p) for p in ("libs", "framework"))
        said = R.contended_apart(Busy.of({"contention": a}), Busy.of({"contention": b}))
        assert said == ("" if want_held else C.BOTH_CONTENDED_RULE)
        d = tmp_path / which
        shutil.copytree(benches["quiet"], d)
        res = json.loads((d / "results.json").read_text())
        at = {(x["framework"], x["batch_size"]): x for x in res}
        at["mxnet", 64]["passes"]["libs"]["contention"] = a
        at["mxnet", 64]["passes"]["framework"]["contention"] = b
        at["jax", 64]["passes"]["framework"]["contention"] = a
        at["jax", 256]["passes"]["framework"]["contention"] = b
        at["pytorch", 64]["contention"] = at["pytorch", 64]["passes"]["clean"]["contention"] = a
        (d / "results.json").write_text(json.dumps(res))
        h = history.copy()
        job = json.loads((d / "manifest.json").read_text())["job"]
        bench = (h["job"] == job) & (h["key"] == "pytorch-eager-cpu-64")
        assert int(bench.sum()) == 1
        h.loc[bench, ["contended", "contention_text"]] = [b["contended"], b["text"]]
        c = C.self_checks([A.load_run(d)], h)
        rows = {k: c[(c["check"] == k) & (c["framework"] == fw) & (c["batch_size"] == bs) & (c["subject"] == s)]
                for k, (fw, bs, s) in subjects.items()}
        assert {k: len(r) for k, r in rows.items()} == dict.fromkeys(subjects, 1)
        rows = {k: r.iloc[0] for k, r in rows.items()}
        assert {k: r["status"] == C.NOT_CHECKED for k, r in rows.items()} == dict.fromkeys(subjects, not want_held)
        if want_held:
            assert {r["status"] for r in rows.values()} == {C.PASS}
            assert not any(C.BOTH_CONTENDED_RULE in r["detail"] for r in rows.values())
            continue
        assert f"(framework pass, median of 20 steps): {said}; {R.NO_SAME_PASS}; " in rows[C.Check.CALL_WITHIN_OP][
            "detail"]
        assert rows[C.Check.LAYER_VS_BATCH]["detail"].startswith(f"not held against each other: {said}; bs 64's pass: ")
        assert rows[C.Check.CLEAN_VS_BENCH]["detail"].startswith(f"not held against each other: {said}: clean pass ")
