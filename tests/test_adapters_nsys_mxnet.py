"""nsys export of an MXNet run (a build with NVTX: one range per operator, on its engine thread),
made here as SQLite with nsys' own table layout (tests/data/gpu_nsys.sqlite.gz's columns): MXNet's
operators run after the host thread has left the kernelmap region that issued them, and their
ranges carry no shapes. So the layers come from the operators' positions in their step and the
phase from the name, else from the region before them (as the MXNet profiler adapter does)."""

from __future__ import annotations

import sqlite3

import pytest

from kernelmap.adapters import nsys

HOST, ENGINE = 1 << 24 | 11, 1 << 24 | 12  # globalTid: pid 1, two threads
# one step: the host's regions (it leaves each at once), then the engine thread's operators, later
REGIONS = [("kernelmap:step#{}", 0, 100), ("kernelmap:forward", 0, 5), ("kernelmap:backward", 5, 10),
           ("kernelmap:optimizer", 10, 15)]
OPS = [  # (name, start, end): every one after the host left the region that issued it
    ("Convolution", 20, 22), ("Activation", 22, 23), ("Convolution", 23, 25), ("FullyConnected", 26, 27),
    ("FullyConnected", 27, 28), ("_backward_FullyConnected", 40, 41), ("_backward_FullyConnected", 41, 42),
    ("_backward_Convolution", 43, 45), ("_backward_Convolution", 45, 47),
    ("MXImperativeInvoke", 47, 48),  # MXNet's C API: not an operator
    ("sgd_mom_update", 60, 61), ("_copyto", 62, 63),  # _copyto: its name says no phase
]
STEPS = (0, 1)
PERIOD = 10_000


def _db(path) -> None:
    con = sqlite3.connect(path)
    con.executescript("""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
        CREATE TABLE NVTX_EVENTS (start INTEGER, "end" INTEGER, eventType INTEGER, text TEXT, globalTid INTEGER,
                                  textId INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER, "end" INTEGER, globalTid INTEGER,
                                                  correlationId INTEGER, nameId INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, "end" INTEGER, streamId INTEGER,
                                                 correlationId INTEGER, globalPid INTEGER, demangledName INTEGER,
                                                 gridX INTEGER, gridY INTEGER, gridZ INTEGER, blockX INTEGER,
                                                 blockY INTEGER, blockZ INTEGER);
        INSERT INTO StringIds VALUES (1, 'cudaLaunchKernel'), (2, 'op_kernel');
    """)
    corr = 0
    for step in STEPS:
        t0 = step * PERIOD
        for name, a, b in REGIONS:
            con.execute("INSERT INTO NVTX_EVENTS VALUES (?, ?, 59, ?, ?, NULL)",
                        (t0 + 10 * a, t0 + 10 * b, name.format(step), HOST))
        for name, a, b in OPS:
            a, b = t0 + 10 * a, t0 + 10 * b
            con.execute("INSERT INTO NVTX_EVENTS VALUES (?, ?, 59, ?, ?, NULL)", (a, b, name, ENGINE))
            corr += 1  # one kernel per range, launched inside it
            con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?, 1)", (a + 1, a + 3, ENGINE, corr))
            con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 7, ?, ?, 2, 1, 1, 1, 32, 1, 1)",
                        (a + 3, b, corr, 1 << 24))
    con.commit()
    con.close()


@pytest.fixture(scope="module")
def df(tmp_path_factory):
    path = tmp_path_factory.mktemp("mx") / "mxnet.sqlite"
    _db(path)
    return nsys.read(path)


def test_operators_are_ops_and_the_api_is_not(df):
    assert set(df["framework"]) == {"mxnet"}
    ops = df[df["kind"].eq("op")]
    assert len(ops) == len(STEPS) * (len(OPS) - 1)
    assert not ops["op_name"].eq("MXImperativeInvoke").any()


def test_layers_by_position_within_each_step(df):
    ops = df[df["kind"].eq("op")].sort_values("start_ns")
    for name, want in (("Convolution", ["conv1", "conv2"]), ("FullyConnected", ["fc1", "fc2"]),
                       ("_backward_FullyConnected", ["fc2", "fc1"]), ("_backward_Convolution", ["conv2", "conv1"])):
        got = ops[ops["op_name"].eq(name)]
        assert got["layer"].tolist() == want * len(STEPS), name
        assert got["iteration"].tolist() == [s for s in STEPS for _ in want], name


def test_phase_by_name_else_the_region_before(df):
    ops = df[df["kind"].eq("op")].set_index("op_name")
    phase = {name: set(p) for name, p in ops.groupby(level=0)["phase"]}  # (pandas 3's agg makes sets lists)
    assert phase["Convolution"] == {"forward"}  # its name, though the host was in no region any more
    assert phase["_backward_Convolution"] == {"backward"}
    assert phase["sgd_mom_update"] == {"optimizer"}
    assert phase["_copyto"] == {"optimizer"}  # no phase in its name: the region it follows
    assert phase["Activation"] == {"forward"}


def test_kernels_take_their_operator_layer_phase_and_step(df):
    k = df[df["kind"].eq("kernel")].sort_values("start_ns")
    ops = df[df["kind"].eq("op")].sort_values("start_ns")
    assert len(k) == len(STEPS) * len(OPS)
    launched = k[k["canonical_op"].notna()]
    assert len(launched) == len(ops)  # every operator's kernel (the C API's kernel has none)
    for col in ("canonical_op", "layer", "phase", "iteration"):
        assert launched[col].tolist() == ops[col].tolist(), col
    conv = launched[launched["canonical_op"].isin(["conv2d", "linear"])]
    assert conv["layer"].notna().all()


def test_a_capture_range_cuts_the_whole_process_capture_to_it(tmp_path):
    """registry.NsysWindow.NVTX_RANGE: nsys recorded the whole process (step 0 stands for warm-up and
    autotuning), and the worker's ``kernelmap:capture`` range bounds the timed steps (step 1 here).
    Only rows that start inside the range are kept, and the range is no row of its own."""
    path = tmp_path / "mxnet.sqlite"
    _db(path)
    con = sqlite3.connect(path)
    lo, hi = PERIOD - 5, PERIOD + 10 * max(b for _, _, b in OPS) + 5  # step 1's regions and operators
    con.execute("INSERT INTO NVTX_EVENTS VALUES (?, ?, 59, 'kernelmap:capture', ?, NULL)", (lo, hi, HOST))
    con.commit()
    con.close()
    df = nsys.read(path)
    assert df["start_ns"].between(lo, hi).all()
    assert not df["op_name"].eq("kernelmap:capture").any()
    assert (df["kind"].eq("kernel").sum(), df["kind"].eq("op").sum()) == (len(OPS), len(OPS) - 1)
    assert set(df.loc[df["kind"].eq("op"), "iteration"]) == {1}


def test_two_capture_ranges_are_an_error_naming_the_file(tmp_path):
    path = tmp_path / "mxnet.sqlite"
    _db(path)
    con = sqlite3.connect(path)
    con.executemany("INSERT INTO NVTX_EVENTS VALUES (?, ?, 59, 'kernelmap:capture', ?, NULL)",
                    [(0, 10, HOST), (PERIOD, PERIOD + 10, HOST)])
    con.commit()
    con.close()
    with pytest.raises(nsys.ParseError, match="2 NVTX ranges named 'kernelmap:capture'") as exc:
        nsys.read(path)
    assert str(path) in str(exc.value)
