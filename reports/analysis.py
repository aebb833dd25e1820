"""Analyses of run directories: pure functions that return DataFrames and dicts.

Nothing here draws or formats HTML; ``figures`` and ``html`` only render what these return.
A run directory is read as docs/ARCHITECTURE.md lays it out (manifest.json, results.json,
parity.json, records.parquet, attribution.json); every file but manifest.json and results.json
is optional, and a section whose input is absent says so rather than guessing.

Time accounting (``timed_events``): records hold the same work seen by several sources (a
Kineto trace and an nsys capture both list the kernels). For each framework x batch size one
source is chosen to time from, in ``TRACE_SOURCES`` order, at the finest level it has: kernels
where the source has any (GPU), else the outermost framework ops (CPU, where ops nest).

The analyses live in ``reports/analyses/``, one module per topic (base, basis, summary, timed,
linked, ops, mix, launch, roofline, coverage, timeline). This module re-exports the names the
report's renderers use (``A.summary_table``), and only those: every name here is used elsewhere
(``tests/test_house.py``). A module may as well import a topic module directly."""

from __future__ import annotations

from .analyses.base import (  # noqa: F401
    PHASE_ORDER,
    Run,
    fw_label,
    load_run,
    passes_of,
    peak_flops,
)
from .analyses.coverage import (  # noqa: F401
    coverage,
    unlinked_library_kernels,
)
from .analyses.launch import (  # noqa: F401
    best_mode_lines,
    best_modes,
    launch_bound,
)
from .analyses.mix import (  # noqa: F401
    busy_share,
    kernel_counts,
    library_mix,
    profiler_overhead,
)
from .analyses.ops import (  # noqa: F401
    TIME_GAP,
    differences,
    layer_table,
    library_calls,
    op_table,
    op_time,
)
from .analyses.roofline import (  # noqa: F401
    roofline,
)
from .analyses.summary import (  # noqa: F401
    environment_table,
    framework_devices,
    parity_table,
    summary_table,
)
from .analyses.timed import (  # noqa: F401
    op_calls,
    timed_events,
)
from .analyses.timeline import (  # noqa: F401
    timeline_events,
)
