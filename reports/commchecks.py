"""The self-checks of multi-device cases' communication (issue 39; figures: ``analyses/comm.py``), one row per
case and check:

- ``communication attributed to its op``: every bit of communication time is an op of the framework's own
  (``c10d::allreduce_``, XLA's ``all-reduce``, MXNet's ``KVStoreReduce`` and its KVStore's copies) or linked to
  the op that issued it (gloo's work spans, NCCL's kernels): the lowest share over the case's steps and ranks
  must be 100%. Not checked where no traced step recorded any communication (a clean-only run).
- ``communication within its step``: for every traced step and rank, 0 <= exposed <= communication <= step.
- ``scaling efficiency against one device`` (``analyses/scaling.py``): each multi-device case did the same work
  as its one-device case, and on the GPU is not more than N times faster beyond the 95% intervals.
- ``exposed communication against the step without reduction`` (issue 39's independent measure): per case run
  with ``--profile comm``, the traces' exposed communication (median over the traced steps) within
  ``comm.AGREEMENT`` (5%) of the clean pass's median step less the same step without the gradients' reduction
  (``comm.independent``), for every rank and trace source; FAIL where a row is beyond both 5% and the difference's
  95% interval (each side's interval of its median); not checked where the case has no such pass, or where a row
  is beyond 5% but inside that interval (the measure's own noise is wider than 5%: more timed steps narrow it).
- ``every rank traced``: a case of a framework that runs a process per device (``DataParallel.processes``: each rank
  writes its own trace, rank r > 0 in ``rank<r>/``) whose framework pass ran has traced steps of every rank 0..N-1
  in the records; else its figures are those of the ranks present only, not the case's: FAIL, naming each absent
  rank's folder or what it holds (a copy that left ``rank<r>/`` out, a trace not written, no records.parquet).
- ``merged timeline's steps as the communication figures'`` (``analyses/ranks.py``): every step the merged timeline
  of the ranks draws spans exactly (to the ns) the interval ``comm.per_step`` measured for that rank and step (a rank
  drawn shifted, or a step drawn that the figures lack: FAIL).
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from kernelmap.frameworks.dataparallel import NO_REDUCTION, rank_dir

from kernelmap import frameworks
from kernelmap.worker import FRAMEWORK_PASS

from .analyses import commfigures as CF
from .analyses import scaling as SC
from .analyses.base import BUSY, Run, field_at, passes_of
from .analyses.comm import AGREEMENT, CRITICAL_RANK, DISAGREE, INDEPENDENT_COLUMNS, NOISE
from .analyses.ranks import step_mismatches
from .checkrows import FAIL, NOT_CHECKED, PASS, Check, check_row

TOLERANCE_MS = 1e-9  # the figures are sums of whole nanoseconds: equal within rounding


def step_checks(run_name: str, steps) -> list[dict[str, Any]]:
    """The two checks per case of ``steps`` (``comm.per_step`` of one run's records)."""
    rows: list[dict[str, Any]] = []
    for (case, fw, bs, src), g in steps.groupby(["run", "framework", "batch_size", "source"], sort=True):
        share = g["linked_share"].dropna()
        if share.empty:
            rows.append(check_row(run_name, fw, bs, Check.COMM_LINKED, case, 1.0, None, NOT_CHECKED,
                                  "no traced step recorded communication"))
        else:
            worst = float(share.min())
            rows.append(check_row(run_name, fw, bs, Check.COMM_LINKED, case, 1.0, worst, PASS if worst >= 1.0 else FAIL,
                                  f"{src}: lowest share over {len(share)} steps x ranks: {worst:.1%} of the communication "
                                  "time is an op of its own or linked to the op that issued it"))
        bad = g[(g["exposed_ms"] < -TOLERANCE_MS) | (g["exposed_ms"] > g["communication_ms"] + TOLERANCE_MS)
                | (g["communication_ms"] > g["step_ms"] + TOLERANCE_MS)]
        detail = (f"{src}: {len(g)} steps x ranks within" if bad.empty else
                  "; ".join(f"step {r.iteration} rank {r.rank}: exposed {r.exposed_ms:.3f}, communication "
                            f"{r.communication_ms:.3f}, step {r.step_ms:.3f} ms" for r in bad.head(3).itertuples()))
        rows.append(check_row(run_name, fw, bs, Check.COMM_BOUNDS, case, "0 <= exposed <= communication <= step",
                              f"{len(bad)} outside", PASS if bad.empty else FAIL, detail))
    return rows


def _untraced(nr: dict, have_records: bool) -> str:
    """Why a case with a step without reduction has no row of the independent measure, with what that side measured."""
    why = ("no traced step recorded communication (the framework pass)" if have_records
           else "no records.parquet: no traced step to read (run `kernelmap normalise`)")
    said = "; ".join(f"rank {x.get('rank')}: {x['clean_median_step_s'] * 1e3:.4g} − {x['median_step_s'] * 1e3:.4g} = "
                     f"{(x['clean_median_step_s'] - x['median_step_s']) * 1e3:.4g} ms"
                     for x in nr.get("ranks") or [] if x.get("clean_median_step_s") and x.get("median_step_s"))
    return why + (f"; the step without reduction alone (clean − without, medians): {said}" if said else "")


def independent_checks(run_name: str, table, results: list[dict], have_records: bool = True) -> list[dict[str, Any]]:
    """The independent measure's check per multi-device case of ``results`` (``comm.independent``'s ``table``):
    every row within ``AGREEMENT``; not checked where the case ran no step without reduction (or it was skipped)
    or no traced step recorded communication (``have_records``: False where the run has no records.parquet), the
    figures of the step without reduction said."""
    rows: list[dict[str, Any]] = []
    for r in results:
        if (r.get("devices") or 1) < 2:
            continue
        case, fw, bs = r.get("dir"), r.get("framework"), r.get("batch_size")
        nr = r.get(NO_REDUCTION) or {}
        g = table[table["case"] == case] if len(table) else table
        if not nr.get("ranks") or g.empty:
            why = (nr.get("skipped") or f"no {NO_REDUCTION} pass (kernelmap run --profile comm)" if not nr.get("ranks")
                   else _untraced(nr, have_records))
            rows.append(check_row(run_name, fw, bs, Check.COMM_INDEPENDENT, case, f"within {AGREEMENT:.0%}", None,
                                  NOT_CHECKED, why))
            continue
        bad = g[g["verdict"] == DISAGREE]
        noisy = g[g["verdict"] == NOISE]
        shown = bad if len(bad) else noisy if len(noisy) else g
        detail = "; ".join(
            f"{x.source}, {x.rank}: exposed {x.exposed_ms:.4g} ms (median of {x.traced_steps} traced steps) against "
            f"{x.clean_ms:.4g} − {x.no_reduction_ms:.4g} = {x.difference_ms:.4g} ms"
            + ("" if x.devices < 2 or x.rank == CRITICAL_RANK else
               f" (clean: rank {x.clean_rank}'s, without: rank {x.no_reduction_rank}'s, the slowest of each)")
            + (" (not faster without the reduction)" if pd.isna(x.rel_error) else f" ({x.rel_error:+.1%})")
            + ("" if pd.isna(x.difference_low_ms) else
               f", 95% interval of the difference [{x.difference_low_ms:.4g}, {x.difference_high_ms:.4g}] ms")
            + f": {x.verdict}"
            for x in shown.head(4).itertuples())
        busy = [f"{what}: {BUSY}, {c.get('text')}" for what, c in (("clean pass", r.get("contention") or {}),
                                                                   (NO_REDUCTION, nr.get("contention") or {}))
                if c.get("contended")]
        worst = g["rel_error"].abs().max()
        # inside the measure's own noise but not within 5%: neither agreement nor a contradiction can be shown
        status = FAIL if len(bad) else NOT_CHECKED if len(noisy) else PASS
        rows.append(check_row(run_name, fw, bs, Check.COMM_INDEPENDENT, case, f"within {AGREEMENT:.0%}",
                              None if pd.isna(worst) else float(worst), status,
                              "the clean pass's median step less the step without reduction's (timed as the clean "
                              f"pass is); {detail}" + (f"; {'; '.join(busy)}" if busy else "")))
    return rows


def scaling_checks(run_name: str, table: pd.DataFrame) -> list[dict[str, Any]]:
    """The scaling figure's check per multi-device case (``scaling.scaling``'s ``table``): the same work as its
    one-device case (the same global batch by construction, the same timed steps), and on the GPU no efficiency
    above 1 beyond the two steps' 95% intervals (N devices more than N times faster at a fixed global batch: one
    side did other work or was slowed); on the CPU the N devices share its cores, only the work is checked."""
    rows: list[dict[str, Any]] = []
    for x in table[table["devices"] > 1].itertuples():
        expected = f"same work as {x.one_device_case or 'the one-device case'}" + (
            "; efficiency <= 1 within the 95% intervals" if x.device == "gpu" else "")
        if x.one_device_case is None or pd.isna(x.efficiency):
            why = ("no one-device case of the same framework, mode, math and global batch in this run (kernelmap run "
                   f"--devices 1 {x.devices})" if x.one_device_case is None else "no clean step median")
            rows.append(check_row(run_name, x.framework, x.batch_size, Check.SCALING, x.case, expected, None,
                                  NOT_CHECKED, why))
            continue
        ranged = pd.notna(x.efficiency_low) and pd.notna(x.efficiency_high)
        interval = (f"[{x.efficiency_low:.3f}–{x.efficiency_high:.3f}]" if ranged
                    else "(no 95% interval: too few samples; not judged against 1)")
        figure = (f"efficiency {x.efficiency:.3f} {interval} = {x.one_device_step_ms:.4g} / ({x.devices} × "
                  f"{x.step_ms:.4g}) ms ({SC.KIND})" + (f"; {BUSY}" if x.busy else ""))
        if x.steps != x.one_device_steps:
            status, detail = FAIL, f"not the same work: {x.steps} timed steps against {x.one_device_steps}; {figure}"
        elif x.device == "gpu" and ranged and x.efficiency_low > 1:
            status, detail = FAIL, f"superlinear beyond the 95% intervals: {figure}"
        else:
            status = PASS
            detail = figure + ("" if x.device == "gpu" else "; CPU devices share its cores: not a scaling figure")
        rows.append(check_row(run_name, x.framework, x.batch_size, Check.SCALING, x.case, expected,
                              float(x.efficiency), status, detail))
    return rows


def _absent_rank(run: Run, case: str, r: int) -> str:
    """What of rank ``r``'s captures of ``case`` (its folder, relative to the run) is on disk, for a FAIL's detail."""
    folder = rank_dir(run.path / case, r)
    rel = folder.relative_to(run.path)
    if not folder.is_dir():
        return f"rank {r}: no {rel}/ (its captures are absent from this run directory)"
    held = sorted(p.name for p in folder.iterdir() if p.is_file())
    return (f"rank {r}: no traced step in the records ({rel}/ holds {', '.join(held[:6]) or 'no file'}"
            f"{' ...' if len(held) > 6 else ''})")


def rank_checks(run: Run, steps: pd.DataFrame | None) -> list[dict[str, Any]]:
    """``every rank traced`` (module docstring) per multi-device case of ``run``; ``steps``: ``comm.per_step`` of
    its records (None: no records)."""
    rows: list[dict[str, Any]] = []
    for r in run.results:
        n, fw, case = int(field_at(r, "devices") or 1), field_at(r, "framework"), str(field_at(r, "dir"))
        d = frameworks.REGISTRY.get(fw)
        dp = None if d is None else d.data_parallel
        traced = passes_of(r).get(FRAMEWORK_PASS)
        if n < 2 or dp is None or not dp.processes or traced is None or field_at(traced, "skipped") is not None:
            continue  # one process drives every device (its one trace holds them all), or no framework pass
        have = set() if steps is None else {int(x) for x in steps.loc[steps["run"] == case, "rank"].dropna()}
        missing = [k for k in range(n) if k not in have]
        said = ", ".join(str(k) for k in sorted(have)) or "none"
        if not missing:
            rows.append(check_row(run.name, fw, field_at(r, "batch_size"), Check.RANKS_TRACED, case,
                                  f"ranks 0-{n - 1}", said, PASS, f"traced steps of each of the {n} ranks"))
            continue
        why = "; ".join(_absent_rank(run, case, k) for k in missing)
        gone = [f for f in field_at(r, "files", default=[]) or [] if not (run.path / str(f)).exists()]
        if gone:  # what the run wrote (results.json's list of the case's files) and this directory lacks
            why += f"; results.json lists {len(gone)} file(s) of the case absent here: {', '.join(map(str, gone[:4]))}"
        if run.records is None:
            why = f"no records.parquet (run `kernelmap normalise` on {run.name}); {why}"
        rows.append(check_row(run.name, fw, field_at(r, "batch_size"), Check.RANKS_TRACED, case, f"ranks 0-{n - 1}",
                              said, FAIL, why + (f"; this case's communication figures are rank {said}'s only, not "
                                                 "the case's" if have else "; no communication figure of this case")))
    return rows


def timeline_checks(run_name: str, timeline, steps: pd.DataFrame) -> list[dict[str, Any]]:
    """The merged timeline's check per case it draws (``ranks.rank_timeline``'s ``timeline`` against ``steps``,
    ``comm.per_step`` of the same records): no ``ranks.step_mismatches``."""
    rows = []
    bad_all = step_mismatches(timeline, steps)
    for c in timeline.cases.itertuples():
        bad = bad_all[bad_all["run"] == c.run]
        drawn = timeline.spans[timeline.spans["run"] == c.run]
        detail = (f"{c.source}: {len(drawn)} steps x lane groups drawn (steps {c.iterations.replace(';', ', ')}), "
                  "each at its communication figures' interval" if bad.empty else "; ".join(
                      f"step {x.iteration} rank {x.rank}: {x.why} (figures {x.comm_start_ns}–{x.comm_end_ns}, "
                      f"drawn {x.figure_start_ns}–{x.figure_end_ns} ns)" for x in bad.head(3).itertuples()))
        rows.append(check_row(run_name, c.framework, c.batch_size, Check.RANK_TIMELINE, c.run,
                              "every drawn step = comm_steps' step", f"{len(bad)} differ", PASS if bad.empty else FAIL,
                              detail))
    return rows


def comm_checks(run: Run, figures: CF.CommFigures | None = None) -> list[dict[str, Any]]:
    """The checks of every multi-device case of ``run``; a run without one: each check once, not checked.
    ``figures``: the report's communication figures (``commfigures.of``: computed here, of ``run``, without)."""
    figures = CF.of([run]) if figures is None else figures
    steps = figures.steps.get(run.name)
    rows = step_checks(run.name, steps) if steps is not None else []
    if steps is not None:
        rows += timeline_checks(run.name, figures.timelines[run.name], steps)
    multi = any((r.get("devices") or 1) > 1 for r in run.results)
    if multi and not rows:
        why = ("no traced step of a multi-device case in the records (no --profile framework or comm, or their "
               "traces absent: 'every rank traced' says which)" if run.records is not None
               else f"no records.parquet (run `kernelmap normalise` on {run.name})")
        rows = [check_row(run.name, None, None, c, "run", None, None, NOT_CHECKED, why)
                for c in (Check.COMM_LINKED, Check.COMM_BOUNDS, Check.RANK_TIMELINE)]
    if multi:
        table = figures.independent.get(run.name, pd.DataFrame(columns=INDEPENDENT_COLUMNS[1:]))
        scaled = figures.scaling[figures.scaling["run"] == run.name]
        return (rows + rank_checks(run, steps) + independent_checks(run.name, table, run.results, run.records is not None)
                + scaling_checks(run.name, scaled))
    why = "no case of this run trained on more than one device (--devices)"
    return [check_row(run.name, None, None, c, "run", None, None, NOT_CHECKED, why)
            for c in (Check.COMM_LINKED, Check.COMM_BOUNDS, Check.COMM_INDEPENDENT, Check.SCALING, Check.RANK_TIMELINE,
                      Check.RANKS_TRACED)]
