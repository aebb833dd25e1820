"""``kernelmap run``: the command line, and the run in named stages.

``validate`` checks every option before anything is probed; ``plan`` decides each framework's device
(``devices``), its modes and each case's nsys verdict; ``run_cases`` runs every case's workers
(``case``, ``processes``) in interleaved rounds (``schedule``); ``write_run`` writes parity, the
manifest and the results (``results``); ``normalise_captures`` turns the captures into records. The run
directory is built under a temporary name and renamed when complete (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .. import devparity, doctor, frameworks, gpuinfo, manifest, options, rundir, stall, timing
from ..atomic import atomic_dir
from ..errors import KernelmapError, MissingToolError
from ..frameworks.case import Case, CaseKey
from ..frameworks.spec import MATH_DEFAULT, Math
from .case import CaseRun, run_repeats, run_schedule, spread_cases
from .devices import Decision, decide_devices, nsys_skips, physical_cores, said_once
from .processes import RunProgress
from .results import print_table, summary, timing_config
from .schedule import (
    DEFAULT_MAX_REPEATS,
    LIBS_WARMUP,
    PASS_STEPS,
    PROFILES,
    REPEAT_BUDGET_SHARE,
    case_nsys_skips,
    check_warmup,
    planned_workers,
    repeat_budget_s,
    schedule,
)


def default_out() -> Path:
    return Path("runs") / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def resolve_data(train: dict[str, Any]):
    from kernelmap.frameworks import spec
    from kernelmap.frameworks.data import prepare_dir, resolve_data

    info = resolve_data(spec.TrainConfig(**{**train, "options": {}}))
    if not info.synthetic:
        prepare_dir(info)  # once here, so that workers never race to lay the files out
    return info


PARITY_STEPS = 20


def parity_steps(train: dict) -> int:
    """The steps each parity comparison trains: PARITY_STEPS, or the run's fewer --steps."""
    return PARITY_STEPS if train["steps"] is None else min(PARITY_STEPS, train["steps"])


def parity_figures(train: dict[str, Any], batch_size: int, ran: dict[str, str],
                   python: dict[str, str]) -> dict[str, dict[str, Any]]:
    """``kernelmap parity`` figures of every framework that ran against the reference (each framework in its own
    subprocess), on the GPU where both ran there (TF32 off), else on the CPU, at fp32 and at each mixed math of the
    run that both can run there (``parity_maths``): {framework: figures}; {} where the reference did not run.
    ``ran``: framework -> its device."""
    from ..parity import compute_parity

    if frameworks.REFERENCE not in ran:
        return {}
    steps = parity_steps(train)
    out = {}
    for fw in frameworks.FRAMEWORKS:
        if fw not in ran or fw == frameworks.REFERENCE:
            continue
        device = "gpu" if ran[fw] == ran[frameworks.REFERENCE] == "gpu" else "cpu"
        pair = (frameworks.REFERENCE, fw)
        out[fw] = compute_parity(data=train["data"], data_dir=train["data_dir"], steps=steps, batch_size=batch_size,
                                 lr=train["lr"], momentum=train["momentum"], seed=train["seed"], frameworks=pair,
                                 python=python, device=device, maths=parity_maths(train["math"], pair, device))
    return out


def parity_maths(maths: list[str], pair: tuple[str, str], device: str) -> tuple[str, ...]:
    """fp32 (always: the pair's reference math), then each mixed math of the run that both frameworks of ``pair``
    can run on ``device`` (``frameworks.math_refusal``): the run's parity per math."""
    mixed = [m for m in maths if Math(m).mixed and all(frameworks.math_refusal(fw, m, device) is None for fw in pair)]
    return (MATH_DEFAULT.value, *mixed)


def normalise_run(run_tmp: Path) -> None:
    from kernelmap.normalise import normalise_run_dir  # lands in parallel; imported only when needed

    normalise_run_dir(run_tmp)


def train_config(args: argparse.Namespace, chosen: list[str]) -> dict[str, Any]:
    """The workers' training configuration from the command line (a framework's option given for a
    framework that does not run refused)."""
    train = {
        "lr": args.lr,
        "momentum": 0.9,
        "steps": None if args.epochs is not None else args.steps,
        "epochs": args.epochs,
        "warmup_steps": args.warmup,
        "seed": args.seed,
        "data": args.data,
        "data_dir": args.data_dir,
        "math": args.math,
        # each framework's own options (registry.Option) that were given: {framework: {name: value}}
        "options": {fw: vals for fw, d in frameworks.REGISTRY.items()
                    if (vals := {o.name: getattr(args, o.name) for o in d.options
                                 if getattr(args, o.name, None) is not None})},
    }
    for fw in set(train["options"]) - set(chosen):
        flags = ", ".join(o.flag for o in frameworks.get(fw).options if o.name in train["options"][fw])
        raise KernelmapError(f"{flags} is {frameworks.get(fw).label}'s option, and {fw} does not run "
                             f"(--framework {args.framework})")
    return train


def modes_here(runnable: list[str], asked: list[str] | None, decisions: dict[str, Decision], maths: list[str]
               ) -> tuple[dict[str, list[str]], dict[Case, str]]:
    """({framework: its modes that run here}, {case: why that mode does not run here}, at each of ``maths``)."""
    modes: dict[str, list[str]] = {}
    mode_skips: dict[Case, str] = {}
    for fw in runnable:
        try:
            modes[fw], skipped_modes = frameworks.modes_to_run(fw, asked, decisions[fw].device)
        except ValueError as exc:
            raise KernelmapError(str(exc)) from None
        mode_skips.update({Case(fw, m, x): why for m, why in skipped_modes.items() for x in maths})
    for line in said_once({c.name: why for c, why in mode_skips.items()}, "mode skipped"):
        print(f"kernelmap run: {line}", file=sys.stderr)
    return modes, mode_skips


def math_cases(cases: list[Case], maths: list[str], decisions: dict[str, Decision]
               ) -> tuple[list[Case], dict[Case, str]]:
    """Each case (made at the default math) at every ``--math`` value, and why each that cannot run here is
    skipped (``frameworks.math_refusal``: e.g. fp16 on the CPU): never run in fp32 under the label."""
    out: list[Case] = []
    skips: dict[Case, str] = {}
    for x in maths:
        for c in cases:
            case = dataclasses.replace(c, math=x)
            why = frameworks.math_refusal(c.framework, x, decisions[c.framework].device)
            if why is None:
                out.append(case)
            else:
                skips[case] = why
    for line in said_once({c.name: why for c, why in skips.items()}, "math skipped"):
        print(f"kernelmap run: {line}", file=sys.stderr)
    return out, skips


def write_parity(tmp: Path, train: dict[str, Any], batch_size: int, ran: dict[str, str],
                 python: dict[str, str], notes: list[str]) -> tuple[dict[str, dict], str | None]:
    """Parity of each framework that ran against the reference, written into the run; (figures, why it
    could not be computed or None). A failure keeps the run, said in ``notes``."""
    parity_failed: str | None = None
    try:
        parities = parity_figures(train, batch_size, ran, python)
    except KernelmapError as exc:  # MissingToolError included: the finished run is kept, the failure said
        parities, parity_failed = {}, str(exc)
        msg = f"parity failed: {parity_failed}; the run is kept without parity figures"
        print(f"kernelmap run: {msg}", file=sys.stderr)
        notes.append(msg)
    for fw, parity in parities.items():
        rundir.RunDir(tmp).write_json(rundir.RunDir(tmp).parity(fw), parity)
        if not parity["passed"]:
            msg = (f"parity: {fw} differs from {frameworks.REFERENCE} beyond tolerance: "
                   f"{'; '.join(parity['failures'])}")
            print(f"kernelmap run: {msg}", file=sys.stderr)
            notes.append(msg)
    return parities, parity_failed


# --- the run's stages -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Options:
    """The command line, checked before anything is probed or run (``validate``)."""

    chosen: list[str]  # the frameworks asked for
    python: dict[str, str]  # --python: {framework: interpreter}
    passes: tuple[str, ...]  # the clean pass, then the capture passes of --profile
    out: Path
    train: dict[str, Any]  # the workers' training configuration (``train_config``)
    threads: int


def validate(args: argparse.Namespace) -> Options:
    """Every option's value checked on its own and against the others, before any probe, GPU query or
    worker: a bad value costs no time."""
    options.check_args(args)  # the batch sizes against the data and the memory: options.validate in execute
    chosen = list(frameworks.FRAMEWORKS) if args.framework == "all" else [args.framework]
    try:
        python = frameworks.parse_python(args.python)
    except ValueError as exc:
        raise KernelmapError(str(exc)) from None
    out = Path(args.out) if args.out else default_out()
    if out.exists() and not args.replace:
        raise KernelmapError(f"{out}: already exists; choose another --out or pass --replace")
    return Options(chosen, python, PROFILES[args.profile], out, train_config(args, chosen),
                   args.threads if args.threads is not None else physical_cores())


@dataclass
class Plan:
    """What runs where, decided before the first worker (``plan``)."""

    gpus: gpuinfo.GpuReport
    decisions: dict[str, Decision]
    runnable: list[str]
    nsys: str | None
    modes: dict[str, list[str]]  # {framework: its modes that run here}
    mode_skips: dict[Case, str]  # {case: why that mode does not run here}
    cases: list[Case]  # the cases that run (each at every --batch-size)
    case_skips: dict[Case, str]  # {case: why its nsys pass records nothing}
    load_start: list[float] | None


def plan(args: argparse.Namespace, opts: Options, gpus: gpuinfo.GpuReport, load_start: list[float] | None) -> Plan:
    """Each framework's device (its probe), its modes that run here and each case's nsys verdict; every
    downgrade and skip said once on stderr."""
    decisions = decide_devices(opts.chosen, args.device, opts.python, gpus)
    runnable = [fw for fw in opts.chosen if decisions[fw].device is not None]
    if not runnable:
        notes_ = list(dict.fromkeys(d.note or "" for d in decisions.values()))  # same reason once
        raise MissingToolError(f"nothing can run ({', '.join(opts.chosen)}): " + "; ".join(notes_))
    nsys = doctor.find_tool("nsys") if "nsys" in opts.passes else None
    skips = nsys_skips(decisions, nsys) if "nsys" in opts.passes else {}
    for line in said_once(skips, "nsys pass skipped"):
        print(f"kernelmap run: {line}", file=sys.stderr)
    modes, mode_skips = modes_here(runnable, args.mode, decisions, opts.train["math"])
    cases, device_skips = spread_cases(runnable, modes, decisions, MATH_DEFAULT.value, args.devices, gpus)
    mode_skips.update(device_skips)
    for line in said_once({c.name: why for c, why in device_skips.items()}, "case skipped"):
        print(f"kernelmap run: {line}", file=sys.stderr)
    cases, math_skips = math_cases(cases, opts.train["math"], decisions)
    mode_skips.update(math_skips)
    if not cases:
        asked = f"--mode {' '.join(dict.fromkeys(args.mode or ()))} --math {' '.join(opts.train['math'])}"
        raise KernelmapError(f"{asked}: no case of {', '.join(runnable)} can run here: "
                             + "; ".join(f"{c.name}: skipped: {why}" for c, why in mode_skips.items()))
    check_warmup(opts.train["warmup_steps"], cases)
    case_skips = case_nsys_skips(cases, skips) if "nsys" in opts.passes else {}
    for line in said_once({c.name: v for c, v in case_skips.items() if c.framework not in skips}, "nsys pass skipped"):
        print(f"kernelmap run: {line}", file=sys.stderr)
    return Plan(gpus, decisions, runnable, nsys, modes, mode_skips, cases, case_skips, load_start)


@dataclass
class Ran:
    """What the workers left: each case, the notes said, the failures, the repeat budget."""

    cases: dict[CaseKey, CaseRun]
    notes: list[str]
    failed: list[str]
    budget_s: float
    budget_said: str


def run_cases(args: argparse.Namespace, opts: Options, p: Plan, data_json: str, tmp: Path) -> Ran:
    """Every case's workers into ``tmp``: interleaved rounds (``schedule``), then extra clean trials where
    trials were contended or disagree (``run_repeats``)."""
    progress = RunProgress(planned_workers(p.cases, len(args.batch_size), args.trials, opts.passes, p.case_skips))
    notes = [f"{c.name}: skipped: {why}" for c, why in p.mode_skips.items()]
    failed: list[str] = []
    cases = {c.at(bs): CaseRun(c.at(bs), p.decisions[c.framework], opts.train, data_json, tmp, p.nsys,
                               p.case_skips.get(c), opts.threads, opts.python, stall_limit=args.stall_limit)
             for c in p.cases for bs in args.batch_size}
    run_schedule(cases, schedule(list(cases), args.trials, tuple(x for x in opts.passes if x != "clean")),
                 args.trials, progress, notes, failed)
    budget = repeat_budget_s(time.monotonic() - progress.t0, args.repeat_budget)
    budget_said = (f"--repeat-budget {args.repeat_budget:g} s" if args.repeat_budget is not None else
                   f"{budget:.0f} s, {REPEAT_BUDGET_SHARE:.0%} of the run so far")
    run_repeats(cases, args.trials, args.max_repeats, budget, budget_said, progress, notes)
    return Ran(cases, notes, failed, budget, budget_said)


def write_run(args: argparse.Namespace, opts: Options, p: Plan, ran: Ran, results: list[dict[str, Any]],
              data_info, tmp: Path, batches: dict[str, Any]) -> tuple[dict[str, dict], str | None]:
    """Parity, manifest.json and results.json into ``tmp``; (parity figures, why parity failed or None)."""
    parities, parity_failed = write_parity(tmp, opts.train, args.batch_size[0],
                                           {r["framework"]: r["device"] for r in results}, opts.python, ran.notes)
    fw_entries = {}
    for fw, d in p.decisions.items():
        versions = next((r["versions"] for r in results if r["framework"] == fw), None)
        fw_entries[fw] = {**d.to_manifest(), "versions": versions, "skipped": d.device is None}
    config = {"cli": {k: v for k, v in vars(args).items() if not k.startswith("_")},
              "train": opts.train, "modes": {fw: p.modes[fw] for fw in p.runnable},
              "modes_skipped": {c.name: why for c, why in p.mode_skips.items()},
              # every case asked for that can run here, typed (frameworks/case.py), with its folder
              "cases": [{**k.to_fields(), "dir": str(rundir.case_dir(k))} for k in ran.cases],
              "passes": list(opts.passes), "pass_steps": PASS_STEPS, "libs_warmup": LIBS_WARMUP,
              "out": str(opts.out), "trials": args.trials, "threads": opts.threads, "batches": batches,
              "timing": timing_config(args, ran.budget_s, ran.budget_said)}
    man = manifest.build(config=config, gpus=p.gpus, frameworks=fw_entries, data=data_info.to_dict(),
                         job=manifest.job_id(opts.out))
    man["host"]["load_average_start"] = p.load_start
    man["run_version"] = rundir.RUN_VERSION  # results.json's entries carry their typed case key
    man["notes"] = ran.notes
    man["parity"] = {fw: {"reference": frameworks.REFERENCE, "passed": x["passed"], "file": rundir.parity_name(fw)}
                     for fw, x in parities.items()} or None
    man["parity_failed"] = parity_failed
    # issue 39: each multi-device case against its framework on one device (kernelmap/devparity.py)
    man["parity_devices"] = devparity.run_parities(tmp, opts.train, results, opts.python, ran.notes,
                                                   parity_steps(opts.train)) or None
    run_dir = rundir.RunDir(tmp)
    run_dir.write_json(run_dir.manifest, man)
    run_dir.write_json(run_dir.results, results)
    return parities, parity_failed


def normalise_captures(tmp: Path) -> KernelmapError | None:
    """Normalise the run's captures (``normalise_run``); a failure is returned, not raised: the captures
    are kept and the failure reported after the rename."""
    try:
        normalise_run(tmp)
    except KernelmapError as exc:
        return exc
    except Exception as exc:  # noqa: BLE001 - a parser defect must not cost the captures either
        # (on the H100 a ValueError in the cuDNN log adapter discarded a whole GPU run's captures)
        traceback.print_exc(file=sys.stderr)
        return KernelmapError(f"{type(exc).__name__}: {exc} (a kernelmap defect: traceback above)")
    return None


def execute(args: argparse.Namespace) -> dict[str, Any]:
    """Do the run (options checked, plan, workers, results, normalise); return the summary (also what
    ``--json`` prints)."""
    opts = validate(args)
    data_info = resolve_data(opts.train)  # a bad --data is refused before any probe too
    load_start = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    options.pci_order()  # CUDA numbers the GPUs as nvidia-smi does, here and in every worker
    gpus = gpuinfo.query()  # the GPUs listed (nvidia-smi); the frameworks are probed in ``plan``
    # each batch size against the training set and the memory free, before any probe (the partial-batch rule)
    batches = options.validate(args, data_info.n_train, data_info.kind,
                               options.free_memory(args.device, bool(gpus.gpus)),
                               options.devices_free(args.device, bool(gpus.gpus), args.devices))
    p = plan(args, opts, gpus, load_start)
    normalise_error: KernelmapError | None = None
    with atomic_dir(opts.out, replace=args.replace) as tmp:
        ran = run_cases(args, opts, p, json.dumps(data_info.to_dict()), tmp)
        results = [c.entry(ran.notes) for c in ran.cases.values() if not c.failed]
        if not results:
            raise KernelmapError("nothing ran: " + "; ".join(dict.fromkeys(ran.failed)))
        parities, parity_failed = write_run(args, opts, p, ran, results, data_info, tmp, batches)
        if any(x != "clean" for x in opts.passes):
            normalise_error = normalise_captures(tmp)
    out = summary(opts.out, results, p.decisions, ran.notes, parities, parity_failed)
    if normalise_error is not None:
        raise KernelmapError(f"{opts.out}: the run is complete but normalising its captures failed: "
                             f"{normalise_error}; fix and rerun `kernelmap normalise {opts.out}`")
    # An explicit --device gpu that a framework cannot meet fails the run (after keeping what ran).
    out["exit_code"] = 3 if any(d.explicit for d in p.decisions.values()) or ran.failed else 0
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--framework", choices=(*frameworks.FRAMEWORKS, "all"), default="all")
    parser.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                        help="auto: the GPU where the framework can use it, else the CPU")
    parser.add_argument("--batch-size", type=int, nargs="+", default=[64], metavar="N")
    parser.add_argument("--devices", type=int, nargs="+", default=[1], metavar="N",
                        help="devices each case trains on, data-parallel (one case per value): the same global batch "
                             "(--batch-size, a multiple of N) and data order at every N, each device its slice "
                             "(docs/DEVICES.md); GPUs on the GPU, N processes/contexts/host devices on the CPU")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--steps", type=int, default=100, help="timed training steps (default 100)")
    length.add_argument("--epochs", type=int, help="train whole epochs instead of --steps")
    parser.add_argument("--warmup", type=int, default=5, help="untimed warm-up steps (default 5)")
    parser.add_argument("--data", default="auto", metavar="auto|fashion-mnist|mnist|synthetic|DIR")
    parser.add_argument("--data-dir", help="directory of the IDX files for --data mnist/fashion-mnist")
    parser.add_argument("--out", help="run directory (default runs/<UTC timestamp>)")
    parser.add_argument("--profile", choices=tuple(PROFILES), default="none", help="capture passes after the clean one")
    parser.add_argument("--mode", action="extend", nargs="+", choices=frameworks.mode_choices(), metavar="MODE",
                        help="execution modes to run, each in the frameworks that have it (a framework with none of "
                             "them runs its default, the first); all: every mode of every framework; modes that need "
                             "a GPU are skipped on the CPU with a note. Modes: " + "; ".join(
                                 f"{d.name} {m}" + (f" ({d.mode_help[m]})" if m in d.mode_help else "")
                                 for d in frameworks.REGISTRY.values() for m in d.modes))
    for d in frameworks.REGISTRY.values():  # older switches that name one mode (--hybridize)
        for flag, mode in d.mode_flags.items():
            parser.add_argument(flag, dest="mode", action="append_const", const=mode, help=f"the same as --mode {mode}")
    for d in frameworks.REGISTRY.values():  # each framework's own options (registry.Option)
        for o in d.options:
            parser.add_argument(o.flag, dest=o.name, choices=o.choices, help=f"{d.label}: {o.help}")
    parser.add_argument("--math", choices=[m.value for m in Math], nargs="+", default=[MATH_DEFAULT.value],
                        metavar="MATH",
                        help="the math of every framework's convs and matmuls, one case per value: fp32 (TF32 off "
                             "everywhere, the default: like with like), tf32 (TF32 allowed everywhere; the GPU only), "
                             "bf16 or fp16 (mixed precision, fp32 master weights; fp16 with loss scaling: "
                             "docs/MIXED_PRECISION.md). A framework that cannot run one on its device skips that "
                             "case with a note")
    parser.add_argument("--replace", action="store_true", help="replace an existing --out")
    parser.add_argument("--trials", type=int, default=timing.DEFAULT_TRIALS,
                        help=f"independent clean-pass processes per framework x batch size (default {timing.DEFAULT_TRIALS})")
    parser.add_argument("--max-repeats", type=int, default=DEFAULT_MAX_REPEATS, metavar="N",
                        help="extra clean trials of a framework x batch size whose trials ran under contention or "
                             "disagree beyond noise, or that a capture pass outran beyond noise "
                             f"(default {DEFAULT_MAX_REPEATS})")
    parser.add_argument("--repeat-budget", type=float, metavar="SECONDS",
                        help="wall time the extra trials may take (default: "
                             f"{REPEAT_BUDGET_SHARE * 100:.0f}%% of the run's time before them)")
    parser.add_argument("--stall-limit", type=stall.seconds, metavar="SECONDS",
                        help="seconds a worker may run before its threads' stacks are taken and it is killed, its "
                             "case failed (0: no limit; default: 10 minutes plus a share per step it runs, "
                             "kernelmap/stall.py)")
    parser.add_argument("--threads", type=int, metavar="N",
                        help="CPU threads of every framework (OMP/MKL); default: the physical cores")
    parser.add_argument("--python", action="append", default=[], metavar="FRAMEWORK=PATH",
                        help="interpreter of that framework's workers (else $KERNELMAP_PYTHON_<FRAMEWORK>, else this "
                             "one): frameworks whose dependencies clash live in environments of their own")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def main(args: argparse.Namespace) -> int:
    summary = execute(args)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_table(summary)
    return summary["exit_code"]
