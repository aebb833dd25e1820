"""Self-checks of figures against each other and against how they were measured: the relations between
the page's sections that must hold for the page not to contradict itself (docs/checks.md lists them).
``checks.self_checks`` runs them; each returns rows of the self-check table (``checkrows``).

* ``first-screen figures quiet`` (``quiet_figures``, issue 41): the summary's clean step and end-to-end
  step and every capture pass whose figures fill the answer's time cells were measured on a quiet machine
  (or repeated until quiet: trials run under contention left out); FAIL naming the figure and what else
  used the machine; not checked where contention was not measured.
* ``run files present`` (``run_complete``): where a capture pass ran, records.parquet, attribution.json and
  rows of the layer table.
* ``end to end vs step`` (``e2e_vs_step``): the summary's end-to-end step (loader included) is of the same
  trials as its step figure and not below the step's 95% interval (the loader adds time, never takes it).
* ``library call within its op`` (``call_within_op``): a layer's library-call time per step (libs pass) is
  not above its framework op's time per step (framework pass) beyond noise: the call runs inside the op. Not
  checked where the two passes are not one time basis and the call's ran the slower (``basis.PAIR_RULE``: the
  libs pass ran slower than the framework pass beyond their own 95% intervals; the row says by how much); a
  libs pass that ran faster is still held (its speed can hide a call above its op, never make one). Not checked
  either where one pass ran quiet and the other busy (``SAME_CONDITION_RULE``), nor where both ran busy
  (``contended_apart``: two processes, each contended at its own time, and ``NO_SAME_PASS``); the
  page's layer table says the same of each row (``with_call_op_basis``: "not comparable: why"). The figures held are per-step
  medians with their 95% intervals where the layer table has per-step figures (a call descheduled once moves
  a mean, not a median), else the means per step. The two figures are two processes' (the libs pass's, the
  framework pass's): where both passes ran quiet, a call above its op beyond the two intervals fails only beyond
  the noise between processes measured in the same run too (``timing.TWO_PROCESS_RULE``, from the clean pass's
  trials); a gap within it passes, said to be noise (issue 42: PyTorch fc1 bwd 1.042 ms [0.953–1.12] against its
  op's 0.923 [0.872–0.946], MXNet fc2 fwd 0.132 [0.115–0.143] against 0.101 [0.100–0.106], both quiet).
* ``one statement of library calls`` (``call_statement_checks``): on the CPU, the library calls the
  answer and layer table show, the library-call table's calls linked to an op and attribution.json's linked
  count say one thing (JAX: the timeline said "10 oneDNN calls/step ... linked", the answer "native (no call
  logged)", the attribution 0 linked); ``library_call_statement`` is that one statement, in words, which the
  answer's cells and the timeline print.
* ``busy share of one pass`` (``busy_share_basis``): the busy share divides a pass's busy time by that
  pass's own step, or by the clean step where both passes ran alike (neither or both contended).
* ``CPU time vs wall time`` (``cpu_vs_wall``): ``basis.CPU_WALL_RULE`` per CPU case (clean pass): on a quiet
  machine the worker's CPU time per step is not below its wall time beyond noise, nor above wall time x the
  machine's cores; not checked where the clean pass ran contended or unmeasured, where the run records no CPU
  time, or on the GPU (``basis.cpu_wall_agreement`` says why).

Beyond noise (``checkrows.exceeds``): 95% intervals apart where neither figure's pass ran contended; where
either did, by more than ``timing.NOISE_THRESHOLD`` of the smaller (``checkrows.CONTENDED_RULE``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from kernelmap import schema
from kernelmap.rundir import ATTRIBUTION, RECORDS
from kernelmap.timing import capture_ci, two_process_spread

from .analyses.base import NOT_MEASURED, Busy, Run, case_of, field_at, passes_of
from .analyses.basis import CLEAN, CPU_WALL_RULE, TimeKind, cpu_wall_agreement, pair_basis, pass_states
from .analyses.summary import clean_stats
from .checkrows import (
    BOTH_CONTENDED_RULE,
    CONTENDED_RULE,
    FAIL,
    NOT_CHECKED,
    PASS,
    Check,
    both_contended,
    check_row,
    entry_of,
    exceeds,
    ms_text,
    pass_contention,
    span_ms,
)


def _trials_said(ids: Iterable[Any]) -> str:
    ids = list(ids)
    return f"trial{'s' if len(ids) != 1 else ''} {', '.join(str(i) for i in ids)}"


def _quiet_row(run: str, fw: str, bs: Any, subject: str, figure: str, busy: Busy, how: str,
               quiet_after: str = "") -> dict[str, Any]:
    """One ``first-screen figures quiet`` row: FAIL where ``busy`` was contended, not checked where it was
    not measured; ``figure``: the figure in words, ``how``: the trials or pass it comes from."""
    if busy.contended is None:
        return check_row(run, fw, bs, Check.QUIET, subject, "quiet", NOT_MEASURED, NOT_CHECKED,
                         f"{figure} ({how}): contention {busy.text}")
    if busy.contended:
        return check_row(run, fw, bs, Check.QUIET, subject, "quiet", busy.marked, FAIL,
                         f"{figure} ({how}) was measured under contention: {busy.text}")
    return check_row(run, fw, bs, Check.QUIET, subject, "quiet", "quiet", PASS,
                     f"{figure} ({how}): {busy.text}{quiet_after}")


def _answer_passes(answer: pd.DataFrame | None, run: str) -> dict[tuple[str, Any, str], list[str]]:
    """(framework, batch size, pass) -> the kinds of time of the answer's cells that pass measured."""
    out: dict[tuple[str, Any, str], list[str]] = {}
    if answer is None or answer.empty:
        return out
    a = answer[answer["run"] == run]
    fws = sorted({c.split(".")[0] for c in a.columns if c.endswith(".pass")})
    for _, row in a.iterrows():
        for fw in fws:
            p, ms = row.get(f"{fw}.pass"), row.get(f"{fw}.ms_per_step")
            if isinstance(p, str) and ms is not None and pd.notna(ms):
                kinds = out.setdefault((fw, int(row["batch_size"]), p), [])
                kind = str(row.get(f"{fw}.time_kind"))
                if kind not in kinds:
                    kinds.append(kind)
    return out


def quiet_figures(run: Run, answer: pd.DataFrame | None) -> list[dict[str, Any]]:
    """``first-screen figures quiet`` (module docstring): per framework x batch size, the summary's clean
    step (its used trials' contention: trials run under contention and left out, or repeated until a quiet
    one ran, do not count), the summary's end-to-end step (the contention of the trials it comes from) and
    every capture pass whose figures fill the answer's time cells (``answer``: ``answer.answer_table``)."""
    rows: list[dict[str, Any]] = []
    used_passes = _answer_passes(answer, run.name)
    for r in run.results:
        fw, bs = case_of(r), field_at(r, "batch_size")
        med = clean_stats(r).get("median_step_s")
        trials = [t for t in field_at(r, "trials", default=[]) or [] if isinstance(t, dict)]
        used = field_at(r, "contention.trials_used") or [t["trial"] for t in trials if t.get("used")]
        left = [t["trial"] for t in trials if t.get("contended") is True and t["trial"] not in used]
        after = (f"; {_trials_said(left)} ran under contention and {'were' if len(left) > 1 else 'was'} left out "
                 f"({field_at(r, 'repeats', default=0)} repeat(s) run until quiet)") if left else ""
        how = f"median over {_trials_said(used)}" if used else "clean pass"
        rows.append(_quiet_row(run.name, fw, bs, "summary: clean step", f"clean step {ms_text(med)}", Busy.of(r), how,
                               after))
        e2e, e2e_ids = field_at(r, "e2e_step_s"), field_at(r, "e2e_trials") or []
        if e2e is not None and e2e_ids:
            ts = [t for t in trials if t.get("trial") in e2e_ids]
            busy = [Busy.of(t) for t in ts] or [Busy(None, NOT_MEASURED)]
            worst = (next((b for b in busy if b.contended), None) or next((b for b in busy if b.contended is None),
                                                                          None) or busy[0])
            rows.append(_quiet_row(run.name, fw, bs, "summary: end to end with the loader",
                                   f"end-to-end step {ms_text(e2e)}", worst, _trials_said(e2e_ids)))
        for name, p in passes_of(r).items():
            kinds = used_passes.get((fw, bs, name))
            if name == "clean" or not kinds or field_at(p, "skipped") is not None:
                continue
            rows.append(_quiet_row(run.name, fw, bs, f"answer: {name} pass",
                                   f"the answer's {' and '.join(kinds)}", Busy.of(p), f"{name} pass"))
    return rows


def run_complete(run: Run, layers: pd.DataFrame) -> list[dict[str, Any]]:
    """``run files present`` (module docstring): where a capture pass ran, the files the report reads besides
    results.json (records.parquet, attribution.json) and rows of the layer table (without them the report
    says nothing per layer)."""
    captured = any(k != "clean" for r in run.results for k, p in passes_of(r).items()
                   if field_at(p, "skipped") is None)
    rows: list[dict[str, Any]] = []
    if not captured:
        rows.append(check_row(run.name, None, None, Check.RUN_COMPLETE, "records and layers", None, None, NOT_CHECKED,
                         "only the clean pass ran (--profile none): no records or layers to expect"))
        return rows
    for name, path in ((RECORDS, run.path / RECORDS), (ATTRIBUTION, run.path / ATTRIBUTION)):
        rows.append(check_row(run.name, None, None, Check.RUN_COMPLETE, name, "present",
                         "present" if path.is_file() else "missing", PASS if path.is_file() else FAIL,
                         "written by kernelmap normalise" + ("" if path.is_file() else
                                                             f": run `kernelmap normalise` on {run.name}")))
    n = len(layers)
    rows.append(check_row(run.name, None, None, Check.RUN_COMPLETE, "layer table rows", ">0", n, PASS if n else FAIL,
                     f"{n} row(s) of conv and linear layers" if n else
                     "a capture pass ran but the report has no layer: no per-layer answer"))
    return rows


def _used_trials(r: dict) -> list[Any]:
    trials = [t for t in field_at(r, "trials", default=[]) or [] if isinstance(t, dict)]
    return list(field_at(r, "contention.trials_used") or [t["trial"] for t in trials if t.get("used")])


def e2e_vs_step(run: Run) -> list[dict[str, Any]]:
    """``end to end vs step`` (module docstring), per framework x batch size with an end-to-end figure."""
    rows: list[dict[str, Any]] = []
    for r in run.results:
        fw, bs = case_of(r), field_at(r, "batch_size")
        c = clean_stats(r)
        e2e, step, lo, hi = (c.get(k) for k in ("e2e_step_s", "median_step_s", "ci95_low_s", "ci95_high_s"))
        if e2e is None or step is None:
            rows.append(check_row(run.name, fw, bs, Check.E2E_VS_STEP, "end to end >= step", None, None,
                                  NOT_CHECKED, "no end-to-end figure" if e2e is None else "no step figure"))
            continue
        ids, used = list(field_at(r, "e2e_trials") or []), _used_trials(r)
        busy = Busy.of(r)
        ci = (lo, hi) if lo is not None and hi is not None else None
        below = exceeds(step, e2e, ci, (e2e, e2e), bool(busy.contended))
        figures = (f"end to end {ms_text(e2e)} ({_trials_said(ids) if ids else 'trials not recorded'}) vs the step "
                   f"alone {ms_text(step)} {span_ms(ci)} ({_trials_said(used) if used else 'clean pass'})")
        rows.append(check_row(run.name, fw, bs, Check.E2E_VS_STEP, "end to end >= step", step * 1e3, e2e * 1e3,
                              FAIL if below else PASS,
                              f"{'below' if below else 'not below'} the step beyond noise: {figures}"
                              + (f"; {CONTENDED_RULE}; clean pass: {busy.marked}" if busy.contended else "")))
        if not ids or not used:
            rows.append(check_row(run.name, fw, bs, Check.E2E_VS_STEP, "same trials", None, None, NOT_CHECKED,
                                  "results.json records no trials of the end-to-end or the step figure"))
            continue
        same = sorted(ids) == sorted(used)
        rows.append(check_row(run.name, fw, bs, Check.E2E_VS_STEP, "same trials", _trials_said(used),
                              _trials_said(ids), PASS if same else FAIL,
                              "the end-to-end figure is of the step figure's trials" if same else
                              "the end-to-end figure is of other trials than the step figure beside it "
                              f"({field_at(r, 'e2e_timing') or 'no method recorded'})"))
    return rows


# A call is held against its op only where both passes ran under one condition (both quiet or both busy): on the
# 2-core VM a small MXNet op ran 3-4x faster beside a process busy on the other core while a large one slowed.
SAME_CONDITION_RULE = "small ops move opposite ways under load"


def _step_figure(steps: Any, mean_ms: float) -> tuple[float, tuple[float, float] | None, str]:
    """The figure ``call_within_op`` holds: the per-step median and its 95% interval where there are per-step
    figures (one descheduled call moves a mean, not a median), else the mean per step and no interval."""
    if isinstance(steps, list) and len(steps) > 1:
        return float(np.median(steps)), capture_ci(steps), f"median of {len(steps)} steps"
    return float(mean_ms), None, "mean per step"


def _word(busy: Busy) -> str:
    return "busy" if busy.contended else "quiet"


TWO_PROCESS_NAME = "timing.TWO_PROCESS_RULE, docs/checks.md"  # where a row's reader finds the rule in full


def _beyond_processes(run: Run, fw: str, bs: int, call_ci: tuple[float, float],
                      op_ci: tuple[float, float]) -> tuple[bool, str]:
    """``timing.TWO_PROCESS_RULE`` for a call whose 95% interval lies above its op's (ms/step), both passes quiet:
    (above beyond the noise between the two processes too, the words that say so). Where that noise is not
    measured, the passes' own intervals judge alone and the words say why."""
    r = entry_of(run, fw, bs) or {}
    meds = [float(m) for m in field_at(r, "trial_medians_s", default=None) or []]
    clean = Busy.of(r)
    share = two_process_spread(meds) if clean.contended is False else None
    if share is None:
        why = (f"clean pass {clean.marked}" if clean.contended is not False else
               f"{len(meds)} used clean trial{'s' if len(meds) != 1 else ''}")
        return True, f"and the noise between the two processes is not measured ({why}; {TWO_PROCESS_NAME})"
    allowed = op_ci[1] * (1 + share)
    noise = (f"the noise between the two processes: the call's interval starts at {call_ci[0]:.4g} ms, the op's ends "
             f"at {op_ci[1]:.4g}, at {allowed:.4g} once widened by {share:.1%}, the spread of the clean pass's {len(meds)} "
             f"trials, each its own process (medians {min(meds) * 1e3:.4g}–{max(meds) * 1e3:.4g} ms; {TWO_PROCESS_NAME})")
    if call_ci[0] > allowed:
        return True, f"and beyond {noise}"
    return False, f"but within {noise}: noise between processes, not a call longer than its op"


# The one pass that would measure a call and its op together does not exist on the CPU: the libs pass logs the calls
# and traces no op, the framework pass traces the ops and logs no call.
NO_SAME_PASS = "no pass measured both (the libs pass logs the calls and traces no op, the framework pass the reverse)"


def contended_apart(a: Busy, b: Busy, one_process: bool = False) -> str:
    """The one decision that two figures are not held against each other because each was measured under contention
    in its own process at its own time: ``checkrows.BOTH_CONTENDED_RULE`` (the one wording every check gives it) where
    ``a`` and ``b`` were both measured contended and are not of ``one_process``; '' otherwise (either quiet or not
    measured). ``call_op_apart`` and ``checks``' ``layer time vs batch size`` and ``clean vs step benchmark`` decide
    by it; what each does with one busy and one quiet figure is its own (module docstrings)."""
    return BOTH_CONTENDED_RULE if not one_process and both_contended(a, b) else ""


def call_op_apart(run: Run, x: pd.Series, states: dict | None = None) -> tuple[str, list[Busy], Any]:
    """Why a layer-table row's library-call time is not to be held against its op's time ('' where it is), with the
    two passes' contention and their ``basis.pair_basis``: ``basis.PAIR_RULE``; one pass quiet and the other busy
    (``SAME_CONDITION_RULE``); both busy in two passes (``contended_apart``: issue 42's PyTorch bs 64
    conv1 backward, a 4.36 ms call inside a 1.151 ms op, both passes busy). The page's layer table says the same."""
    fw, bs = x["framework"], int(x["batch_size"])
    pair = pair_basis(pass_states([run]) if states is None else states, run.name, fw, bs, x["pass"], x["op_pass"])
    busy = [pass_contention(run, fw, bs, x["pass"]), pass_contention(run, fw, bs, x["op_pass"])]
    marks = f"{x['pass']} pass: {busy[0].marked}, {x['op_pass']} pass: {busy[1].marked}"
    if pair.withheld:  # basis.PAIR_RULE
        return pair.why, busy, pair
    if None not in (busy[0].contended, busy[1].contended) and busy[0].contended != busy[1].contended:
        return (f"the {x['pass']} pass was {_word(busy[0])} and the {x['op_pass']} pass {_word(busy[1])} "
                f"({SAME_CONDITION_RULE}); {marks}"), busy, pair
    both = contended_apart(*busy, one_process=x["pass"] == x["op_pass"])
    if both:
        return f"{both}; {NO_SAME_PASS}; {marks}", busy, pair
    return "", busy, pair


def _call_op_rows(layers: pd.DataFrame) -> pd.DataFrame:
    """The layer-table rows with a library-call time and its op's time."""
    if not len(layers):
        return layers
    return layers[(layers["time_kind"] == str(TimeKind.LIBRARY)) & layers["ms_per_step"].notna()
                  & layers["op_ms_per_step"].notna()]


CALL_VS_OP = "op_time_vs_call"  # the layer table's column: whether its op time may be read against its call time


def with_call_op_basis(runs: list[Run], layers: pd.DataFrame) -> pd.DataFrame:
    """``layers`` with ``CALL_VS_OP``: on each row with a library-call time and an op time, "one basis" or "not
    comparable: <why>" (``call_op_apart``), so the page never sets the two side by side as if comparable."""
    out = layers.copy()
    out[CALL_VS_OP] = None
    by_name = {r.name: r for r in runs}
    for run_name, rows in _call_op_rows(layers).groupby("run", sort=False):
        run = by_name[run_name]
        states = pass_states([run])
        for i, x in rows.iterrows():
            why = call_op_apart(run, x, states)[0]
            out.at[i, CALL_VS_OP] = f"not comparable: {why}" if why else "one basis"
    return out


def call_within_op(run: Run, layers: pd.DataFrame) -> list[dict[str, Any]]:
    """``library call within its op`` (module docstring), per layer-table row with library-call time."""
    rows: list[dict[str, Any]] = []
    states = pass_states([run])
    for _, x in _call_op_rows(layers).iterrows():
        fw, bs = x["framework"], int(x["batch_size"])
        subject = f"{x['layer']} {x['direction']}"
        call, call_ci, call_of = _step_figure(x["steps_ms"], x["ms_per_step"])
        op, op_ci, op_of = _step_figure(x["op_steps_ms"], x["op_ms_per_step"])
        said = (f"library-call time {call:.4g} ms/step ({x['pass']} pass, {call_of})", f"its op's {op:.4g} ms/step "
                f"({x['op_pass']} pass, {op_of})")
        why, busy, pair = call_op_apart(run, x, states)
        if why:  # basis.PAIR_RULE, SAME_CONDITION_RULE or BOTH_CONTENDED_RULE: the page says "not comparable"
            rows.append(check_row(run.name, fw, bs, Check.CALL_WITHIN_OP, subject, op, call, NOT_CHECKED,
                                  f"{said[0]} not held against {said[1]}: {why}"))
            continue
        contended = any(b.contended for b in busy)
        above = exceeds(call, op, call_ci, op_ci, contended)
        cis = ", ".join(f"{w} [{c[0]:.4g}–{c[1]:.4g}] ms" for w, c in (("call", call_ci), ("op", op_ci)) if c)
        between = ""
        if above and not contended and call_ci and op_ci:  # both quiet: beyond the passes' own intervals
            above, between = _beyond_processes(run, fw, bs, call_ci, op_ci)
        rows.append(check_row(
            run.name, fw, bs, Check.CALL_WITHIN_OP, subject, op, call, FAIL if above else PASS,
            (f"{said[0]} above {said[1]} beyond the passes' own intervals ({cis}) {between}" if between else
             f"{said[0]} {'above' if above else 'not above'} {said[1]} beyond noise ({cis or 'no intervals'})")
            + (f"; {CONTENDED_RULE}" if contended else "")
            + (f"; {x['pass']} pass: {busy[0].marked}, {x['op_pass']} pass: {busy[1].marked}"
               if above or contended else "")
            + (f"; held though the passes ran apart, the call's the faster: {pair.why}" if pair.same is False else "")))
    return rows


def busy_share_basis(run: Run, busy: pd.DataFrame) -> list[dict[str, Any]]:
    """``busy share of one pass`` (module docstring), per busy-share row of the run."""
    rows: list[dict[str, Any]] = []
    for _, b in busy[busy["run"] == run.name].iterrows():
        fw, bs, p = b["framework"], b["batch_size"], b.get("pass")
        share = b["busy_share"]
        subject = f"{b['level']} time over {b['step_basis']}"
        if pd.isna(share) or not isinstance(p, str):
            rows.append(check_row(run.name, fw, bs, Check.BUSY_SHARE, subject, None, None, NOT_CHECKED,
                                  "no busy share (no step to divide by, or its pass is not known)"))
            continue
        own = b["step_pass"] == p
        cap, clean = pass_contention(run, fw, bs, p), pass_contention(run, fw, bs, CLEAN)
        if not own and (cap.contended is None or clean.contended is None):
            rows.append(check_row(run.name, fw, bs, Check.BUSY_SHARE, subject, p, b["step_pass"], NOT_CHECKED,
                                  f"{p} pass: {cap.marked}, clean pass: {clean.marked}: contention not measured"))
            continue
        alike = own or cap.contended == clean.contended
        rows.append(check_row(
            run.name, fw, bs, Check.BUSY_SHARE, subject, p, b["step_pass"], PASS if alike else FAIL,
            f"busy share {share:.1%}: {b['busy_ms_per_step']:.4g} ms/step of the {p} pass over a "
            f"{b['step_ms']:.4g} ms step of the {b['step_pass']} pass"
            + ("" if own else f"; {p} pass: {cap.marked}, clean pass: {clean.marked}")
            + ("" if alike else ": a pass run under contention over a step that was not (or the reverse)")))
    return rows


def library_call_statement(libcalls: pd.DataFrame, run: str, fw: str, bs: Any) -> str | None:
    """What the library-call table says of one framework x batch size's logged calls, in words every section
    prints: "9 oneDNN calls/step logged in the libs pass, 0 linked to an op"; None where it lists none."""
    if libcalls is None or libcalls.empty:
        return None
    lc = libcalls[(libcalls["run"] == run) & (libcalls["framework"] == fw) & (libcalls["batch_size"] == bs)]
    if lc.empty:
        return None
    parts = []
    for lib, g in lc.groupby("library", sort=True):
        n = float(g["calls_per_step"].fillna(0).sum())
        linked = float(g.loc[g["linked_to_op"].fillna(False).astype(bool), "calls_per_step"].fillna(0).sum())
        parts.append(f"{n:.4g} {lib} calls/step logged in the libs pass, {linked:.4g} linked to an op")
    return "; ".join(parts)


def _attribution_linked(run: Run, r: dict) -> int | None:
    """oneDNN primitives and BLAS calls attribution.json counts as linked to an op for one results entry."""
    part = field_at(run.attribution, "runs", default={}).get(str(field_at(r, "dir", default="")))
    if not isinstance(part, dict) or "onednn_linked" not in part:
        return None
    return int(part.get("onednn_linked") or 0) + int(part.get("blas_linked") or 0)


def call_statement_checks(run: Run, layers: pd.DataFrame, libcalls: pd.DataFrame) -> list[dict[str, Any]]:
    """``one statement of library calls`` (module docstring), per CPU framework x batch size with logged calls."""
    rows: list[dict[str, Any]] = []
    cpu = libcalls[(libcalls["run"] == run.name) & libcalls["kernels_linked"].fillna(0).eq(0)] if len(
        libcalls) else libcalls
    for (fw, bs), g in cpu.groupby(["framework", "batch_size"], sort=False):
        bs = int(bs)
        lt = layers[(layers["framework"] == fw) & (layers["batch_size"] == bs)] if len(layers) else layers
        if len(lt) and (lt["level"] != "op").any():
            continue  # kernel-level (GPU) rows: calls own kernels, not ops
        linked = g[g["linked_to_op"].fillna(False).astype(bool)]
        layer_linked = linked[linked["layer"].notna() & (linked["layer"] != schema.UNKNOWN)]
        shown = int(sum(bool(isinstance(c, list) and c) for c in lt["library_calls"])) if len(lt) else 0
        r = next((x for x in run.results if field_at(x, "framework") == fw and field_at(x, "batch_size") == bs), {})
        attr = _attribution_linked(run, r)
        said = library_call_statement(libcalls, run.name, fw, bs)
        problems = []
        if bool(shown) != bool(len(layer_linked)):
            problems.append(f"the layer table shows library calls on {shown} row(s) while the library-call table "
                            f"links {len(layer_linked)} call kind(s) to a layer's op")
        if attr is not None and bool(attr) != bool(len(linked)):
            problems.append(f"attribution.json links {attr} call(s) to an op while the library-call table links "
                            f"{len(linked)} call kind(s)")
        rows.append(check_row(run.name, fw, bs, Check.CALL_STATEMENT, "library calls linked to ops",
                              len(linked), shown, FAIL if problems else PASS,
                              ("; ".join(problems) + f" (the library-call table: {said})") if problems else
                              f"every section says: {said}; {shown} layer row(s) show a call; attribution.json: "
                              f"{'not recorded' if attr is None else f'{attr} linked'}"))
    return rows


def _ms_ci(v: Any) -> str:
    return "no interval" if not isinstance(v, tuple) else f"[{v[0]:.4g}–{v[1]:.4g}] ms"


def cpu_vs_wall(run: Run) -> list[dict[str, Any]]:
    """``CPU time vs wall time`` (module docstring): one row per case of ``basis.cpu_wall_agreement``, its
    verdict as the row's status (None: not checked, with its reason)."""
    rows: list[dict[str, Any]] = []
    for a in cpu_wall_agreement([run]).to_dict("records"):
        cpu, wall = (None if pd.isna(a[k]) else float(a[k]) for k in ("cpu_ms", "wall_ms"))
        if a["agrees"] not in (True, False) or cpu is None or wall is None:
            rows.append(check_row(run.name, a["framework"], a["batch_size"], Check.CPU_WALL, "CPU time per step",
                                  wall, cpu, NOT_CHECKED, a["why"]))
            continue
        n = a["cores"]
        cores = f"{int(n)} cores" if isinstance(n, int | float) and not pd.isna(n) else "cores not recorded (no upper bound)"
        figures = (f"CPU {cpu:.4g} ms {_ms_ci(a['cpu_ci_ms'])} vs wall {wall:.4g} ms {_ms_ci(a['wall_ci_ms'])} per step"
                   f" ({cpu / wall:.2f} x), {cores}; clean pass quiet")
        rows.append(check_row(run.name, a["framework"], a["batch_size"], Check.CPU_WALL, "CPU time per step", wall,
                              cpu, PASS if a["agrees"] else FAIL,
                              f"{a['why'] or 'within wall time (noise) and wall time x cores'}: {figures}"
                              + ("" if a["agrees"] else f" ({CPU_WALL_RULE})")))
    return rows
