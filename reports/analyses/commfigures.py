"""A report's communication figures (issue 39), computed once per report (``of``) and handed down: the CSV tables
(``tables``), the scaling table, the merged timelines' figures (``reports/rankfigure.py``) and the self-checks
(``reports/commchecks.py``) read them here and never compute them again. DataFrames only."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from kernelmap.commlink import NCCL_LOG_COLUMNS

from .comm import (
    ARRIVAL_COLUMNS,
    COLLECTIVE_COLUMNS,
    COLUMNS,
    INDEPENDENT_COLUMNS,
    arrivals,
    collectives,
    independent,
    nccl,
    per_case,
    per_step,
    with_logged_algorithms,
)
from .ranks import RankTimeline, rank_timeline
from .scaling import scaling


@dataclass(frozen=True)
class CommFigures:
    """Every run's communication figures, by run name (a run without records has none but its timeline)."""

    steps: dict[str, pd.DataFrame]  # comm.per_step of the run's records
    arrivals: dict[str, pd.DataFrame]  # comm.arrivals
    independent: dict[str, pd.DataFrame]  # comm.independent: the exposed communication against the step without
    timelines: dict[str, RankTimeline]  # ranks.rank_timeline: the merged timeline of the run's ranks (every run)
    scaling: pd.DataFrame  # scaling.scaling of every run


def of(runs: list) -> CommFigures:
    """``CommFigures`` of ``runs`` (``analyses.base.Run``): ``comm.per_step`` once per run, the rest from it."""
    have = [r for r in runs if r.records is not None]
    steps = {r.name: per_step(r.records) for r in have}
    arrived = {r.name: arrivals(r.records) for r in have}
    return CommFigures(steps=steps, arrivals=arrived,
                       independent={r.name: independent(r.records, r.results, steps[r.name]) for r in have},
                       timelines={r.name: rank_timeline(r.records, arrived=arrived.get(r.name)) for r in runs},
                       scaling=scaling(runs, steps))


def tables(runs: list, figures: CommFigures) -> dict[str, pd.DataFrame]:
    """The report's CSV tables of ``runs`` (``figures``: theirs): ``comm_steps`` (``per_step``), ``comm_cases``
    (``per_case``), ``comm_arrivals``, ``comm_independent``, ``comm_collectives`` and ``comm_nccl``, each row's
    ``run`` the run directory's name, ``case`` its case folder."""
    steps = [figures.steps[r.name].rename(columns={"run": "case"}).assign(run=r.name)
             for r in runs if r.records is not None]
    steps = [s for s in steps if len(s)]
    if not steps:
        return {"comm_steps": pd.DataFrame(columns=["run", "case", *COLUMNS[1:]]),
                "comm_cases": pd.DataFrame(columns=["run", "case"]),
                "comm_arrivals": pd.DataFrame(columns=["run", "case", *ARRIVAL_COLUMNS[1:]]),
                "comm_independent": pd.DataFrame(columns=INDEPENDENT_COLUMNS),
                "comm_collectives": pd.DataFrame(columns=["run", "case", *COLLECTIVE_COLUMNS[1:]]),
                "comm_nccl": pd.DataFrame(columns=["run", "case", "framework", "rank", *NCCL_LOG_COLUMNS])}
    all_steps = pd.concat(steps, ignore_index=True)
    cases = pd.concat([per_case(s.drop(columns=["run"]).rename(columns={"case": "run"}))
                       .rename(columns={"run": "case"}).assign(run=s["run"].iloc[0]) for s in steps], ignore_index=True)
    order = lambda df: df[["run", "case", *[c for c in df.columns if c not in ("run", "case")]]]  # noqa: E731
    arrived = pd.concat([figures.arrivals[r.name].rename(columns={"run": "case"}).assign(run=r.name)
                         for r in runs if r.records is not None], ignore_index=True)
    checked = pd.concat([figures.independent[r.name].assign(run=r.name)
                         for r in runs if r.records is not None], ignore_index=True)
    logged = pd.concat([nccl(r).assign(run=r.name) for r in runs], ignore_index=True)
    each = pd.concat([with_logged_algorithms(collectives(r.records).rename(columns={"run": "case"}),
                                             logged[logged["run"] == r.name]).assign(run=r.name)
                      for r in runs if r.records is not None], ignore_index=True)
    return {"comm_steps": order(all_steps), "comm_cases": order(cases), "comm_arrivals": order(arrived),
            "comm_independent": order(checked), "comm_collectives": order(each), "comm_nccl": order(logged)}
