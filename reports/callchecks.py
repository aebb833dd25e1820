"""The ``library calls per step`` self-check (``checks.py`` runs it).

On the GPU, the cuDNN convolution calls per step of each conv layer
(library-call table, ``analysis.library_calls``) equal the model's: one forward, one filter-gradient
and one data-gradient call per step, none for the first conv layer's data gradient (its input needs
none) (``expected_library_calls_per_step``). Warm-up and autotuning calls are not the model's: where
the steps of the calls are known (the libs pass's own trace, XLA's own calls) they are counted
apart; where they are not (an older run: every logged call over the logged steps) the check still
applies and fails where the framework's autotuning adds calls. A framework x batch size without cuDNN
convolution calls (the CPU) is not checked. A case on N devices driven by one process (MXNet's contexts: its
cuDNN log holds every device's calls) makes the model's calls once per device: N times the counts
(``logged_devices``); one process per device logs its own rank's.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import pandas as pd
from kernelmap.frameworks.spec import LAYERS

from kernelmap import frameworks

from .analyses.base import Run, case_of, field_at, replay_reason
from .checkrows import FAIL, NOT_CHECKED, PASS, Check, check_row

CONV_CALL_DIRECTIONS = ("fwd", "bwd_data", "bwd_weight")
CONV_LIBRARY = "cuDNN"


def expected_library_calls_per_step(layers: Iterable = LAYERS) -> dict[tuple[str, str], int]:
    """(conv layer, direction) -> cuDNN convolution calls per training step: a forward, a filter-gradient
    and a data-gradient call per conv layer, but no data gradient for the first layer (the model's input
    needs none)."""
    convs = [x.name for x in layers if x.kind == "conv2d"]
    return {(name, d): 0 if (d == "bwd_data" and i == 0) else 1
            for i, name in enumerate(convs) for d in CONV_CALL_DIRECTIONS}


def library_call_checks(run: Run, libcalls: pd.DataFrame) -> list[dict[str, Any]]:
    """``library calls per step`` of every framework x batch size with cuDNN convolution calls."""
    rows: list[dict[str, Any]] = []
    expected = expected_library_calls_per_step()
    conv = libcalls[(libcalls["run"] == run.name) & (libcalls["canonical_op"] == "conv2d")
                    & (libcalls["library"] == CONV_LIBRARY)]
    have = set(zip(conv["framework"], conv["batch_size"], strict=True))
    for r in run.results:
        fw, bs = case_of(r), field_at(r, "batch_size")
        if (fw, bs) not in have:
            rows.append(check_row(run.name, fw, bs, Check.LIBRARY_CALLS, "cuDNN convolution calls", None, None,
                             NOT_CHECKED, f"no {CONV_LIBRARY} convolution call recorded (device: "
                                          f"{field_at(r, 'device') or 'unknown'})"))
    for (fw, bs), g in conv.groupby(["framework", "batch_size"], dropna=False):
        bs_v = None if pd.isna(bs) else int(bs)
        per, said = logged_devices(run, fw, bs_v, g)
        # calls counted in their steps where there are any (XLA's own; log calls owned in the libs pass's
        # trace): another pass's log of the same calls (JAX's libs pass) is not counted twice
        if g["calls_outside_steps"].notna().any():
            g = g[g["calls_outside_steps"].notna()]
        replay = replay_reason(run, str(fw))
        for (layer, d), n in expected.items():
            sub = g[(g["layer"] == layer) & (g["direction"] == d)]
            if replay:  # no call per step to count: the calls of the capture, one set per layer and direction
                got = int(sub["logged_calls"].sum())
                rows.append(check_row(run.name, fw, bs_v, Check.LIBRARY_CALLS, f"{layer} {d}", n, None,
                                 PASS if (got > 0) == (n > 0) else FAIL,
                                 f"replays CUDA graphs ({replay}): checked that the capture made "
                                 f"{'calls' if n else 'no call'} of this layer and direction: {got} logged"))
                continue
            if sub["calls_per_step"].isna().any():
                rows.append(check_row(run.name, fw, bs_v, Check.LIBRARY_CALLS, f"{layer} {d}", n, None, NOT_CHECKED,
                                 "; ".join(sorted(set(sub["basis"].astype(str))))))
                continue
            got, n = float(sub["calls_per_step"].sum()), n * per
            outside = sub["calls_outside_steps"].dropna()
            calls = ", ".join(f"{c} {v:.4g}/step" for c, v in zip(sub["library_call"], sub["calls_per_step"],
                                                                    strict=True)) or "no call"
            apart = f"; {int(outside.sum())} call(s) outside the steps counted apart" if len(outside) and outside.sum() else ""
            basis = "; ".join(sorted(set(sub["basis"].astype(str)))) or "no call of this layer and direction"
            rows.append(check_row(run.name, fw, bs_v, Check.LIBRARY_CALLS, f"{layer} {d}", n, got,
                             PASS if math.isclose(got, n) else FAIL, f"{calls}{apart}; {basis}{said}"))
    return rows


def logged_devices(run: Run, case: str, bs: int | None, calls: pd.DataFrame) -> tuple[int, str]:
    """(devices whose calls ``calls`` hold, what the check's detail says of it): a case on N devices of one process
    (``DataParallel.processes`` False) whose calls come from a library log (not the framework's own trace, which
    XLA's calls are counted from) holds each device's: N; else 1."""
    r = next((x for x in run.results if case_of(x) == case and field_at(x, "batch_size") == bs), None)
    n = int(field_at(r, "devices") or 1) if r is not None else 1
    d = frameworks.REGISTRY.get(field_at(r, "framework")) if r is not None else None
    if n < 2 or d is None or d.data_parallel is None or d.data_parallel.processes:
        return 1, ""
    own = {x.trace_source for x in frameworks.REGISTRY.values()}  # XLA's calls: counted from its own trace
    sources = {x for v in calls["sources"].dropna().astype(str) for x in v.split("/") if x}
    if not sources or sources & own:
        return 1, ""
    return n, f"; {n} devices in one process's log: the model's calls once per device"
