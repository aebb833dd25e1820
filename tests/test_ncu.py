"""The Nsight Compute CSV adapter (kernelmap/adapters/ncu.py) on two real captures of one PyTorch training step
(tests/data/ncu/README.md: H200, ncu 2025.3.1, bs 64, bf16 and fp16): kernel counts and metric totals against a
reader of our own here (the stdlib csv module, read by column name), the metric set against gh100's list, and
bad input refused with the file and line."""

from __future__ import annotations

import csv
import io
import lzma
from pathlib import Path

import pandas as pd
import pytest

from kernelmap.adapters import ncu
from kernelmap.errors import ParseError

DATA = Path(__file__).parent / "data" / "ncu"
BF16, FP16 = DATA / "ncu-torch-bf16.csv.xz", DATA / "ncu-torch-fp16.csv.xz"


def _stdlib(path: Path) -> tuple[list[str], list[str], list[list[str]]]:
    """(header, units, kernel rows) of an ncu raw CSV: the rows after the line that starts with "ID"."""
    text = lzma.open(path, "rt").read()
    rows = list(csv.reader(io.StringIO(text)))
    h = next(i for i, r in enumerate(rows) if r[:2] == ["ID", "Process ID"])
    return rows[h], rows[h + 1], rows[h + 2:]


def _total(path: Path, metric: str) -> float:
    header, _, rows = _stdlib(path)
    i = header.index(metric)
    return sum(float(r[i].replace(",", "")) for r in rows)


@pytest.mark.parametrize("path,kernels,dur_ns", [(BF16, 31, 186_560), (FP16, 37, 218_816)])
def test_counts_and_totals_match_stdlib(path, kernels, dur_ns):
    df = ncu.read(path)
    header, units, rows = _stdlib(path)
    assert len(df) == len(rows) == kernels
    assert list(df["id"]) == [int(r[0]) for r in rows] == list(range(kernels))  # profiling (launch) order
    assert list(df["kernel_name"]) == [r[header.index("Kernel Name")] for r in rows]
    assert df["duration_ns"].sum() == _total(path, "gpu__time_duration.sum") == dur_ns
    present = {m: c for m, c in {**ncu.METRICS, **ncu.ALIASES}.items() if m in header}
    for metric, col in present.items():
        assert df[col].sum() == pytest.approx(_total(path, metric), rel=1e-12), metric
    assert df.attrs["lines_skipped"] == 3 and df.attrs["profiler_messages"] == []
    assert set(df["passes"]) == {5}
    assert df["unmeasured"].isna().all()


def test_exact_totals_of_the_bf16_step():
    """Figures read off the capture (README): conv2 fwd's tensor ops equal its shape's FLOPs exactly."""
    df = ncu.read(BF16)
    assert df["tensor_ops_bf16"].sum() == 515_112_960
    assert df["ffma"].sum() == 29_766_149
    assert df["dram_read_bytes"].sum() == 29_817_344 and df["dram_write_bytes"].sum() == 8_192
    conv2 = df[df["kernel_name"].str.contains("bf16_s16816fprop")]
    assert len(conv2) == 1 and conv2["tensor_ops_bf16"].iloc[0] == 2 * 64 * 64 * 14 * 14 * 32 * 9
    fc1 = df[df["kernel_name"].str.startswith("nvjet_sm90_tst")]
    assert fc1["tensor_ops_bf16"].iloc[0] == 2 * 64 * 128 * 3200  # K 3136 padded to 3200


def test_missing_metrics_are_named_not_guessed():
    """gh100 has no sm__ops_path_tensor_src_fp16_dst_fp32 (the probe asked for it): ncu left the column out, so
    the fp16 tensor-core count of the fp16 step is unknown, and said so."""
    for path in (BF16, FP16):
        df = ncu.read(path)
        assert df.attrs["missing_metrics"] == ["sm__ops_path_tensor_src_fp16.sum",
                                               "sm__inst_executed_pipe_tensor_op_hmma_type_hfma2.sum"]
        assert df["tensor_ops_fp16"].isna().all()
    f = ncu.flops(ncu.read(FP16))
    tensor_kernels = ncu.read(FP16)["kernel_name"].str.contains("tensorop_f16|nvjet_sm90_hsh")
    assert tensor_kernels.sum() == 3
    assert set(f.loc[tensor_kernels, "math"]) == {ncu.MATH_UNKNOWN}


def test_math_per_kernel_from_counters():
    df = ncu.read(BF16)
    f = ncu.flops(df)

    def math_of(mark: str) -> set[str]:
        return set(f.loc[df["kernel_name"].str.contains(mark, regex=False), "math"])

    assert math_of("bf16_s16816fprop") == math_of("nvjet_sm90_tst") == math_of("wmma_tensorop_bf16") == {"bf16"}
    # conv1 fwd: CUDA-core FFMA, and a tensor metric missing with tensor-pipe instructions counted: unknown
    assert math_of("implicit_convolve_sgemm") == {ncu.MATH_UNKNOWN}
    # the optimizer's fp32 kernels: no tensor-pipe instruction at all, so the missing fp16 count cannot matter
    assert f.loc[df["kernel_name"].str.contains("multi_tensor_apply"), "math"].eq("fp32").all()
    assert (f["math"] == "bf16").sum() == 3


def test_kernel_math_rules():
    base = {"flops_tensor_tf32": 0.0, "flops_tensor_bf16": 0.0, "flops_tensor_fp16": 0.0,
            "flops_fp32": 0.0, "flops_half": 0.0}
    assert ncu.kernel_math(base) == ncu.MATH_NONE
    assert ncu.kernel_math({**base, "flops_tensor_tf32": 1e9, "flops_fp32": 1e7}) == "tf32"  # epilogue < 10%
    assert ncu.kernel_math({**base, "flops_tensor_tf32": 1e9, "flops_fp32": 2e8}) == ncu.MATH_MIXED
    assert ncu.kernel_math({**base, "flops_fp32": 5.0}) == "fp32"
    assert ncu.kernel_math({**base, "flops_tensor_fp16": None, "flops_fp32": 5.0}, mma_inst=3) == ncu.MATH_UNKNOWN
    assert ncu.kernel_math({**base, "flops_tensor_fp16": None, "flops_fp32": 5.0}, mma_inst=0) == "fp32"
    # FP32 and half precision whose instructions were all HADD (HADD2.F32 converts fp16 to fp32): said apart
    fp32_half = {**base, "flops_fp32": 4e5, "flops_half": 3.2e6}
    assert ncu.kernel_math(fp32_half, 0, half_adds_only=True) == ncu.MATH_FP32_HADD
    assert ncu.kernel_math(fp32_half, 0) == ncu.MATH_MIXED  # HFMA or HMUL among them
    assert ncu.kernel_math({**base, "flops_half": 3.2e6}, 0, half_adds_only=True) == ncu.MATH_HALF
    assert ncu.kernel_math({**fp32_half, "flops_tensor_fp16": 1e6}, 5, half_adds_only=True) == ncu.MATH_MIXED


def test_pass_metrics_exist_on_gh100():
    names = set(lzma.open(DATA / "gh100-metric-names.txt.xz", "rt").read().split())
    assert len(names) == 3523
    base = {m.split(".")[0] for m in ncu.PASS_METRICS}
    assert base <= names, base - names
    # the probe's two names that gh100 lacks (why its fp16 step has no fp16 tensor count)
    assert "sm__ops_path_tensor_src_fp16_dst_fp32" not in names and "sm__ops_path_tensor_src_fp16" in names


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "bad.csv"
    p.write_text(text)
    return p


def test_bad_input_names_file_and_line(tmp_path):
    header, units, rows = _stdlib(BF16)

    def line(r):
        return ",".join(f'"{x}"' for x in r)

    with pytest.raises(ParseError, match="no ncu CSV header"):
        ncu.read(_write(tmp_path, "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission\n"))
    short = rows[1][:-3]
    with pytest.raises(ParseError, match=r"bad\.csv:4: a kernel row of") as e:
        ncu.read(_write(tmp_path, "\n".join([line(header), line(units), line(rows[0]), line(short)])))
    assert e.value.line == 4
    units2 = list(units)
    units2[header.index("gpu__time_duration.sum")] = "fortnight"
    with pytest.raises(ParseError, match="unit 'fortnight'"):
        ncu.read(_write(tmp_path, "\n".join([line(header), line(units2), line(rows[0])])))


def test_unmeasured_value_is_na_and_named(tmp_path):
    header, units, rows = _stdlib(BF16)
    r = list(rows[3])
    r[header.index("dram__bytes_read.sum")] = "n/a"
    p = _write(tmp_path, "==WARNING== a replay of kernel 3 failed\n" + "\n".join(
        ",".join(f'"{x}"' for x in x_) for x_ in (header, units, rows[2], r)))
    df = ncu.read(p)
    assert pd.isna(df["dram_read_bytes"].iloc[1]) and df["dram_read_bytes"].iloc[0] == 205_824
    assert df["unmeasured"].iloc[1] == "dram__bytes_read.sum=n/a" and pd.isna(df["unmeasured"].iloc[0])
    assert df.attrs["profiler_messages"] == ["==WARNING== a replay of kernel 3 failed"]


def test_flops_lower_bound_where_a_kind_was_not_measured():
    df = ncu.read(BF16)
    f = ncu.flops(df)
    conv2 = df["kernel_name"].str.contains("bf16_s16816fprop")
    # conv2 ran tensor instructions and the fp16 tensor count is missing: its FLOPs are a lower bound
    assert f.loc[conv2, "flops"].iloc[0] == 462_422_016 + f.loc[conv2, "flops_fp32"].iloc[0]
    assert not f.loc[conv2, "flops_complete"].iloc[0]
    opt = df["kernel_name"].str.contains("multi_tensor_apply")
    assert f.loc[opt, "flops_complete"].all()  # no tensor instruction: nothing unmeasured could have run
    assert f["flops_half"].sum() == 4 * 7_945_472  # HFMA x4 (a packed pair), no HADD/HMUL in the bf16 step
    assert f["flops"].sum() == pytest.approx(515_112_960 + 2 * 29_766_149 + 4 * 7_945_472
                                             + df["fadd"].sum() + df["fmul"].sum())


def test_hfma2_mma_moves_do_not_make_a_kernel_half_precision():
    """Where HFMA2.MMA was measured, the HFMA it explains (32 a warp instruction) is not math for the kind: a copy
    kernel of the probe (4 tensor-pipe instructions, 128 HFMA, nothing else) is 'none' with it, 'unknown' without."""
    df = ncu.read(BF16).iloc[[0]].reset_index(drop=True)
    assert (df["hfma"].iloc[0], df["tensor_pipe_hmma_inst"].iloc[0]) == (128, 4)
    assert ncu.flops(df)["math"].iloc[0] == ncu.MATH_UNKNOWN
    measured = df.assign(tensor_pipe_hfma2_inst=pd.array([4.0], dtype="Float64"),
                         tensor_ops_fp16=pd.array([0.0], dtype="Float64"))
    f = ncu.flops(measured)
    assert f["math"].iloc[0] == ncu.MATH_NONE and f["flops_half"].iloc[0] == 512  # ncu's own count stays
    fewer = measured.assign(tensor_pipe_hfma2_inst=pd.array([2.0], dtype="Float64"))  # 64 HFMA left unexplained
    assert ncu.flops(fewer)["math"].iloc[0] == ncu.MATH_HALF
