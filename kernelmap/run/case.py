"""One case of a run (framework x mode x batch size) and the running of every case in the schedule's order.

``Case`` builds its workers' commands and environments, runs its clean trials and capture passes
(``processes.run_worker``) and turns what they returned into its results.json entry
(``results.case_entry``); ``run_schedule`` and ``run_repeats`` run the cases' workers in the
schedule's rounds (``schedule``).
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from .. import doctor, frameworks, rundir, stall
from ..errors import KernelmapError
from ..frameworks import dataparallel
from ..frameworks.case import Case, CaseKey
from ..frameworks.registry import CLEAN_PASS
from . import counters, processes
from .devices import Decision, libs_env, thread_env, worker_environ, worker_own_env
from .processes import RunProgress, nsys_commands, nsys_report
from .results import case_entry
from .schedule import PASS_STEPS, Job, libs_warmup, repeat_reason, round_order


class CaseRun:
    """One case at one batch size (``key``): its workers' commands, what they returned, its results.json
    entry. The key names its folder and logs (``rundir.case_dir``) and is written into its entry."""

    def __init__(self, key: CaseKey, decision: Decision, train: dict[str, Any], data_json: str, run_tmp: Path,
                 nsys: str | None, nsys_skip: str | None, threads: int, python: dict[str, str],
                 stall_limit: float | None = None):
        self.key, self.decision, self.train = key, decision, train
        self.stall_limit = stall_limit  # --stall-limit: seconds a worker may run (0: no limit), None: stall.limit_s
        self.data = json.loads(data_json)
        self.fw, self.bs, self.mode = key.framework, key.batch_size, key.mode
        self.nsys, self.nsys_skip = nsys, nsys_skip
        self.rd = rundir.RunDir(run_tmp)
        self.out_dir = self.rd.case(key)
        config = dict(train, batch_size=self.bs, device=decision.device, mode=self.mode, devices=key.devices,
                      math=key.math, options=(train.get("options") or {}).get(self.fw, {}))  # each case its math
        fw = self.fw
        self.descriptor = frameworks.get(fw)
        self.base = [self.descriptor.python(python) or sys.executable, "-m", "kernelmap.worker", "--framework", fw,
                     "--dir", str(self.out_dir), "--config", json.dumps(config), "--data-info", data_json]
        # N devices on the CPU share its cores: each rank, context or host device a share of the threads
        self.threads_env = thread_env(max(1, threads // key.devices) if decision.device == "cpu" else threads)
        self.own_env = worker_own_env(fw, decision.device)
        self.clean_trials: list[dict[str, Any]] = []
        self.trial_walls: list[float] = []
        self.pass_results: dict[str, dict[str, Any]] = {}
        self.repeat_trials: list[int] = []  # trial numbers of the extra trials (run_repeats)
        self.repeats_over = False  # a repeat failed: no more for this case
        self.failed = False

    @property
    def name(self) -> str:
        return f"{self.key.name} bs {self.bs}"

    def starts_worker(self, job: Job) -> bool:
        """Whether ``job`` starts a worker here (an nsys pass that records nothing here does not)."""
        return not (job.pass_name == "nsys" and self.nsys_skip is not None)

    def _stall(self, steps: int | None, warmup: int, evaluates: bool = False) -> float | None:
        """The stall limit of a worker of this case that runs ``steps`` timed steps (None: the run's --epochs)
        after ``warmup``: --stall-limit's (0: none), else ``stall.limit_s``'s."""
        if self.stall_limit is not None:
            return self.stall_limit or None
        epochs = self.train["epochs"] if steps is None else None  # the images count only under --epochs
        total = stall.worker_steps(self.bs, warmup, steps, epochs, self.data["n_train"] if epochs is not None else 0)
        return stall.limit_s(self.decision.device, self.bs, total, self.data["n_test"] if evaluates else 0)

    def _env(self, pass_name: str) -> dict[str, str]:
        """A worker's environment for ``pass_name`` (the libraries' algorithms shared on a GPU: only a clean trial
        writes them, ``Framework.shared_algorithms_env``)."""
        shared = (self.descriptor.shared_algorithms_env(str(self.rd.algorithm_file(self.key)), self.own_env, pass_name)
                  if self.decision.device == "gpu" else {})
        return worker_environ(self.decision.device, self.key.math, self.threads_env, self.own_env, shared)

    def run_clean(self, trial: int, label: str, progress: RunProgress, repeat: bool = False) -> None:
        """One clean trial in its own process; the first measures accuracy. Every trial fetches its own batches
        and times the loader, so that the end-to-end figure is of the same trials as the step figure (issue 42:
        trial 1's end to end, 649 ms, stood below the 1221 ms step median of trials 1-4)."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        extra = ["--pass", "clean", "--trial", str(trial)] + (["--no-evaluate"] if trial > 1 else [])
        progress.start(label)
        t0 = time.monotonic()
        try:
            processes.run_worker([*self.base, *extra], label=label, batch_size=self.bs, env=self._env(CLEAN_PASS),
                                 forward_stderr=False, log_path=self.rd.log(self.key, "clean", trial),
                                 stall_s=self._stall(self.train["steps"], self.train["warmup_steps"], trial == 1))
        finally:
            progress.finish()
        self.trial_walls.append(time.monotonic() - t0)
        self.clean_trials.append(rundir.read_json(self.rd.pass_result(self.key, "clean", trial)))
        if repeat:
            self.repeat_trials.append(trial)

    def run_capture(self, p: str, progress: RunProgress, notes: list[str]) -> None:
        """One capture pass in its own process (an nsys pass that records nothing here: a note)."""
        fw, bs, out_dir = self.fw, self.bs, self.out_dir
        if p == counters.COUNTERS:
            self._counters(progress, notes)
            return
        if p == dataparallel.NO_REDUCTION:
            self._no_reduction(progress)
            return
        if p == "nsys" and self.nsys_skip is not None:  # printed once for the run; a note per case
            notes.append(f"{self.name}: nsys pass skipped: {self.nsys_skip}")
            self.pass_results[p] = {"skipped": self.nsys_skip}
            return
        out_dir.mkdir(parents=True, exist_ok=True)
        label = f"{self.name} ({p} pass, {self.decision.device})"
        steps = PASS_STEPS[p] if self.train["steps"] is None else min(PASS_STEPS[p], self.train["steps"])
        cmd = [*self.base, "--pass", p, "--steps", str(steps), "--no-evaluate"]
        env = self._env(p)
        env.update(self.descriptor.pass_env.get(p, {}))
        stdout_path = None
        warmup = self.train["warmup_steps"]
        if p == "libs":
            warmup = libs_warmup(self.descriptor, self.mode, warmup)
            cmd += ["--warmup", str(warmup)]
            env.update(libs_env(self.decision.device, out_dir, fw, self.own_env, self.key.devices))
            if self.decision.device == "cpu":
                stdout_path = out_dir / "onednn.log"
        log_path = self.rd.log(self.key, p)
        progress.start(label)
        try:
            window = self.descriptor.nsys_window(self.own_env)
            if p == "libs" and self.descriptor.libs_under_nsys and self.nsys_skip is None and window is not None:
                # the libs pass's own kernels (kernelmap/calllink.py), recorded by nsys in the same process
                self._under_nsys(out_dir / rundir.LIBS_TRACE_DIR, cmd, window, label, env, log_path,
                                 self._stall(steps, warmup))
            elif p == "nsys":
                self._under_nsys(out_dir, cmd, window, label, env, log_path, self._stall(steps, warmup))
            else:
                processes.run_worker(cmd, label=label, batch_size=bs, env=env, stdout_path=stdout_path,
                                     forward_stderr=False, log_path=log_path, stall_s=self._stall(steps, warmup))
        finally:
            progress.finish()
        self.pass_results[p] = rundir.read_json(self.rd.pass_result(self.key, p))

    def _no_reduction(self, progress: RunProgress) -> None:
        """The step without the gradients' reduction (``dataparallel.NO_REDUCTION``), timed as a clean trial is
        (the same steps, warm-up, data and devices; every rank its own result); on one device skipped, its reason
        in results.json."""
        p = dataparallel.NO_REDUCTION
        if self.key.devices < 2:
            why = "one device: no reduction to remove"
            self.pass_results[p] = {"skipped": why}
            return
        label = f"{self.name} ({p} pass: the step without the gradients' reduction, {self.decision.device})"
        progress.start(label)
        try:
            processes.run_worker([*self.base, "--pass", p, "--no-evaluate"], label=label, batch_size=self.bs,
                                 env=self._env(p), forward_stderr=False, log_path=self.rd.log(self.key, p),
                                 stall_s=self._stall(self.train["steps"], self.train["warmup_steps"]))
        finally:
            progress.finish()
        self.pass_results[p] = rundir.read_json(self.rd.pass_result(self.key, p))

    def _counters(self, progress: RunProgress, notes: list[str]) -> None:
        """The counters pass (kernelmap/run/counters.py): the worker under ncu over one step, then the report's
        raw page as CSV; refused (CPU, no ncu, several devices) or failed: a note and its reason, the case goes on."""
        ncu = counters.find_ncu()
        why = counters.skip_reason(self.decision.device, ncu, self.key.devices)
        if why is not None:
            notes.append(f"{self.name}: counters pass skipped: {why}")
            self.pass_results[counters.COUNTERS] = {"skipped": why}
            progress.total -= 1  # no worker starts
            return
        out = self.out_dir / counters.DIR
        out.mkdir(parents=True, exist_ok=True)
        label = f"{self.name} (counters pass under ncu, {self.decision.device})"
        cmd = [*self.base, "--pass", counters.COUNTERS, "--steps", str(counters.STEPS), "--no-evaluate"]
        profile, imported = counters.commands(ncu, out, cmd)
        log_path = self.rd.log(self.key, counters.COUNTERS)
        stall_s = self._stall(counters.STEPS, self.train["warmup_steps"])
        env = {**self._env(counters.COUNTERS), **self.descriptor.pass_env.get(counters.COUNTERS, {}), **counters.ENV}
        algorithms = self.descriptor.shared_algorithms_note(str(self.rd.algorithm_file(self.key)), counters.COUNTERS)
        if algorithms is not None:  # the case's shared algorithms were not there to read
            notes.append(f"{self.name}: counters pass: {algorithms}")
        progress.start(label)
        try:
            with counters.Clock() as clock:
                processes.run_worker(profile, label=label, batch_size=self.bs, env=env, forward_stderr=False,
                                     log_path=log_path, stall_s=stall_s)
            processes.run_worker(imported, label=f"{label}: ncu --import", batch_size=self.bs,
                                 stdout_path=out / counters.CSV, forward_stderr=False, log_path=log_path, stall_s=stall_s)
            result = rundir.read_json(self.rd.pass_result(self.key, counters.COUNTERS))
            self.pass_results[counters.COUNTERS] = counters.summary(result, out, rundir.case_dir(self.key),
                                                                    clock.seconds)
        except KernelmapError as exc:
            why = counters.failure(out, exc)
            notes.append(f"{self.name}: counters pass recorded nothing: {why}")
            self.pass_results[counters.COUNTERS] = {"skipped": why}
        finally:
            progress.finish()
        if algorithms is not None:
            self.pass_results[counters.COUNTERS]["algorithms"] = algorithms

    def _under_nsys(self, out: Path, cmd: list[str], window, label: str, env: dict[str, str],
                    log_path: Path, stall_s: float | None) -> None:
        """Run worker ``cmd`` under nsys into ``out``, then export its report to SQLite there (each of the two
        within ``stall_s``)."""
        out.mkdir(parents=True, exist_ok=True)
        dp = self.descriptor.data_parallel  # one process per device: the worker launches its ranks under nsys
        profile, export = nsys_commands(self.nsys, out, cmd, window,
                                        processes=self.key.devices if dp is not None and dp.processes else 1)
        processes.run_worker(profile, label=label, batch_size=self.bs, env=env, forward_stderr=False,
                             log_path=log_path, stall_s=stall_s)
        processes.run_worker([*export, str(nsys_report(out))], label=f"{label}: nsys export", batch_size=self.bs,
                             forward_stderr=False, log_path=log_path, stall_s=stall_s)

    def drop(self) -> None:
        """Leave this case out of the run: its folder goes (and its framework's, once empty)."""
        self.failed = True
        shutil.rmtree(self.out_dir, ignore_errors=True)
        fw_dir = self.out_dir.parent
        if fw_dir.is_dir() and not any(fw_dir.iterdir()):
            fw_dir.rmdir()

    def entry(self, notes: list[str]) -> dict[str, Any]:
        """This case's results.json entry (and its notes: trials left out, disagreement, contention)."""
        return case_entry(self.key, self.decision, self.clean_trials, self.pass_results, self.repeat_trials,
                          self.out_dir, rundir.case_dir(self.key), notes)


def spread_cases(runnable: list[str], modes: dict[str, list[str]], decisions: dict[str, Decision], math: str,
                 devices: list[int], gpus) -> tuple[list[Case], dict[Case, str]]:
    """Every framework x mode on each of ``devices`` (``--devices``), and why each that cannot run skips:
    a mode without a data-parallel path on N > 1 (``dataparallel.refusal``), more GPUs than the machine has."""
    cases: list[Case] = []
    skips: dict[Case, str] = {}
    for fw in runnable:
        for m in modes[fw]:
            for n in devices:
                case = Case(fw, m, math, n)
                why = dataparallel.refusal(frameworks.get(fw), m, n)
                if why is None and n > 1 and decisions[fw].device == "gpu" and n > len(gpus.gpus):
                    why = f"{n} devices asked for, and this machine has {len(gpus.gpus)} GPU(s)"
                if why is None:
                    cases.append(case)
                else:
                    skips[case] = why
    return cases, skips


def fail_case(case: CaseRun, exc: KernelmapError, notes: list[str], failed: list[str]) -> None:
    """A worker of ``case`` failed (OOM at this batch size, a broken install): it is left out, the rest runs."""
    msg = f"{exc}; {case.name} left out of the run"
    if "ImportError" in str(exc) or "ModuleNotFoundError" in str(exc):
        msg += f"; fix: {doctor.FIX[case.fw]}"
    print(f"kernelmap run: {msg}", file=sys.stderr)
    notes.append(msg)
    failed.append(str(exc))
    case.drop()


def run_schedule(cases: dict[CaseKey, CaseRun], jobs: list[Job], trials: int, progress: RunProgress,
                 notes: list[str], failed: list[str]) -> None:
    """Run ``jobs`` in order; a case whose worker fails drops its remaining jobs (and the progress line's
    count drops them too)."""
    for n, job in enumerate(jobs):
        case = cases[job.key]
        if case.failed:
            continue
        try:
            if job.pass_name == "clean":
                label = f"{case.name} (clean pass trial {job.trial}/{trials}, {case.decision.device})"
                case.run_clean(job.trial, label, progress)
            else:
                case.run_capture(job.pass_name, progress, notes)
        except KernelmapError as exc:
            fail_case(case, exc, notes, failed)
            progress.total -= sum(1 for j in jobs[n + 1:] if j.key == job.key and case.starts_worker(j))


def run_repeats(cases: dict[CaseKey, CaseRun], trials: int, max_repeats: int, budget_s: float,
                budget_said: str, progress: RunProgress, notes: list[str]) -> None:
    """Extra clean trials, one per case and round, for the cases that want one (``repeat_reason``),
    interleaved as the rounds are, until none wants one or the next would overrun ``budget_s`` seconds
    (its expected time: the median of the case's trials so far); a note says when the budget stopped them."""
    spent = 0.0
    r = trials
    while True:
        live = [c for c in cases.values() if not c.failed]
        order = round_order([c.key for c in live], r)
        want = [(cases[k], why) for k in order
                if not cases[k].repeats_over
                and (why := repeat_reason(cases[k].clean_trials, trials, len(cases[k].repeat_trials), max_repeats,
                                          cases[k].pass_results))]
        if not want:
            return
        progress.total += len(want)
        for i, (case, why) in enumerate(want):
            expected = statistics.median(case.trial_walls)
            if spent + expected > budget_s:
                progress.total -= len(want) - i
                left = ", ".join(f"{c.name} ({w})" for c, w in want[i:])
                msg = (f"repeats stopped by the repeat budget ({budget_said}, {spent:.0f} s spent; the next trial "
                       f"takes ~{expected:.0f} s): not repeated further: {left}")
                print(f"kernelmap run: {msg}", file=sys.stderr)
                notes.append(msg)
                return
            trial = len(case.clean_trials) + 1
            label = (f"{case.name} (clean pass trial {trial}, repeat {len(case.repeat_trials) + 1}/{max_repeats}: "
                     f"{why}, {case.decision.device})")
            t0 = time.monotonic()
            try:
                case.run_clean(trial, label, progress, repeat=True)
            except KernelmapError as exc:  # the case keeps the trials it has
                msg = f"{exc}; {case.name} keeps its {len(case.clean_trials)} trials"
                print(f"kernelmap run: {msg}", file=sys.stderr)
                notes.append(msg)
                case.repeats_over = True
            finally:
                spent += time.monotonic() - t0
        r += 1


