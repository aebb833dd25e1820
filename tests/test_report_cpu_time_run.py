"""The comparison on CPU time on a real three-framework CPU run made on a busy machine
(tests/data/cpu_run_cputime, every pass contended): the wall-time answer withholds its ratios, the CPU-time
table has the whole step's (its layers' only where their pass ran quiet), and its figures are the workers' own
samples."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest
from kernelmap.reports import analysis as A
from kernelmap.reports import answer as ANS
from kernelmap.reports.analyses import basis as B

from kernelmap import timing
from kernelmap.normalise import normalise_run_dir

DATA = Path(__file__).parent / "data" / "cpu_run_cputime"
FWS = ("pytorch", "mxnet", "jax")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> A.Run:
    d = tmp_path_factory.mktemp("cpu") / "cpu_run_cputime"
    shutil.copytree(DATA, d)
    normalise_run_dir(d)
    return A.load_run(d)


@pytest.fixture(scope="module")
def tables(run):
    layers = A.layer_table([run])
    cpu, fws = ANS.cpu_table(layers, B.cpu_states([run]), B.traced_op_ms([run]))
    return layers, cpu, fws


def _samples(fw: str, name: str) -> list[float]:
    return json.loads((DATA / fw / "bs64" / name).read_text())[timing.CPU_SAMPLES]


def test_whole_step_cpu_time_is_the_median_of_the_used_trials_samples(tables):
    _, cpu, _ = tables
    step = cpu[cpu["layer"] == ANS.WHOLE_STEP].iloc[0]
    results = {r["framework"]: r for r in json.loads((DATA / "results.json").read_text())}
    want = {}
    for fw in FWS:
        used = [t["trial"] for t in results[fw]["trials"] if t["used"]]
        pooled = [x for t in used for x in _samples(fw, f"clean-{t}.json")]
        want[fw] = statistics.median(pooled) * 1e3
        assert step[f"{fw}.cpu_ms"] == pytest.approx(want[fw], rel=1e-12)
        lo, hi = step[f"{fw}.ci_ms"]
        assert lo <= want[fw] <= hi
        assert step[f"{fw}.busy"].startswith("other processes used")  # marked, not withheld
    for fw in ("mxnet", "jax"):
        assert step[f"{fw}.vs_ref"] == pytest.approx(want[fw] / want["pytorch"], rel=1e-12)


def test_a_busy_pass_gives_its_layers_no_cpu_ratio(tables, run, tmp_path):
    """Every framework pass of this run ran busy: a layer's CPU time (its share of the pass's traced wall time, which a
    neighbour stretches unevenly: basis.UNEVEN_STRETCH) gets no ratio, each row saying why; the whole step has its
    ratios. The same run with the framework passes marked quiet: a ratio for every layer and direction."""
    layers, cpu, fws = tables
    assert fws == list(FWS)
    per_layer = cpu[cpu["layer"] != ANS.WHOLE_STEP]
    # one forward and one backward row per layer: JAX's per-gradient rows summed with the others' bwd
    assert sorted(map(tuple, per_layer[["layer", "direction"]].to_numpy())) == sorted(
        (layer, d) for layer in ("conv1", "conv2", "fc1", "fc2") for d in ("fwd", ANS.BWD_ALL))
    assert per_layer[["mxnet.vs_ref", "jax.vs_ref"]].isna().all().all()
    assert all(B.UNEVEN_STRETCH in w for w in per_layer["mxnet.no_ratio"])
    assert cpu.loc[cpu["layer"] == ANS.WHOLE_STEP, ["mxnet.vs_ref", "jax.vs_ref"]].notna().all().all()
    # the wall-time answer of the same run withholds every ratio: its passes ran on a busy machine
    wall, _ = ANS.answer_table(layers, B.pass_states([run]))
    assert wall[["mxnet.vs_ref", "jax.vs_ref"]].isna().all().all()
    assert wall["mxnet.no_ratio"].dropna().str.contains("ran on a busy machine").all()
    d = tmp_path / "quiet"
    shutil.copytree(run.path, d)
    res = json.loads((d / "results.json").read_text())
    for r in res:
        r["passes"]["framework"]["contention"] = {"contended": False, "text": "quiet"}
    (d / "results.json").write_text(json.dumps(res))
    q = A.load_run(d)
    quiet, _ = ANS.cpu_table(A.layer_table([q]), B.cpu_states([q]), B.traced_op_ms([q]))
    assert quiet[["mxnet.vs_ref", "jax.vs_ref"]].notna().all().all(), quiet.filter(like="no_ratio")


def test_a_layers_cpu_time_is_its_share_of_the_traced_op_time(tables, run):
    layers, cpu, _ = tables
    totals = B.traced_op_ms([run])
    merged = ANS.merge_backward(layers).set_index(["framework", "layer", "direction"])
    rows = cpu.set_index(["layer", "direction"])
    results = {r["framework"]: r for r in json.loads((DATA / "results.json").read_text())}
    for fw in FWS:
        pass_cpu = statistics.median(_samples(fw, "framework.json")) * 1e3
        assert results[fw]["passes"]["framework"]["cpu_time"]["median_step_s"] * 1e3 == pytest.approx(pass_cpu)
        share = [merged.loc[(fw, layer, d), "op_ms_per_step"] / totals[(run.name, fw, 64)] for layer, d in rows.index
                 if layer != ANS.WHOLE_STEP]
        got = [rows.loc[k, f"{fw}.cpu_ms"] for k in rows.index if k[0] != ANS.WHOLE_STEP]
        assert got == pytest.approx([s * pass_cpu for s in share], rel=1e-9)
        assert 0 < sum(share) <= 1  # the layers are part of the traced op time


def test_jax_backward_is_summed_from_its_gradient_rows(tables):
    layers, _, _ = tables
    merged = ANS.merge_backward(layers)
    jax = merged[merged["framework"] == "jax"].set_index(["layer", "direction"])
    for layer in ("conv1", "conv2", "fc1", "fc2"):
        parts = jax.loc[[k for k in jax.index if k[0] == layer and k[1] in ANS.BACKWARD], "op_ms_per_step"]
        assert len(parts) >= 1 and jax.loc[(layer, ANS.BWD_ALL), "op_ms_per_step"] == pytest.approx(parts.sum())
    # the others' single bwd row carried over unchanged
    pt = merged[merged["framework"] == "pytorch"].set_index(["layer", "direction"])
    assert pt.loc[("conv2", ANS.BWD_ALL), "op_ms_per_step"] == pt.loc[("conv2", "bwd"), "op_ms_per_step"]


def test_coverage_names_kernelmaps_own_files_as_its_own(run):
    """The workers' pass results and XLA's HLO text are not 'unrecognised content' (there were 42 such rows)."""
    from kernelmap import normalise

    got = json.loads((run.path / "attribution.json").read_text())["not_records"]
    assert sorted({r["reason"] for r in got}) == sorted({normalise.OWN_RESULT, normalise.HLO_COMPANION})
    assert sum(r["reason"] == normalise.OWN_RESULT for r in got) == len(list(DATA.glob("*/bs64/*.json")))
