"""The ops' own CPU time on a real three-framework CPU run with the CPU sampler (tests/data/cpu_opcpu_run: every
framework pass ran while other processes used 1.0-1.1 of the 2 cores): the samples as recorded, the trace put on
their clock, the CPU-time table's ratio for every layer and direction on a busy machine, and each self-check of
the sampled time made to fail."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from kernelmap.reports import analysis as A
from kernelmap.reports import answer as ANS
from kernelmap.reports.analyses import basis as B
from kernelmap.reports.analyses import opcpu as OC
from kernelmap.reports.checkrows import FAIL, NOT_CHECKED, PASS, Check
from kernelmap.reports.cpuchecks import NO_SAMPLES, NO_THREAD_FILES, op_cpu_checks

from kernelmap import cpusampler
from kernelmap.normalise import normalise_run_dir

DATA = Path(__file__).parent / "data" / "cpu_opcpu_run"
FWS = ("pytorch", "mxnet", "jax")
SAMPLES = {"pytorch": 2220, "mxnet": 1305, "jax": 4481}  # rows of each cpu_samples.npy (np.load)
ROWS = [(layer, d) for layer in ("conv1", "conv2", "fc1", "fc2") for d in ("fwd", ANS.BWD_ALL)]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> A.Run:
    """The fixture normalised in a copy (``run.path``), loaded."""
    copy = shutil.copytree(DATA, tmp_path_factory.mktemp("opcpu") / DATA.name)
    normalise_run_dir(copy)
    return A.load_run(copy)


def _cpu_table(run: A.Run):
    return ANS.cpu_table(A.layer_table([run]), B.cpu_states([run]), B.traced_op_ms([run]), OC.op_cpu_of([run]))


def _variant(run: A.Run, tmp_path: Path, edit) -> A.Run:
    """A copy of the normalised run with ``edit(copy)`` applied, loaded afresh."""
    d = tmp_path / "variant"
    shutil.copytree(run.path, d)
    edit(d)
    return A.load_run(d)


def _edit_json(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def _scatter_marks(doc):
    marks = doc[cpusampler.RESULT_KEY][cpusampler.MARKS_KEY]
    doc[cpusampler.RESULT_KEY][cpusampler.MARKS_KEY] = [[s, a + i * 300_000, b] for i, (s, a, b) in enumerate(marks)]


def _quiet_passes(doc):
    for r in doc:
        r["passes"]["framework"]["contention"] = {"contended": False, "text": "quiet"}


def test_samples_and_marks_as_recorded(run):
    got = OC.op_cpu(run)
    assert sorted(got) == sorted((fw, 64) for fw in FWS)
    for fw in FWS:
        rows = np.load(DATA / fw / "bs64" / cpusampler.SAMPLES_FILE)
        fig = json.loads((DATA / fw / "bs64" / "framework.json").read_text())[cpusampler.RESULT_KEY]
        assert rows.shape == (SAMPLES[fw], cpusampler.COLUMNS) == (fig["samples"], 4)
        oc = got[(fw, 64)]
        assert oc.measured, oc.why
        assert [m[0] for m in fig[cpusampler.MARKS_KEY]] == list(range(5, 25)) == list(oc.iterations)
        assert oc.fit.n == 20 and oc.fit.good
        # marks lie within the samples: the sampler ran through the traced steps
        assert rows[0, 0] < fig[cpusampler.MARKS_KEY][0][1] and fig[cpusampler.MARKS_KEY][-1][2] <= rows[-1, 0]
    # the ops of an asynchronous engine and of XLA run off the main thread: its time is left out (MAIN_RULE)
    assert [got[(fw, 64)].main_in_ops for fw in FWS] == [True, False, False]


def test_ops_on_the_main_thread_keep_its_time_whatever_the_traces_thread_ids(run, tmp_path):
    """MXNet's NaiveEngine runs its ops on the main thread, and its profiler still names threads by hashes of its
    own (never the OS pid): the fixture's MXNet samples with the main thread's column and the engine threads' swapped
    (main := all - main: its ops' work on the main thread). The main thread is kept in the ops (decided from the
    samples), so a layer reads its ops' CPU time, not the front end's 8%."""
    path = Path("mxnet/bs64") / cpusampler.SAMPLES_FILE

    def naive(d: Path):
        rows = np.load(d / path)
        rows[:, 3] = rows[:, 1] - rows[:, 3]
        np.save(d / path, rows)

    v = _variant(run, tmp_path, naive)
    oc = OC.op_cpu(v)[("mxnet", 64)]
    assert oc.main_in_ops is True and "from the samples" in oc.main_how and "runs them" in oc.main_how
    lc, was = OC.layer_cpu(oc, "conv2", {"fwd"}), OC.layer_cpu(OC.op_cpu(run)[("mxnet", 64)], "conv2", {"fwd"})
    assert lc.ms == pytest.approx(was.ms, rel=0.02)  # the whole process's, as the engine threads' were
    assert lc.utilisation > 0.5
    # PyTorch's decided from the samples alike (its trace's ids are the OS's: decided by them as recorded)
    pt = OC.op_cpu(run)[("pytorch", 64)]
    full = cpusampler.Samples.read(DATA / "pytorch" / "bs64" / cpusampler.SAMPLES_FILE)
    assert OC.main_thread(pt.events, None, full, pt.fit, pt.sampler["median_gap_us"])[0] is True


def test_main_thread_not_decided_is_kept(run, tmp_path):
    """The NaiveEngine edit above for the first 70% of the samples only, the main thread idle after: idle through
    about 30% of the long ops, between the two bounds: not decided, so not dropped, and the check's detail says so;
    too few long ops decide nothing either."""
    path = Path("mxnet/bs64") / cpusampler.SAMPLES_FILE

    def part(d: Path):
        rows = np.load(d / path)
        others = rows[:, 1] - rows[:, 3]
        k = int(len(rows) * 0.7)
        rows[:, 3] = np.concatenate([others[:k], np.full(len(rows) - k, others[k - 1])])
        np.save(d / path, rows)

    v = _variant(run, tmp_path, part)
    oc = OC.op_cpu(v)[("mxnet", 64)]
    assert oc.main_in_ops is None and "not decided, kept" in oc.main_how, oc.main_how
    assert oc.ops_step_cpu_ms == oc.step_cpu_ms  # nothing left out
    assert "not decided, kept" in _status(v, "mxnet", Check.OP_CPU_WITHIN)[1]
    full = cpusampler.Samples.read(run.path / path)
    few = OC.main_thread(oc.events.iloc[:5], None, full, oc.fit, oc.sampler["median_gap_us"])
    assert few[0] is None and "not decided" in few[1]


def test_the_pass_cpu_time_leaves_the_samplers_own_out(run):
    """cpusampler.OWN_RULE: the framework pass's process CPU time per step less the sampler thread's own over each
    marked step (np.interp of the .npy's own column at the marks), against results.json's figure, which holds it."""
    states = B.cpu_states([run])
    results = {r["framework"]: r for r in json.loads((DATA / "results.json").read_text())}
    for fw in FWS:
        res = json.loads((DATA / fw / "bs64" / "framework.json").read_text())
        rows = np.load(DATA / fw / "bs64" / cpusampler.SAMPLES_FILE).astype(np.float64)
        marks = np.asarray(res[cpusampler.RESULT_KEY][cpusampler.MARKS_KEY], dtype=np.float64)
        own = (np.interp(marks[:, 2], rows[:, 0], rows[:, 2]) - np.interp(marks[:, 1], rows[:, 0], rows[:, 2])) / 1e9
        want = float(np.median(np.asarray(res["cpu_step_times_s"]) - own))
        st = states[(run.name, fw, 64, "framework")]
        recorded = results[fw]["passes"]["framework"]["cpu_time"]["median_step_s"]
        assert st.cpu_median_s == pytest.approx(want, rel=1e-9) and st.cpu_median_s < recorded
        assert st.sampler_ms == pytest.approx(float(np.median(own)) * 1e3, rel=1e-9)
        assert 0.02 < st.sampler_ms / (recorded * 1e3) < 0.15  # 3.7-6% of a core, the steps ~1 core busy
    # the figures that hold the sampler's thread name it: the share estimate, and the framework-op time of the
    # wall-time answer (its ops ran beside that thread)
    assert "less the CPU sampler's own" in B.PER_LAYER_CPU and "CPU sampler's own" in ANS.SHARED
    wall, _ = ANS.answer_table(A.layer_table([run]), B.pass_states([run]))
    assert wall[[f"{fw}.time_source" for fw in FWS]].map(lambda v: "CPU sampler" in v if isinstance(v, str) else True).all().all()
    assert wall["pytorch.time_source"].map(lambda v: "CPU sampler" in str(v)).any()


def test_the_trace_is_put_on_the_samples_clock_by_its_step_marks(run):
    """PyTorch's fit against the Kineto file read with the standard library: its step events' ts (µs) x 1000."""
    doc = json.loads(gzip.decompress((DATA / "pytorch" / "bs64" / "trace.json.gz").read_bytes()))
    starts = {int(e["name"].split("#")[1]): round(e["ts"] * 1000) for e in doc["traceEvents"]
              if str(e.get("name", "")).startswith("kernelmap:step#") and e.get("ph") == "X"}
    marks = json.loads((DATA / "pytorch" / "bs64" / "framework.json").read_text())[cpusampler.RESULT_KEY][
        cpusampler.MARKS_KEY]
    want = int(np.median([starts[s] - a for s, a, _ in marks]))
    assert abs(OC.op_cpu(run)[("pytorch", 64)].fit.offset_ns - want) <= 1


def test_a_layers_cpu_time_from_the_samples_by_hand(run):
    """PyTorch's conv2 forward: each op's CPU time interpolated from the .npy with numpy alone (its ops run one at
    a time on the main thread: nothing to share), summed per traced step, the median."""
    oc = OC.op_cpu(run)[("pytorch", 64)]
    rows = np.load(DATA / "pytorch" / "bs64" / cpusampler.SAMPLES_FILE).astype(np.float64)
    ev = oc.events[(oc.events["layer"] == "conv2") & (oc.events["direction"] == "fwd")
                   & (oc.events["canonical_op"] == "conv2d")]
    assert len(ev) == 20  # one a traced step
    a = ev["start_ns"].to_numpy(dtype=np.int64) - oc.fit.offset_ns
    b = a + ev["dur_ns"].to_numpy(dtype=np.int64)
    by_hand = np.interp(b, rows[:, 0], rows[:, 1]) - np.interp(a, rows[:, 0], rows[:, 1])
    lc = OC.layer_cpu(oc, "conv2", {"fwd"})
    assert lc.ms == pytest.approx(float(np.median(by_hand)) / 1e6, rel=1e-9)
    assert lc.ci_ms[0] <= lc.ms <= lc.ci_ms[1]
    assert 0 < lc.utilisation <= 2  # CPU over wall within the 2 cores


def test_every_sampled_layer_and_direction_has_a_cpu_ratio_on_a_busy_run(run):
    assert all(r["passes"]["framework"]["contention"]["contended"] for r in run.results)
    cpu, fws = _cpu_table(run)
    assert fws == list(FWS)
    per_layer = cpu[cpu["layer"] != ANS.WHOLE_STEP]
    assert sorted(map(tuple, per_layer[["layer", "direction"]].to_numpy())) == sorted(ROWS)
    # JAX's layers whose ops shared XLA's pool with a pending thunk's work have no figure (cpusampler.POOL_RULE,
    # tests/test_thunk_completion.py): all but conv2 fwd here
    held = per_layer["jax.method"].eq(ANS.WITHHELD)
    assert sorted(map(tuple, per_layer.loc[~held, ["layer", "direction"]].to_numpy())) == [("conv2", "fwd")]
    assert per_layer.loc[held, "jax.cpu_ms"].isna().all()
    assert per_layer.loc[held, "jax.no_ratio"].str.contains("JAX's ops' own CPU time not sampled: ").all()
    assert per_layer["mxnet.vs_ref"].notna().all() and per_layer.loc[~held, "jax.vs_ref"].notna().all()
    assert (per_layer[["pytorch.method", "mxnet.method"]] == ANS.SAMPLED).all().all()
    assert (per_layer.loc[~held, "jax.method"] == ANS.SAMPLED).all()
    assert per_layer["pytorch.busy"].str.startswith("other processes used").all()  # marked, not withheld
    # the wall-time answer of the same run withholds its ratios: its passes ran busy
    wall, _ = ANS.answer_table(A.layer_table([run]), B.pass_states([run]))
    assert wall[["mxnet.vs_ref", "jax.vs_ref"]].isna().all().all()


def test_the_checks_of_the_sampled_time_pass_on_the_real_run(run):
    rows = op_cpu_checks(run)
    # recorded before the per-thread pool files: that check is said once for the run, not checked
    (threads,) = [r for r in rows if r["check"] == Check.OP_CPU_THREADS]
    assert (threads["framework"], threads["status"], threads["detail"]) == (None, NOT_CHECKED, NO_THREAD_FILES)
    rows = [r for r in rows if r is not threads]
    assert sorted((r["framework"], r["check"], r["subject"]) for r in rows) == sorted(
        (fw, c, s) for fw in FWS for c, s in ((Check.OP_CPU_SAMPLED, "the sampler's reads"),
                                              (Check.OP_CPU_SAMPLED, "CPU time per traced step"),
                                              (Check.OP_CPU_WITHIN, "traced ops"),
                                              (Check.OP_CPU_WALL, "layers x directions")))
    # every framework pass ran busy: CPU vs wall has only its upper bound, which is not called a pass
    wall = [r for r in rows if r["check"] == Check.OP_CPU_WALL]
    assert {r["status"] for r in wall} == {NOT_CHECKED} and all("busy pass" in r["detail"] for r in wall)
    rest = [r for r in rows if r["check"] != Check.OP_CPU_WALL]
    assert {r["status"] for r in rest} == {PASS}, [r["detail"] for r in rest if r["status"] != PASS]
    # the sampler's reads name their largest gap where it is over 10x the median (MXNet: 8.22 ms against 321 µs)
    reads = next(r for r in rows if r["framework"] == "mxnet" and r["subject"] == "the sampler's reads")
    assert "largest 8223 µs (25.6x the median" in reads["detail"] and "5.3% of a core" in reads["detail"]


def test_a_sampler_that_missed_threads_fails(run, tmp_path):
    """The native sampler's thread table full, or a failed allocation that dropped samples: threads_missed."""
    v = _variant(run, tmp_path, lambda d: _edit_json(d / "jax/bs64/framework.json",
                                                     lambda doc: doc[cpusampler.RESULT_KEY].update(threads_missed=True)))
    row = next(r for r in op_cpu_checks(v) if r["framework"] == "jax" and r["subject"] == "the sampler's reads")
    assert row["status"] == FAIL and "missed a thread or dropped samples" in row["detail"]


def _status(run: A.Run, fw: str, check: Check) -> tuple[str, str]:
    row = next(r for r in op_cpu_checks(run) if r["framework"] == fw and r["check"] == check)
    return row["status"], row["detail"]


def test_sampled_time_unlike_the_workers_own_fails(run, tmp_path):
    path = Path("mxnet/bs64/framework.json")
    v = _variant(run, tmp_path, lambda d: _edit_json(d / path, lambda doc: doc.update(
        cpu_step_times_s=[x * 1.1 for x in doc["cpu_step_times_s"]])))
    status, detail = _status(v, "mxnet", Check.OP_CPU_SAMPLED)
    assert status == FAIL and "beyond 2%" in detail


def test_marks_that_are_not_the_steps_fail(run, tmp_path):
    def shorten(doc):
        marks = doc[cpusampler.RESULT_KEY][cpusampler.MARKS_KEY]
        doc[cpusampler.RESULT_KEY][cpusampler.MARKS_KEY] = [[s, a, a + 1_000_000] for s, a, _ in marks]

    v = _variant(run, tmp_path, lambda d: _edit_json(d / "pytorch/bs64/framework.json", shorten))
    assert _status(v, "pytorch", Check.OP_CPU_WITHIN)[0] == FAIL  # the ops hold more than 1 ms a step
    assert _status(v, "pytorch", Check.OP_CPU_SAMPLED)[0] == FAIL


def test_cpu_above_the_cores_or_below_wall_on_a_quiet_pass_fails(run, tmp_path):
    v = _variant(run, tmp_path, lambda d: _edit_json(d / "manifest.json", lambda m: m["host"].update(cpu_count=1)))
    status, detail = _status(v, "jax", Check.OP_CPU_WALL)  # JAX's small fusions ran above 1 core
    assert status == FAIL and "1 cores" in detail

    q = _variant(run, tmp_path / "q", lambda d: _edit_json(d / "results.json", _quiet_passes))
    status, detail = _status(q, "jax", Check.OP_CPU_WALL)  # busy, its 2.4 ms conv2 forwards got half a core
    assert status == FAIL and "conv2 fwd 0.50 x" in detail and "quiet" in detail
    assert _status(q, "pytorch", Check.OP_CPU_WALL)[0] == PASS  # 0.87-0.95: above the floor
    assert _status(run, "jax", Check.OP_CPU_WALL)[0] == NOT_CHECKED  # as recorded (busy): the upper bound only


def test_a_trace_not_on_the_samples_clock_fails_and_its_layers_fall_back(run, tmp_path):
    v = _variant(run, tmp_path, lambda d: _edit_json(d / "jax/bs64/framework.json", _scatter_marks))
    oc = OC.op_cpu(v)[("jax", 64)]
    assert not oc.measured and "not put on the sampler's clock" in oc.why
    assert _status(v, "jax", Check.OP_CPU_WITHIN)[0] == FAIL
    cpu, _ = _cpu_table(v)
    per_layer = cpu[cpu["layer"] != ANS.WHOLE_STEP]
    assert (per_layer["jax.method"] == ANS.SHARED).all() and per_layer["jax.vs_ref"].isna().all()
    assert per_layer["jax.no_ratio"].str.contains("not put on the sampler's clock").all()


def test_no_ratio_between_a_sampled_and_a_share_estimate_cell(run, tmp_path):
    """JAX's trace off the samples' clock on quiet passes: its layers fall back to the share estimate, which a
    quiet pass lets be compared, and PyTorch's stay sampled: two methods, no ratio between them (the ratio drawn
    read conv1 fwd 6.30x, fc2 fwd 0.21x)."""
    def edit(d: Path):
        _edit_json(d / "jax/bs64/framework.json", _scatter_marks)
        _edit_json(d / "results.json", _quiet_passes)

    cpu, _ = _cpu_table(_variant(run, tmp_path, edit))
    per_layer = cpu[cpu["layer"] != ANS.WHOLE_STEP]
    assert (per_layer["jax.method"] == ANS.SHARED).all() and (per_layer["pytorch.method"] == ANS.SAMPLED).all()
    assert per_layer["jax.comparable"].any()  # the share estimate alone would be drawn
    assert per_layer["jax.vs_ref"].isna().all(), per_layer[["layer", "direction", "jax.vs_ref"]]
    assert per_layer["jax.no_ratio"].str.contains("measured apart").all()
    assert per_layer["jax.no_ratio"].str.contains("not put on the sampler's clock").all()  # why it fell back
    assert per_layer["mxnet.vs_ref"].notna().all()  # sampled against sampled: drawn
    whole = cpu[cpu["layer"] == ANS.WHOLE_STEP]
    assert whole["jax.vs_ref"].notna().all()  # the whole step: one method for every framework


def test_ops_above_their_clean_step_keep_their_layers_from_a_ratio(run, tmp_path):
    """basis.OPS_WITHIN_CLEAN: MXNet's clean pass set to half its CPU time, its two trials alike (no spread between
    processes to widen by); its ops then hold more than a clean step."""
    def halve(d: Path):
        for f in (d / "mxnet" / "bs64").glob("clean-*.json"):
            _edit_json(f, lambda doc: doc.update(cpu_step_times_s=[x / 2 for x in doc["cpu_step_times_s"]]))

        def entry(doc):
            for r in doc:
                if r["framework"] == "mxnet":
                    c = r["cpu_time"]
                    for k in ("median_step_s", "ci95_low_s", "ci95_high_s"):
                        c[k] /= 2
                    c["trial_medians_s"] = [c["median_step_s"]] * 2

        _edit_json(d / "results.json", entry)

    v = _variant(run, tmp_path, halve)
    cpu, _ = _cpu_table(v)
    per_layer = cpu[cpu["layer"] != ANS.WHOLE_STEP]
    assert per_layer["mxnet.vs_ref"].isna().all()
    assert per_layer["jax.vs_ref"].notna().tolist() == per_layer["jax.method"].eq(ANS.SAMPLED).tolist()
    assert per_layer["mxnet.no_ratio"].str.contains("traced ops took").all()


def test_a_clean_pass_without_an_interval_keeps_the_sampled_layers_from_a_ratio(run, tmp_path):
    """basis.OPS_WITHIN_CLEAN needs the clean step's interval: where the clean pass records none, a sampled layer is
    not judged, so not compared (as the share estimate's NO_INTERVAL)."""
    def no_interval(doc):
        for r in doc:
            if r["framework"] == "mxnet":
                del r["cpu_time"]["ci95_low_s"], r["cpu_time"]["ci95_high_s"]

    v = _variant(run, tmp_path, lambda d: _edit_json(d / "results.json", no_interval))
    cpu, _ = _cpu_table(v)
    per_layer = cpu[cpu["layer"] != ANS.WHOLE_STEP]
    assert (per_layer["mxnet.method"] == ANS.SAMPLED).all()
    assert per_layer["mxnet.vs_ref"].isna().all()
    assert per_layer["jax.vs_ref"].notna().tolist() == per_layer["jax.method"].eq(ANS.SAMPLED).tolist()
    assert per_layer["mxnet.no_ratio"].str.contains("no interval to judge its ops by").all()


def test_a_run_without_samples_says_so(tmp_path):
    d = tmp_path / "old"
    shutil.copytree(Path(__file__).parent / "data" / "cpu_run_cputime", d)
    normalise_run_dir(d)
    run = A.load_run(d)
    assert all("sampled no CPU time" in oc.why for oc in OC.op_cpu(run).values())
    rows = op_cpu_checks(run)  # nothing sampled: each of the four checks once, not checked, saying why
    assert [(r["check"], r["status"], r["detail"]) for r in rows] == [
        (Check.OP_CPU_SAMPLED, NOT_CHECKED, NO_SAMPLES), (Check.OP_CPU_WITHIN, NOT_CHECKED, NO_SAMPLES),
        (Check.OP_CPU_THREADS, NOT_CHECKED, NO_THREAD_FILES), (Check.OP_CPU_WALL, NOT_CHECKED, NO_SAMPLES)]


def test_the_samples_are_kernelmaps_own_not_unrecognised_content(run):
    from kernelmap.normalise import OWN_SAMPLES

    skipped = json.loads((run.path / "attribution.json").read_text())["not_records"]
    mine = {s["file"]: s["reason"] for s in skipped if s["file"].endswith(cpusampler.SAMPLES_FILE)}
    assert mine == {f"{fw}/bs64/{cpusampler.SAMPLES_FILE}": OWN_SAMPLES for fw in FWS}


def test_the_pass_and_the_layer_ops_are_one_constant_each():
    """The framework pass's name is the worker's (it decides where the sampler runs); the layer ops are the layer
    table's (the math check's products and the sampled layers' ops are its rows)."""
    from kernelmap.reports import cpuchecks
    from kernelmap.reports.analyses import math as M
    from kernelmap.reports.analyses import ops

    from kernelmap import worker

    assert OC.FRAMEWORK_PASS is worker.FRAMEWORK_PASS is cpuchecks.FRAMEWORK_PASS and worker.FRAMEWORK_PASS in worker.PASSES
    assert OC.LAYER_OPS is ops.LAYER_OPS is M.MULTIPLY_OPS is cpuchecks.LAYER_OPS


def test_the_cpu_answer_csvs_columns_are_documented():
    """tables/cpu_answer.csv (answer.cpu_table): each per-framework column is named in docs/timing.md, and the doc
    says what withholds a sampled layer's ratio as the code does (basis.OPS_WITHIN_CLEAN, not the pass's CPU time)."""
    doc = (Path(__file__).parents[1] / "docs" / "timing.md").read_text()
    for field in (*ANS.CPU_FIELDS, "vs_ref", "no_ratio"):
        assert f"`.{field}`" in doc or f"`<fw>.{field}`" in doc, field
    for method in (ANS.SAMPLED, ANS.STEP_CPU, ANS.SHARED):
        assert " ".join(method.split()) in " ".join(doc.split()), method
    assert "lies apart from its clean pass's beyond noise" not in doc and "`basis.OPS_WITHIN_CLEAN`" in doc


def _clean_top_at(run: A.Run, tmp_path: Path, top_ms: float) -> A.Run:
    """A variant whose MXNet clean pass's CPU time is scaled so that the top of its 95% interval is ``top_ms`` (its
    two trials alike: no spread between processes to widen by)."""
    c0 = next(r for r in run.results if r["framework"] == "mxnet")["cpu_time"]
    f = top_ms / (c0["ci95_high_s"] * 1e3)

    def scale(d: Path):
        for p in (d / "mxnet" / "bs64").glob("clean-*.json"):
            _edit_json(p, lambda doc: doc.update(cpu_step_times_s=[x * f for x in doc["cpu_step_times_s"]]))

        def entry(doc):
            for r in doc:
                if r["framework"] == "mxnet":
                    c = r["cpu_time"]
                    for k in ("median_step_s", "ci95_low_s", "ci95_high_s"):
                        c[k] *= f
                    c["trial_medians_s"] = [c["median_step_s"]] * 2

        _edit_json(d / "results.json", entry)

    return _variant(run, tmp_path, scale)


def test_ops_above_their_clean_step_within_both_intervals_are_noise_and_keep_their_ratios(run, tmp_path):
    """basis.OPS_WITHIN_CLEAN judges the bottom of the ops' own interval (their mean over the traced steps,
    opcpu.OpCpu.ops_ms_ci) against the clean step's top: a clean step whose top lies between the two (the ops' mean
    above it, inside their interval) keeps the ratios; one below the ops' interval withholds them, naming it."""
    oc = OC.op_cpu_of([run])[(run.name, "mxnet", 64)]
    mean, (lo, hi) = oc.ops_ms_per_step, oc.ops_ms_ci
    per = oc.events.groupby("iteration")[oc.total_column].sum() / 1e6
    assert mean == pytest.approx(per.reindex(list(oc.iterations), fill_value=0.0).mean())  # the figure's own mean
    assert lo < mean < hi
    inside = _cpu_table(_clean_top_at(run, tmp_path / "inside", (lo + mean) / 2))[0]
    inside = inside[inside["layer"] != ANS.WHOLE_STEP]
    assert inside["mxnet.vs_ref"].notna().all()
    below = _cpu_table(_clean_top_at(run, tmp_path / "below", lo * 0.98))[0]
    below = below[below["layer"] != ANS.WHOLE_STEP]
    assert below["mxnet.vs_ref"].isna().all()
    assert below["mxnet.no_ratio"].str.contains(f"{mean:.4g} ms [{lo:.4g}–{hi:.4g}]", regex=False).all()
    assert below["mxnet.no_ratio"].str.contains("beyond both intervals").all()
