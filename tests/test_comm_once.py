"""A report computes each run's communication figures once (``analyses/commfigures.py``) and hands them to the
tables, the scaling table, the merged timeline's figure and the self-checks: ``comm.per_step``, ``comm.arrivals``,
``ranks.rank_timeline`` and ``scaling.scaling`` are each called once per report of one run (they were called up to
five times), and the report's tables are those the figures computed one by one give."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pandas as pd
from kernelmap.reports import cli as RC
from kernelmap.reports import commchecks
from kernelmap.reports.analyses import comm, commfigures, ranks, scaling
from kernelmap.reports.analyses.base import load_run

from kernelmap.normalise import normalise_run_dir

DATA = Path(__file__).parent / "data"


def test_a_report_computes_the_communication_figures_once(tmp_path, monkeypatch):
    run = tmp_path / "run"
    shutil.copytree(DATA / "cpu_devices_run", run)
    normalise_run_dir(run)
    calls: Counter = Counter()

    def counted(name, f):
        def wrapper(*a, **k):
            calls[name] += 1
            return f(*a, **k)
        return wrapper

    # every module that holds one of them by name
    for name, owner, holders in (("per_step", comm, (comm, commfigures, scaling)),
                                 ("arrivals", comm, (comm, commfigures, ranks)),
                                 ("rank_timeline", ranks, (ranks, commfigures)),
                                 ("scaling", scaling, (scaling, commfigures))):
        wrapped = counted(name, getattr(owner, name))
        for m in holders:
            monkeypatch.setattr(m, name, wrapped)
    _, checks = RC.build([str(run)], tmp_path / "rep")
    assert calls == {"per_step": 1, "arrivals": 1, "rank_timeline": 1, "scaling": 1}
    # the checks the report made from them are the ones a run's own figures give
    mine = pd.DataFrame(commchecks.comm_checks(load_run(str(run))))
    got = checks[checks["check"].isin(set(mine["check"]))].reset_index(drop=True)
    pd.testing.assert_frame_equal(got[mine.columns], mine, check_dtype=False)
