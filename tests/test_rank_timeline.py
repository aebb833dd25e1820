"""The merged timeline of every rank (issue 39: ``reports/analyses/ranks.py``, ``reports/rankfigure.py``) on the
real CPU runs at N = 2 of all three frameworks: tests/data/cpu_devices_run (--profile framework --steps 3) and
tests/data/cpu_comm_run (--profile comm --steps 4). The figure's rows are counted per case, lane group, lane and
step against an independent reader of records.parquet (pyarrow, plain Python loops); its steps must be the
communication figures' steps to the ns, and a rank drawn shifted by 1 ms fails the report's self-check."""

from __future__ import annotations

import re
import shutil
from collections import Counter, defaultdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from kernelmap.reports import commchecks
from kernelmap.reports import rankfigure as RF
from kernelmap.reports.analyses import comm, ranks
from kernelmap.reports.checkrows import FAIL, PASS, Check

from kernelmap import schema
from kernelmap.normalise import normalise_run_dir

DATA = Path(__file__).parent / "data"
FIXTURES = ("cpu_devices_run", "cpu_comm_run")
COLLECTIVE = "collective"  # the schema's canonical op of communication (no collective kernels on the CPU)
SHIFT_NS = 1_000_000


@pytest.fixture(scope="module", params=FIXTURES)
def run(request, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp(request.param) / "run"
    shutil.copytree(DATA / request.param, path)
    normalise_run_dir(path)
    return path


def _rows(run: Path) -> list[dict]:
    cols = ["run", "source", "source_file", "kind", "canonical_op", "rank", "pid", "iteration", "start_ns", "dur_ns",
            "devices"]
    return pq.read_table(run / "records.parquet", columns=cols).to_pylist()


def _expected(run: Path) -> dict[tuple, int]:
    """{(case, group, lane, iteration): rows} read without kernelmap: per multi-device case the last two steps
    with a step region; a rank's group where the communication names ranks, else a trace process's; on the
    CPU compute is the framework ops that are not communication."""
    by_case = defaultdict(list)
    for r in _rows(run):
        if (r["devices"] or 1) > 1 and r["start_ns"] is not None and r["dur_ns"] is not None:
            by_case[r["run"]].append(r)
    out: Counter = Counter()
    for case, rows in by_case.items():
        assert len({r["source"] for r in rows}) == 1  # one capture source per case in these runs
        shown = sorted({r["iteration"] for r in rows if r["kind"] == "step" and r["iteration"] is not None})[-2:]
        ranked = any(r["rank"] is not None for r in rows if r["canonical_op"] == COLLECTIVE)
        groups = {r["rank"] if ranked else r["pid"] for r in rows
                  if r["iteration"] in shown and (r["canonical_op"] == COLLECTIVE or r["kind"] == "op")} - {None}
        word = "rank" if ranked else "process"
        for r in rows:
            if r["iteration"] not in shown:
                continue
            own = r["rank"] if ranked else r["pid"]
            if r["kind"] == "step":
                for g in groups:
                    if r["rank"] is None or r["rank"] == g:
                        out[(case, f"{word} {g}", "step", r["iteration"])] += 1
            elif r["canonical_op"] == COLLECTIVE and own is not None:
                out[(case, f"{word} {own}", "communication", r["iteration"])] += 1
            elif r["kind"] == "op" and own is not None:
                out[(case, f"{word} {own}", "compute", r["iteration"])] += 1
    return dict(out)


def test_every_rank_and_lane_holds_the_records_rows(run):
    tl = ranks.rank_timeline(schema.read_parquet(run / "records.parquet"))
    got = Counter(zip(tl.events["run"], tl.events["group"], tl.events["lane"], tl.events["iteration"].astype(int),
                      strict=True))
    want = _expected(run)
    assert dict(got) == want
    assert set(tl.cases["run"]) == {"pytorch-x2/bs32", "mxnet-x2/bs32", "jax-x2/bs32"}
    assert (tl.cases["groups"] == 2).all()  # two ranks (PyTorch, JAX), two device processes (MXNet)
    # the raw traces' counts: DDP's 2 buckets a step (c10d::allreduce_ + gloo's span) and JAX's one all-reduce
    # per step and device are in each rank's communication lane
    ev = tl.events
    for case, per_step in (("pytorch-x2/bs32", 2), ("jax-x2/bs32", 1)):
        for (g, it), n in Counter(zip(*[ev.loc[(ev["run"] == case) & (ev["lane"] == "communication")
                                                & (ev["kind"] == "op") & ~ev["op_name"].str.startswith("gloo"), c]
                                        for c in ("group", "iteration")], strict=True)).items():
            assert n == per_step, (case, g, it)


def test_the_drawn_steps_are_the_communication_figures_steps_and_a_shifted_rank_fails(run):
    records = schema.read_parquet(run / "records.parquet")
    tl, steps = ranks.rank_timeline(records), comm.per_step(records)
    assert ranks.step_mismatches(tl, steps).empty
    got = commchecks.timeline_checks("run", tl, steps)
    assert len(got) == 3 and {r["status"] for r in got} == {PASS} and {r["check"] for r in got} == {Check.RANK_TIMELINE}
    # a figure that draws rank 1 of each ranked case 1 ms late: every step of rank 1 fails, nothing else
    ev = tl.events.copy()
    late = (ev["rank"] == 1).fillna(False)
    ev.loc[late, "start_ns"] += SHIFT_NS
    shifted = ranks.RankTimeline(tl.cases, ev, ranks.step_spans(ev), tl.marks)
    bad = ranks.step_mismatches(shifted, steps)
    shown = {c: [int(i) for i in its.split(";")] for c, its in zip(tl.cases["run"], tl.cases["iterations"], strict=True)}
    assert sorted(zip(bad["run"], bad["rank"], bad["iteration"], strict=True)) == sorted(
        (c, 1, it) for c in ("jax-x2/bs32", "pytorch-x2/bs32") for it in shown[c])
    assert (bad["figure_start_ns"] - bad["comm_start_ns"] == SHIFT_NS).all()
    rows = {r["subject"]: r for r in commchecks.timeline_checks("run", shifted, steps)}
    assert rows["pytorch-x2/bs32"]["status"] == FAIL and rows["jax-x2/bs32"]["status"] == FAIL
    assert rows["mxnet-x2/bs32"]["status"] == PASS and "drawn at another interval" in rows["jax-x2/bs32"]["detail"]
    # the process that drives every device (MXNet): its groups' union is the step; a group drawn past it fails
    ev = tl.events.copy()
    one = (ev["run"] == "mxnet-x2/bs32") & (ev["group"] == "process 1") & (ev["lane"] == "compute")
    ev.loc[one.to_numpy() & (ev["iteration"] == ev.loc[one, "iteration"].max()).to_numpy(), "dur_ns"] += 10**9
    rows = {r["subject"]: r for r in commchecks.timeline_checks("run", ranks.RankTimeline(
        tl.cases, ev, ranks.step_spans(ev), tl.marks), steps)}
    assert rows["mxnet-x2/bs32"]["status"] == FAIL


def test_the_last_arrival_is_marked_where_the_raw_records_put_it(run):
    """For every collective of the shown steps: the rank whose k-th issuing op (start order) started last, at
    that op's start, from the records read with pyarrow."""
    tl = ranks.rank_timeline(schema.read_parquet(run / "records.parquet"))
    starts = defaultdict(list)  # (case, iteration, rank) -> issuing ops' (start, name)
    for r in _rows(run):
        if r["canonical_op"] == COLLECTIVE and r["kind"] == "op" and r["rank"] is not None:
            starts[(r["run"], r["iteration"], r["rank"])].append(r["start_ns"])
    want = set()
    for case, its in tl.cases.set_index("run")["iterations"].items():
        for it in (int(i) for i in its.split(";")):
            per_rank = {k[2]: sorted(v) for k, v in starts.items() if k[:2] == (case, it)}
            if not per_rank:
                continue
            assert len(set(map(len, per_rank.values()))) == 1
            for k in range(len(next(iter(per_rank.values())))):
                last = max(per_rank, key=lambda rk: per_rank[rk][k])  # noqa: B023
                want.add((case, it, k, last, per_rank[last][k]))
    got = {(m.run, m.iteration, m.collective, m.last_rank, m.at_ns) for m in tl.marks.itertuples()}
    assert got == want and len(got) == 6  # PyTorch: 2 buckets x 2 steps, JAX: 1 x 2 steps; MXNet names no rank


def test_one_figure_per_case_and_on_the_page(run, tmp_path):
    from kernelmap.reports.cli import build

    out, checks = build([str(run)], tmp_path / "report")
    page = (out / "report.html").read_text()
    for case in ("pytorch-x2/bs32", "mxnet-x2/bs32", "jax-x2/bs32"):
        stem = RF.case_slug(case)
        assert (out / f"{stem}.png").stat().st_size > 10_000
        fig = re.search(rf'<figure id="fig-{stem}">(.*?)</figure>', page, re.S)
        assert fig is not None and f'href="#fig-{stem}"' in page  # linked from the devices section
        caption = fig.group(1)
        assert "framework pass" in caption and "steps" in caption and "Clock:" in caption
        assert "BUSY" in caption  # every pass of these runs ran on a busy machine
    mine = checks[checks["check"] == Check.RANK_TIMELINE]
    assert len(mine) == 3 and set(mine["status"]) == {PASS}
