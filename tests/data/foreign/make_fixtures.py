"""Make the fixtures of tests/data/foreign/ (README.md there names each source and its licence).

    python tests/data/foreign/make_fixtures.py HTA_CHECKOUT_DIR     # the public traces, trimmed
    python tests/data/foreign/make_fixtures.py --cpu-checkpoint     # the CPU recompute trace (torch)
    python tests/data/foreign/make_fixtures.py --tracelens TRACELENS_CHECKOUT_DIR

Trimming keeps whole steps: the chosen ``ProfilerStep#N`` (its CPU span), every host event that
starts inside it, the device events launched from it (their ``correlation``), the GPU copy of the
step, and all metadata; numbers are written with their original text (read as Decimal)."""

from __future__ import annotations

import decimal
import gzip
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).parent
_DEC = re.compile(r'"__DEC__([-0-9.eE+]+)__"')


def load(path: Path):
    b = path.read_bytes()
    if b[:2] == b"\x1f\x8b":
        b = gzip.decompress(b)
    return json.loads(b, parse_float=decimal.Decimal)


def dump(doc, path: Path) -> None:
    def enc(o):
        if isinstance(o, decimal.Decimal):
            return f"__DEC__{o}__"
        raise TypeError(type(o))

    text = _DEC.sub(r"\1", json.dumps(doc, default=enc, separators=(",", ":")))
    path.write_bytes(gzip.compress(text.encode(), 9, mtime=0))


def trim_to_step(doc: dict, step: int) -> dict:
    ev = doc["traceEvents"]
    name = f"ProfilerStep#{step}"
    cpu = [e for e in ev if e.get("ph") == "X" and e.get("name") == name and e.get("cat") == "user_annotation"]
    (s,) = cpu
    t0, t1 = s["ts"], s["ts"] + s["dur"]
    dev_cats = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset", "gpu_user_annotation"}
    host = [e for e in ev if e.get("ph") == "X" and e.get("cat") not in dev_cats and t0 <= e["ts"] < t1]
    corr = {(e.get("args") or {}).get("correlation") for e in host} - {None}
    keep = set(map(id, host))
    for e in ev:
        if e.get("ph") == "M" or (e.get("ph") == "X" and e.get("cat") in dev_cats and (
                (e.get("args") or {}).get("correlation") in corr or e.get("name") == name)):
            keep.add(id(e))
    return {**doc, "traceEvents": [e for e in ev if id(e) in keep]}


def trim_head(doc: dict, device_cat: str, n: int) -> dict:
    """A trace without steps: every event that starts before its ``n``-th event of ``device_cat``
    (and all metadata)."""
    ev = doc["traceEvents"]
    t1 = sorted(e["ts"] for e in ev if e.get("ph") == "X" and e.get("cat") == device_cat)[n]
    return {**doc, "traceEvents": [e for e in ev if e.get("ph") == "M" or ("ts" in e and e["ts"] < t1)]}


HTA = [  # (source path in facebookresearch/HolisticTraceAnalysis, fixture, step to keep or None: whole)
    ("tests/data/trace_file_list/inference_rank_1.json.gz", "hta_pt19_inference_rank1.json.gz", None),
    ("tests/data/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz", "hta_mi250_train_rocm62.json.gz", None),
    ("tests/data/nccl_parser_config/nccl_data.json.gz", "hta_ddp_nccl_step5.json.gz", 5),
    ("tests/data/mtia_inference_trace/mtia_inference_rank_0.json.gz", "hta_mtia_inference_head.json.gz", "mtia"),
    # torch.compile with CUDA graphs (cudaGraphLaunch), DDP over NCCL: V100 (2 ranks), A100 (16 ranks)
    ("tests/data/trace_diff/test/test.json.gz", "hta_v100_ddp_cudagraph_step1010.json.gz", 1010),
    ("tests/data/negative_queue_length_values_check/rank0.json.gz", "hta_a100_ddp_cudagraph_step551.json.gz", 551),
]


TRACELENS = [  # (source path in AMD-AGI/TraceLens, fixture); the top-level "metadata" object is dropped:
    # it holds the capturing machine's environment variables (one of them a token)
    ("tests/traces/h100/gaunernst_bert-small-uncased__1016001.json.gz", "tracelens_h100_bert_inference.json.gz"),
    # at 171dd74721ca1ec45709e5805b68ae1f65e27811: cuBLAS kernel names (H100: sm90_xmma ..._cublas,
    # cutlass::Kernel2<cutlass_75_...>, gemvx; B200: nvjet_*), and vLLM's HIP graph replays (hipGraphLaunch)
    ("tests/traces/h100/facebook_timesformer-base-finetuned-k400__1016002.json.gz",
     "tracelens_h100_timesformer_inference.json.gz"),
    ("tests/traces/b200/eager_trace.json.gz", "tracelens_b200_vllm_nvjet.json.gz"),
    ("tests/traces/inference/vllm_prefilldecode_piecewise/graph_execution.json.gz",
     "tracelens_rocm_vllm_piecewise_hipgraph.json.gz"),
]


def cpu_checkpoint(out: Path) -> None:
    """A real CPU run: a small conv net with non-reentrant activation checkpointing, 2 profiled steps."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
    head = torch.nn.Linear(8 * 14 * 14, 10)
    opt = torch.optim.SGD([*block.parameters(), *head.parameters()], lr=0.1)
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
    def step():
        h = checkpoint(block, x, use_reentrant=False)
        loss = torch.nn.functional.cross_entropy(head(h.flatten(1)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    step()  # warm-up, not profiled
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(2):
            step()
            prof.step()
    tmp = out.with_suffix("")
    prof.export_chrome_trace(str(tmp))
    out.write_bytes(gzip.compress(tmp.read_bytes(), 9, mtime=0))
    tmp.unlink()


if __name__ == "__main__":
    if sys.argv[1:] == ["--cpu-checkpoint"]:
        cpu_checkpoint(HERE / "cpu_checkpoint_recompute.json.gz")
    elif sys.argv[1] == "--tracelens":
        src = Path(sys.argv[2])
        for rel, name in TRACELENS:
            doc = load(src / rel)
            doc.pop("metadata", None)
            dump(doc, HERE / name)
    else:
        src = Path(sys.argv[1])
        for rel, name, step in HTA:
            doc = load(src / rel)
            doc = doc if step is None else trim_head(doc, "mtia_ccp_events", 60) if step == "mtia" else trim_to_step(doc, step)
            dump(doc, HERE / name)
