"""The workers' own CPU time beside wall time (timing.CPU_METHOD): what it counts and what it does not."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from test_worker import FakeWorkload, _run

from kernelmap import timing

STEP_S = 0.004


class _Workload(FakeWorkload):
    """test_worker's stand-in, with the loss conversion the worker asks every workload for."""

    def to_float(self, value) -> float:
        return float(value)


def _spin():
    """STEP_S of this thread's own CPU time (not of the wall clock: on a busy runner a wall-clock spin is
    descheduled for part of it, and its CPU time falls short of what the test holds it to)."""
    end = time.thread_time() + STEP_S
    while time.thread_time() < end:
        pass


def test_a_step_that_waits_costs_wall_time_not_cpu_time(tmp_path):
    """A step that sleeps (what waiting for a core looks like from inside) adds wall time, not CPU time; a
    step that computes adds both: the CPU clock is the one a neighbour moves less (not nothing: timing.CPU_MOVED)."""
    waits = _run(_Workload(n_train=10_000, on_step=lambda: time.sleep(STEP_S)), tmp_path, steps=20)
    works = _run(_Workload(n_train=10_000, on_step=_spin), tmp_path, steps=20)
    for r in (waits, works):
        assert len(r[timing.CPU_SAMPLES]) == len(r["step_times_s"]) == len(r[timing.MAIN_THREAD_SAMPLES]) == 2
        assert r["cpu_timing"] == timing.CPU_METHOD
    assert min(waits["step_times_s"]) >= STEP_S
    assert max(waits[timing.CPU_SAMPLES]) < STEP_S / 4
    assert min(works[timing.CPU_SAMPLES]) > STEP_S * 0.8
    assert min(works[timing.MAIN_THREAD_SAMPLES]) > STEP_S * 0.8


def test_cpu_figure_pools_trials_like_the_wall_figure():
    trials = [{timing.CPU_SAMPLES: [0.010, 0.011, 0.012], timing.MAIN_THREAD_SAMPLES: [0.009, 0.010, 0.011],
               "threads": {"env": {"OMP_WAIT_POLICY": "PASSIVE"}}},
              {timing.CPU_SAMPLES: [0.013, 0.014], timing.MAIN_THREAD_SAMPLES: [0.012, 0.013]}]
    f = timing.cpu_figure(trials)
    same = timing.step_stats([[0.010, 0.011, 0.012], [0.013, 0.014]]).to_dict()
    assert {k: f[k] for k in same} == same
    assert f["median_step_s"] == pytest.approx(0.012)
    assert f["main_thread_median_step_s"] == pytest.approx(0.011)
    assert f["clock"] == timing.CPU_CLOCK and f["wait_policy"] == "PASSIVE"
    # a trial without CPU time (a worker older than it): no figure rather than one from some trials
    assert timing.cpu_figure([*trials, {"step_times_s": [0.01]}]) is None
    assert timing.cpu_figure([]) is None


# --- the report's comparison on CPU time (reports/answer.cpu_table, analyses/basis) -----------------------
def _fig(samples: list[list[float]]) -> dict:
    return timing.cpu_figure([{timing.CPU_SAMPLES: s} for s in samples])


def _entry(fw: str, cpu: float, wall: float, framework_cpu: float, busy: bool, device: str = "cpu") -> dict:
    """A results.json entry: clean trials of CPU time ``cpu`` (s/step) and wall time ``wall``, a framework
    pass of CPU time ``framework_cpu`` and wall time 2 x ``wall``; ``busy``: every pass flagged contended."""
    from kernelmap.timing import step_stats

    cont = {"contended": busy, "text": "other processes used up to 1.9 of 2 cores" if busy else "quiet"}
    jitter = [[x * (1 + d) for d in (-0.01, 0, 0.01, 0.005)] for x in (cpu, cpu * 1.002, cpu * 0.998)]
    walls = [[x * (1 + d) for d in (-0.01, 0, 0.01, 0.005)] for x in (wall, wall * 1.002, wall * 0.998)]
    fw_samples = [framework_cpu * (1 + d) for d in (-0.01, 0, 0.01, 0.005, -0.005)]
    return {"framework": fw, "case": fw, "batch_size": 64, "device": device, **step_stats(walls).to_dict(),
            "contention": cont, "cpu_time": _fig(jitter),
            "passes": {"clean": {"median_step_s": wall, "contention": cont},
                       "framework": {"median_step_s": 2 * wall, "steps": 20, "contention": cont,
                                     "cpu_time": _fig([fw_samples])}}}


def _layers(ms: dict[tuple[str, str, str], float]) -> pd.DataFrame:
    return pd.DataFrame([{"run": "r", "batch_size": 64, "layer": layer, "canonical_op": "conv2d", "direction": d,
                          "framework": fw, "level": "op", "libraries": [], "library_calls": [], "algos": [],
                          "kernels": [], "ms_per_step": float("nan"), "time_source": "t", "op_ms_per_step": v,
                          "pass": None, "op_pass": "framework"} for (fw, layer, d), v in ms.items()])


def _states(entries):
    from kernelmap.reports.analyses import basis as B

    run = SimpleNamespace(name="r", results=entries, manifest={"host": {"cpu_count": 2}}, path=Path("no-run-dir"))
    return B.cpu_states([run]), run


@pytest.mark.parametrize("busy", [True, False])
def test_cpu_ratios_are_drawn_on_a_busy_machine_and_marked(busy):
    """Every pass contended: the wall-time answer withholds its ratios, the CPU table draws the whole step's (each
    cell marked BUSY) and no layer's (a busy pass's traced wall time is shared out unevenly: basis.UNEVEN_STRETCH);
    quiet, every ratio. A layer's CPU time is its op time x its pass's CPU / wall time; every framework's
    backward meets on one row (JAX's split rows summed)."""
    from kernelmap.reports import answer as ANS
    from kernelmap.reports.analyses.basis import UNEVEN_STRETCH

    states, _ = _states([_entry("pytorch", 0.040, 0.100, 0.0401, busy),
                         _entry("mxnet", 0.020, 0.080, 0.0201, busy), _entry("jax", 0.030, 0.090, 0.0301, busy)])
    layers = _layers({("pytorch", "conv1", "fwd"): 20.0, ("mxnet", "conv1", "fwd"): 16.0,
                      ("jax", "conv1", "fwd"): 9.0, ("pytorch", "conv1", "bwd"): 40.0, ("mxnet", "conv1", "bwd"): 32.0,
                      ("jax", "conv1", "bwd_weight"): 12.0, ("jax", "conv1", "bwd_data"): 6.0})
    totals = {("r", "pytorch", 64): 80.0, ("r", "mxnet", 64): 64.0, ("r", "jax", 64): 36.0}
    cpu, fws = ANS.cpu_table(layers, states, totals)
    rows = cpu.set_index(["layer", "direction"])
    assert list(rows.index) == [(ANS.WHOLE_STEP, ANS.ALL_DIRECTIONS), ("conv1", "fwd"), ("conv1", ANS.BWD_ALL)]
    step = rows.loc[(ANS.WHOLE_STEP, ANS.ALL_DIRECTIONS)]
    assert step["pytorch.cpu_ms"] == pytest.approx(40.0, rel=0.01)
    assert step["mxnet.vs_ref"] == pytest.approx(0.5, rel=0.02)
    assert (step["mxnet.busy"] or "").startswith("other processes") is busy
    # conv1 fwd: 20 of PyTorch's 80 ms of traced op time per step, of its framework pass's 40.1 ms CPU time
    assert rows.loc[("conv1", "fwd"), "pytorch.cpu_ms"] == pytest.approx(20.0 / 80.0 * 40.1, rel=0.01)
    assert rows.loc[("conv1", ANS.BWD_ALL), "jax.cpu_ms"] == pytest.approx(18.0 / 36.0 * 30.1, rel=0.01)
    ratios = cpu.set_index(["layer", "direction"])[[f"{fw}.vs_ref" for fw in fws if fw != "pytorch"]]
    assert ratios.loc[[(ANS.WHOLE_STEP, ANS.ALL_DIRECTIONS)]].notna().all().all()
    layer_rows = ratios.drop(index=[(ANS.WHOLE_STEP, ANS.ALL_DIRECTIONS)])
    assert (layer_rows.isna() if busy else layer_rows.notna()).all().all()
    assert all((UNEVEN_STRETCH in w) is busy for w in rows["jax.no_ratio"].iloc[1:].fillna(""))
    # the wall-time answer on the same passes without their states: no ratio at all
    wall = ANS.answer_table(layers, {})[0]
    assert wall[["mxnet.vs_ref", "jax.vs_ref"]].isna().all().all()


def test_a_pass_whose_profiler_added_cpu_time_is_not_compared():
    """MXNet's framework pass took 2x its clean pass's CPU time beyond noise: its layers' CPU times say why
    they have no ratio; the whole-step row (the clean pass) still has one."""
    from kernelmap.reports import answer as ANS

    states, _ = _states([_entry("pytorch", 0.040, 0.100, 0.0401, False), _entry("mxnet", 0.020, 0.080, 0.040, False)])
    layers = _layers({("pytorch", "conv1", "fwd"): 20.0, ("mxnet", "conv1", "fwd"): 16.0})
    totals = {("r", "pytorch", 64): 40.0, ("r", "mxnet", 64): 40.0}
    rows = ANS.cpu_table(layers, states, totals)[0].set_index("layer")
    assert pd.notna(rows.loc[ANS.WHOLE_STEP, "mxnet.vs_ref"])
    assert pd.isna(rows.loc["conv1", "mxnet.vs_ref"])
    assert rows.loc["conv1", "mxnet.no_ratio"] == ("no ratio: MXNet's framework pass took 2x its clean pass's CPU "
                                                   "time (its profiler's own work)")


def test_cpu_time_against_wall_time_on_a_quiet_machine():
    """basis.CPU_WALL_RULE: quiet, CPU time at the wall time (one thread working) agrees; quiet, CPU time a
    third of the wall time (the step waited on something else) fails; busy: not checked."""
    from kernelmap.reports.analyses import basis as B

    _, run = _states([_entry("pytorch", 0.100, 0.100, 0.1, False), _entry("mxnet", 0.030, 0.090, 0.03, False),
                      _entry("jax", 0.030, 0.090, 0.03, True), _entry("pytorch", 0.5, 0.100, 0.5, False)])
    got = B.cpu_wall_agreement([run])
    assert list(got["agrees"]) == [True, False, None, False]
    assert got.loc[1, "why"].startswith("CPU time below the wall time beyond noise")
    assert got.loc[2, "why"].startswith("its clean pass did not run on a quiet machine")
    assert got.loc[3, "why"] == "CPU time above the wall time x 2 cores: not one process's CPU time"
    gpu = B.cpu_wall_agreement([_states([_entry("pytorch", 0.01, 0.1, 0.01, False, device="gpu")])[1]])
    assert gpu.loc[0, "agrees"] is None and gpu.loc[0, "why"].startswith("a GPU run")


def test_a_cpu_ratio_inside_the_noise_is_called_noise():
    """answer.NOISE_RULE: MXNet's whole step at PyTorch's CPU time (their 95% intervals overlap) is called noise;
    JAX's at half of it is a difference beyond noise. On the page a ratio within noise is not marked as a gap
    however far from 1 it reads, and the table's title counts it."""
    from kernelmap.reports import answer as ANS
    from kernelmap.reports import html as H

    states, _ = _states([_entry("pytorch", 0.040, 0.100, 0.0401, False),
                         _entry("mxnet", 0.0401, 0.100, 0.0402, False), _entry("jax", 0.020, 0.090, 0.0201, False)])
    cpu, fws = ANS.cpu_table(_layers({}), states, {})
    step = cpu.set_index("layer").loc[ANS.WHOLE_STEP]
    assert step["mxnet.vs_ref_noise"] == str(timing.Placement.WITHIN)
    assert step["jax.vs_ref_noise"] == str(timing.Placement.BELOW)
    # a row with no interval on one side: no verdict either way
    row = {**step.to_dict(), "pytorch.ci_ms": None}
    assert ANS.ratio_noise(row, "jax", "pytorch") is None
    # 1.6x, a gap by its size, inside the noise of two wide intervals: grey and called noise, not red
    wide = cpu.copy()
    wide.loc[wide.index[0], ["mxnet.cpu_ms", "mxnet.vs_ref"]] = [64.0, 1.6]
    wide.at[wide.index[0], "mxnet.ci_ms"] = (30.0, 90.0)
    wide.at[wide.index[0], "mxnet.vs_ref_noise"] = ANS.ratio_noise(wide.iloc[0].to_dict(), "mxnet", "pytorch")
    assert wide.iloc[0]["mxnet.vs_ref_noise"] == str(timing.Placement.WITHIN)
    (t,) = H.cpu_tables(wide, fws, "pytorch", str.upper, ANS.GAP, str(timing.Placement.WITHIN), ANS.NOISE_RULE)
    assert t["ratios"] == 2 and t["noise"] == 1
    assert f'1.6× <span class="meta">{H.NOISE_SAID}</span>' in t["html"] and 'differs">1.6×' not in t["html"]
    assert 'differs">0.5' in t["html"]  # JAX: beyond noise and a gap
    # without the verdict's value (an older caller), the same table marks the 1.6x as a gap
    (old,) = H.cpu_tables(wide, fws, "pytorch", str.upper, ANS.GAP)
    assert 'differs">1.6×' in old["html"] and old["noise"] == 0
