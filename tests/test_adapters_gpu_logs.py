"""cuDNN / cuBLAS / cuBLASLt log adapters against the runner's H200 logs (tests/data/gpu_*.log.gz:
PyTorch bs64, libs pass of 1 warm-up + 3 steps, files whole; see tests/data/gpu_fixtures.json)."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest

from kernelmap.adapters import cublas_log, cublaslt_log, cudnn_log, detect
from kernelmap.errors import ParseError

DATA = Path(__file__).parent / "data"
CUDNN, CUBLAS, CUBLASLT = DATA / "gpu_cudnn.log.gz", DATA / "gpu_cublas.log.gz", DATA / "gpu_cublaslt.log.gz"


def _lines(p: Path) -> list[str]:
    return gzip.open(p, "rt").read().splitlines()


def test_cudnn_counts_each_execute_once():
    lines = _lines(CUDNN)
    heads = [i for i, ln in enumerate(lines) if ln == "I! CuDNN (v91900 56) function cudnnBackendExecute() called:"]
    returns = [i for i in heads if lines[i + 1].startswith("i!     status:")]
    df = cudnn_log.read(CUDNN)
    assert len(heads) == 40 and len(returns) == 20
    assert len(df) == len(heads) - len(returns)
    assert df.attrs["calls"]["cudnnBackendExecute"] == 20
    assert set(df["library_call"]) == {"cudnnBackendExecute"}
    assert (df["library"] == "cuDNN").all()


def test_cudnn_descriptors():
    df = cudnn_log.read(CUDNN)
    g = df.groupby(["op_name", "layer", "direction", "algo"]).size()
    # 4 steps x (conv1 fwd, conv2 fwd, conv2 dgrad, conv2 wgrad, conv1 wgrad); conv1 needs no dgrad
    assert g.to_dict() == {("CONVOLUTION_FORWARD", "conv1", "fwd", "eng28"): 4,
                           ("CONVOLUTION_FORWARD", "conv2", "fwd", "eng38"): 4,
                           ("CONVOLUTION_BACKWARD_DATA", "conv2", "bwd_data", "eng71"): 4,
                           ("CONVOLUTION_BACKWARD_FILTER", "conv2", "bwd_weight", "eng17"): 4,
                           ("CONVOLUTION_BACKWARD_FILTER", "conv1", "bwd_weight", "eng20"): 4}
    assert g.sum() == 20 and "conv1" not in df.loc[df["direction"].eq("bwd_data"), "layer"].tolist()
    fwd1 = df[df["layer"].eq("conv1") & df["direction"].eq("fwd")].iloc[0]
    assert fwd1["shapes"] == "[[64,1,28,28],[32,1,3,3],[64,32,28,28]]"
    assert set(df["math_mode"]) == {"tf32"}  # enable_tf32=true in every ExecuteInternal block
    # backward runs on the autograd thread
    assert df.loc[df["phase"].eq("backward"), "tid"].nunique() == 1
    assert df.loc[df["phase"].eq("backward"), "tid"].iloc[0] != df.loc[df["phase"].eq("forward"), "tid"].iloc[0]


V8_BLOCK = """I! CuDNN (v8902) function cudnnConvolutionForward() called:
i!     handle: type=cudnnHandle_t; streamId=0x0;
i!     xDesc: type=cudnnTensorDescriptor_t:
i!         dataType: type=cudnnDataType_t; val=CUDNN_DATA_FLOAT (0);
i!         nbDims: type=int; val=4;
i!         dimA: type=int; val=[64,32,14,14];
i!     wDesc: type=cudnnFilterDescriptor_t:
i!         dataType: type=cudnnDataType_t; val=CUDNN_DATA_FLOAT (0);
i!         dimA: type=int; val=[64,32,3,3];
i!     convDesc: type=cudnnConvolutionDescriptor_t:
i!         dataType: type=cudnnDataType_t; val=CUDNN_DATA_FLOAT (0);
i!         mathType: type=cudnnMathType_t; val=CUDNN_TENSOR_OP_MATH (1);
i!     algo: type=cudnnConvolutionFwdAlgo_t; val=CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM (1);
i! Time: 2024-01-02T03:04:05.123456 (0d+0h+0m+1s since start)
i! Process=77; Thread=78; GPU=0; Handle=0x1; StreamId=0x0 (defaultStream).

"""


def test_cudnn_v8_legacy_call(tmp_path):
    p = tmp_path / "x.log"
    p.write_text(V8_BLOCK * 2)
    assert detect(p) == "cudnn_log"
    df = cudnn_log.read(p)
    assert len(df) == 2
    r = df.iloc[0]
    assert (r["library_call"], r["canonical_op"], r["direction"], r["layer"]) == \
        ("cudnnConvolutionForward", "conv2d", "fwd", "conv2")
    assert r["algo"] == "CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM"
    assert r["math_mode"] == "tf32" and r["tid"] == 78 and r["start_ns"] % 10**9 == 123456000


def test_cudnn_bad_header_names_line(tmp_path):
    p = tmp_path / "x.log"
    p.write_text(V8_BLOCK + "I! CuDNN (vX) garbage\n")
    with pytest.raises(ParseError) as e:
        cudnn_log.read(p)
    assert e.value.line == V8_BLOCK.count("\n") + 1


def test_cublas_sgemm_count_and_dims():
    text = gzip.open(CUBLAS, "rt").read()
    df = cublas_log.read(CUBLAS)
    assert len(df) == len(re.findall(r"function cublasStatus_t cublasSgemm_v2\(", text)) == 16
    assert df.attrs["calls"]["cublasSetMathMode"] == text.count("function cublasStatus_t cublasSetMathMode(")
    g = df.groupby(["layer", "direction"]).size().to_dict()
    assert g == {("fc1", "bwd_data"): 4, ("fc1", "bwd_weight"): 4, ("fc2", "bwd_data"): 4, ("fc2", "bwd_weight"): 4}
    assert set(df["math_mode"]) == {"fp32"}  # MathMode=CUBLAS_DEFAULT_MATH on every call


def test_cublaslt_api_lines_counted_once():
    text = gzip.open(CUBLASLT, "rt").read()
    df = cublaslt_log.read(CUBLASLT)
    assert len(df) == text.count("[Api][cublasLtMatmul]") == 12
    assert df.attrs["internal_matmuls"] == text.count("[Trace][cublasLtSSSMatmul]")
    fwd = df[df["direction"].eq("fwd")]
    assert fwd.groupby(["layer", "algo"]).size().to_dict() == {("fc1", "55"): 4, ("fc2", "10"): 4}
    assert df["shapes"].notna().all()
    # the other 4: the batched matmul cuDNN's Winograd wgrad of conv2 runs through cuBLASLt (36 tiles,
    # 32 x 64 channels) -- no linear layer's shapes, so no layer/direction
    other = df[df["layer"].isna()]
    assert len(other) == 4 and set(other["shapes"]) == {"[[36,32,1024],[36,64,1024]]"}


def test_cublaslt_garbage_line(tmp_path):
    p = tmp_path / "lt.log"
    lines = _lines(CUBLASLT)[:5] + ["this is not a cublasLt line"]
    p.write_text("\n".join(lines))
    with pytest.raises(ParseError) as e:
        cublaslt_log.read(p)
    assert e.value.line == 6


@pytest.mark.parametrize("path,fmt", [(CUDNN, "cudnn_log"), (CUBLAS, "cublas_log"), (CUBLASLT, "cublaslt_log")])
def test_detect_by_content_not_name(tmp_path, path, fmt):
    renamed = tmp_path / "whatever.txt"
    renamed.write_bytes(path.read_bytes())
    assert detect(renamed) == fmt


def test_cudnn_stream_ids_as_the_legacy_api_logs_them():
    """MXNet calls cuDNN 9's legacy API, whose log ends the stream id with ';' (the first MXNet run on
    the H100 stopped on 'StreamId=0xd917110;'). Each form gives the stream the id names."""
    from kernelmap.adapters import cudnn_log

    def stream(text):
        body = [f"i! Process=1; Thread=2; GPU=0; Handle=0x55; StreamId={text}"]
        return cudnn_log._trailer("x.log", body, 0)["stream"]

    assert stream("0xd917110;") == 0xD917110
    assert stream("0xd917110.") == 0xD917110
    assert stream("0x7f3a2c0bd6a0 (defaultStream)") == 0x7F3A2C0BD6A0
    assert stream("0x0 (defaultStream).") == 0
    assert stream("0x0") == 0
    assert stream("(nil)") == 0
    assert stream("unknown") is None
