"""``kernelmap diff --html FILE`` (reports/diffcli.py's page) on the real H200 run of tests/data/gpu_replay_modes_run
(PyTorch cuda-graph and compile-graphs at bs 64, 20 traced steps each). The page is read back with the standard
library's HTML parser and held against the CSVs the same command wrote and against pyarrow's own rows; a planted
change (fc1's forward gemm 5 us slower in every step of a copy) must show on the page as a finding."""

from __future__ import annotations

import csv
import json
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kernelmap import cli

DATA = Path(__file__).parent / "data"
RUN = DATA / "gpu_replay_modes_run"
GRAPH, COMPILE = "pytorch-cuda-graph", "pytorch-compile-graphs"
PLANT_NS = 5000  # added to each of fc1's 20 forward gemms (one a step) of the copy's cuda-graph case


class Tables(HTMLParser):
    """Every <table>'s rows as lists of cell texts (``titles``: the heading above each), and every <p>'s text, as a
    browser would show them."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.titles: list[str] = []
        self.paragraphs: list[str] = []
        self._cell: list[str] | None = None
        self._p: list[str] | None = None
        self._h: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in ("h2", "h3"):
            self._h = []
        elif tag == "table":
            self.titles.append("".join(self._h))
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "p":
            self._p = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell))
            self._cell = None
        elif tag == "p" and self._p is not None:
            self.paragraphs.append("".join(self._p))
            self._p = None

    def handle_data(self, data):
        for buf in (self._cell, self._p, self._h):
            if buf is not None:
                buf.append(data)


def read_page(path: Path) -> Tables:
    t = Tables()
    t.feed(path.read_text())
    return t


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


def kernel_ns(run: Path, case: str) -> int:
    rows = pq.read_table(run / "records.parquet", columns=["framework", "source", "kind", "dur_ns"]).to_pylist()
    return sum(r["dur_ns"] for r in rows if r["framework"] == case and r["source"] == "kineto" and r["kind"] == "kernel")


def diff_page(tmp_path: Path, a: Path, b: Path, *sel: str) -> tuple[Tables, dict[str, list[dict[str, str]]]]:
    out = {n: tmp_path / f"{n}.csv" for n in ("kernels", "places", "findings")}
    page = tmp_path / "d.html"
    assert cli.main(["diff", str(a), str(b), *sel, "--html", str(page), "--csv", str(out["kernels"]),
                     "--places-csv", str(out["places"]), "--findings-csv", str(out["findings"])]) == 0
    return read_page(page), {n: read_csv(p) for n, p in out.items()}


def test_page_holds_every_row_of_the_csvs_and_the_conservation(tmp_path):
    t, rows = diff_page(tmp_path, RUN, RUN, "--case-a", "mode=cuda-graph", "--case-b", "mode=compile-graphs")
    places, kernels, place_f, step_f = t.tables
    assert [x.split(" (")[0] for x in t.titles] == ["By layer", "By kernel, ms per step", "place findings",
                                                    "step findings"]
    assert len(kernels) - 1 == len(rows["kernels"]) == 60 and len(places) - 1 == len(rows["places"])
    head = kernels[0]
    for cells, r in zip(kernels[1:], rows["kernels"], strict=True):  # the same rows, in the CSV's order
        got = dict(zip(head, cells, strict=True))
        assert [got[h] for h in ("where", "dir", "call", "kernel", "verdict", "status")] == \
            [r[c] for c in ("where", "direction", "library_call", "kernel", "verdict", "status")]
        for h, c in (("A ms", "a_ms"), ("B ms", "b_ms")):
            assert float(got[h]) == pytest.approx(float(r[c]), rel=5e-4, abs=1e-12)
    for cells, r in zip(places[1:], rows["places"], strict=True):
        assert cells[:2] == [r["where"], r["direction"]] and cells[head.index("verdict") - 2] == r["verdict"]
    a, b = kernel_ns(RUN, GRAPH), kernel_ns(RUN, COMPILE)
    assert (a, b) == (6624347, 4053744)
    assert sum(int(r["a_ns"]) for r in rows["kernels"]) == a and sum(int(r["b_ns"]) for r in rows["places"]) == b
    assert (f"conservation, A: the 60 kernel rows hold {a} ns and the {len(rows['places'])} place rows {a} ns of its "
            f"{a} ns of kernel time from kineto (100.0000%)") in t.paragraphs
    assert any(p.startswith("quiet machine A: gpu_replay_modes_run:pytorch-cuda-graph bs64 — kernel time from kineto, "
                            "20 steps") for p in t.paragraphs)
    e = next(r for r in json.loads((RUN / "results.json").read_text()) if r["mode"] == "cuda-graph")
    assert (f"   clean step {e['median_step_s'] * 1e3:.4f} ms, 95% CI [{e['ci95_low_s'] * 1e3:.4f}, "
            f"{e['ci95_high_s'] * 1e3:.4f}] over 1 trial(s)") in t.paragraphs
    text = (tmp_path / "d.html").read_text()
    assert "&lt;" in text and "<float" not in text  # kernel names' templates escaped
    # every finding of the CSV, with its cause, in the CSV's order
    assert len(place_f) - 1 + len(step_f) - 1 == len(rows["findings"])
    causes = [c[place_f[0].index("cause")] for c in place_f[1:]] + [c[step_f[0].index("cause")] for c in step_f[1:]]
    assert causes == [r["cause"] for r in rows["findings"]]


def planted_copy(tmp_path: Path) -> tuple[Path, Path]:
    """Two copies of the run (a, b); b's cuda-graph fc1 forward gemm PLANT_NS slower in each of its 20 steps."""
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(RUN, a)
    shutil.copytree(RUN, b)
    t = pq.read_table(b / "records.parquet")
    cols = t.select(["framework", "source", "kind", "layer", "direction", "dur_ns"]).to_pylist()
    hit = [r["framework"] == GRAPH and r["source"] == "kineto" and r["kind"] == "kernel" and r["layer"] == "fc1"
           and r["direction"] == "fwd" for r in cols]
    assert sum(hit) == 20
    dur = [r["dur_ns"] + PLANT_NS if h else r["dur_ns"] for r, h in zip(cols, hit, strict=True)]
    i = t.schema.get_field_index("dur_ns")
    pq.write_table(t.set_column(i, t.schema.field(i), pa.array(dur, type=t.schema.field(i).type)),
                   b / "records.parquet")
    return a, b


def test_a_planted_change_shows_as_a_finding_on_the_page(tmp_path):
    a, b = planted_copy(tmp_path)
    for other, planted in ((a, False), (b, True)):
        t, rows = diff_page(tmp_path, a, other, "--case", "mode=cuda-graph")
        if not planted:  # a run against itself: no place is faster on either side, so nothing to find
            assert [x.split(" (")[0] for x in t.titles] == ["By layer", "By kernel, ms per step"]
            assert "none" in t.paragraphs and rows["findings"] == []
            continue
        place_f = t.tables[t.titles.index("place findings (1 beyond noise, 0 noise or not judged)")]
        head = place_f[0]
        found = [dict(zip(head, c, strict=True)) for c in place_f[1:] if c[head.index("call")] == "finding"]
        assert len(found) == 1, found
        f = found[0]
        assert (f["case"], f["layer (op)"], f["direction"]) == ("b:pytorch-cuda-graph bs64", "fc1", "fwd")
        assert float(f["saves ms/step"]) == pytest.approx(PLANT_NS / 1e6)
        assert "sm80_xmma_gemm" in f["cause"] and "via cublasLtMatmul" in f["cause"]
        r = [x for x in rows["kernels"] if (x["where"], x["direction"]) == ("fc1", "fwd")
             and x["kernel"].startswith("sm80_xmma_gemm")]
        assert [x["verdict"] for x in r] == ["slower"]
        assert int(r[0]["b_ns"]) - int(r[0]["a_ns"]) == 20 * PLANT_NS
        assert sum(int(x["b_ns"]) for x in rows["kernels"]) == kernel_ns(b, GRAPH) == 6624347 + 20 * PLANT_NS


@pytest.mark.parametrize("bad", ["file/d.html", "dir", "csv-twice"])
def test_a_bad_output_path_is_an_error_naming_it_and_nothing_is_written(tmp_path, capsys, bad):
    (tmp_path / "file").write_text("x")
    (tmp_path / "dir").mkdir()
    good = tmp_path / "k.csv"
    page = good if bad == "csv-twice" else tmp_path / bad
    argv = ["diff", str(RUN), str(RUN), "--case-a", "mode=cuda-graph", "--case-b", "mode=compile-graphs",
            "--csv", str(good), "--html", str(page)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert str(page) in err
    assert not good.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["dir", "file"]
    assert (tmp_path / "file").read_text() == "x" and not any((tmp_path / "dir").iterdir())


def test_an_error_after_reading_leaves_no_page(tmp_path, capsys):
    """A side that cannot be picked (the check runs after the paths'): no page, no CSV, no partial file."""
    page = tmp_path / "d.html"
    assert cli.main(["diff", str(RUN), str(RUN), "--case", "mode=nope", "--html", str(page)]) == 2
    assert "no case matches" in capsys.readouterr().err and list(tmp_path.iterdir()) == []
