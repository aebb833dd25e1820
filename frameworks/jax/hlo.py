"""What an optimised HLO module's convolutions and dots compute in (no jax here: tests read real HLO text with it)."""

from __future__ import annotations

import re
from collections import Counter

# an HLO instruction that is a convolution or a dot (XLA's own, or the cuDNN/cuBLAS custom call it became on
# the GPU), with its result's element type: the first of a tuple's (a custom call's result, its workspace)
_HLO_CONV_DOT = re.compile(
    r"^\s*(?:ROOT\s+)?%\S+\s*=\s*\(?(?P<dtype>[a-z]+[0-9]*)\[[^=]*?\s(?P<op>convolution|dot|custom-call)\(")
_CUSTOM_TARGET = re.compile(r'custom_call_target="(__cudnn\$conv[^"]*|__cublas\$[^"]*)"')


def conv_dot_dtypes(hlo_text: str) -> dict[str, int]:
    """{"<instruction> <element type>": count} over the convolutions and dots of an optimised HLO module
    (``compiled_hlo``), custom calls counted where they are cuDNN convolutions or cuBLAS GEMMs ("conv", "gemm")."""
    counts: Counter = Counter()
    for line in hlo_text.splitlines():
        m = _HLO_CONV_DOT.match(line)
        if m is None:
            continue
        op = m["op"]
        if op == "custom-call":
            target = _CUSTOM_TARGET.search(line)
            if target is None:
                continue
            op = "conv" if target[1].startswith("__cudnn") else "gemm"
        counts[f"{op} {m['dtype']}"] += 1
    return dict(sorted(counts.items()))
