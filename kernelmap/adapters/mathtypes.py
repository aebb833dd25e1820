"""The math a library call ran, from the data types and compute type its log gives (issue 38).

One rule for every library: a call's math (``schema.MathRan``) is the precision of its
multiplications' inputs, the operands the library reads for the product (a conv forward: x and w; its
data gradient: dy and w; its weight gradient: x and dy; a gemm: A and B). Both fp32 and TF32 permitted
(the library's TF32 switch on, ``NVIDIA_TF32_OVERRIDE`` not 0): ``tf32``; a compute type that
down-converts fp32 inputs (cuBLAS ``CUBLAS_COMPUTE_32F_FAST_16BF``, oneDNN ``attr-fpmath:bf16``): that
type. Operands of two types: ``mixed``. The accumulator and output types go to ``math_dtypes`` only: a
bf16 gemm accumulating in fp32 ran bf16 math. A type this module does not know: no math (NA), never a
guess. Calls that multiply nothing (activation, pooling, softmax, reorders) take their data's type.
"""

from __future__ import annotations

import re

from ..schema import MathRan

# every spelling the logs use -> one short name (the type's, not a math)
_TYPES = {
    # cuDNN cudnnDataType_t
    "CUDNN_DATA_FLOAT": "fp32", "CUDNN_DATA_DOUBLE": "fp64", "CUDNN_DATA_HALF": "fp16",
    "CUDNN_DATA_BFLOAT16": "bf16", "CUDNN_DATA_INT8": "int8", "CUDNN_DATA_INT32": "int32",
    "CUDNN_DATA_FP8_E4M3": "fp8_e4m3", "CUDNN_DATA_FP8_E5M2": "fp8_e5m2",
    # cudaDataType_t (cuBLAS Ex calls) and cuBLASLt's matrix layouts (the same names without CUDA_)
    "CUDA_R_32F": "fp32", "CUDA_R_64F": "fp64", "CUDA_R_16F": "fp16", "CUDA_R_16BF": "bf16",
    "CUDA_R_8I": "int8", "CUDA_R_32I": "int32", "CUDA_R_8F_E4M3": "fp8_e4m3", "CUDA_R_8F_E5M2": "fp8_e5m2",
    "R_32F": "fp32", "R_64F": "fp64", "R_16F": "fp16", "R_16BF": "bf16", "R_8I": "int8", "R_32I": "int32",
    "R_8F_E4M3": "fp8_e4m3", "R_8F_E5M2": "fp8_e5m2",
    # oneDNN data types; XLA's HLO element types
    "f32": "fp32", "f64": "fp64", "f16": "fp16", "bf16": "bf16", "s8": "int8", "u8": "uint8", "s32": "int32",
}
_MATH_OF_TYPE = {"fp32": MathRan.FP32, "fp64": MathRan.FP64, "fp16": MathRan.FP16, "bf16": MathRan.BF16}
# compute types that say the math themselves (cuBLAS cublasComputeType_t; cuBLASLt drops the CUBLAS_ prefix)
_COMPUTE_MATH = {
    "COMPUTE_32F_FAST_TF32": MathRan.TF32, "COMPUTE_32F_FAST_16BF": MathRan.BF16,
    "COMPUTE_32F_FAST_16F": MathRan.FP16,
}
_COMPUTE_TYPE = {"COMPUTE_32F": "fp32", "COMPUTE_32F_PEDANTIC": "fp32", "COMPUTE_64F": "fp64",
                 "COMPUTE_64F_PEDANTIC": "fp64", "COMPUTE_16F": "fp16", "COMPUTE_16F_PEDANTIC": "fp16",
                 "COMPUTE_32I": "int32", "COMPUTE_32I_PEDANTIC": "int32", **{k: "fp32" for k in _COMPUTE_MATH}}


def type_name(raw: str | None) -> str | None:
    """A log's data type (``CUDNN_DATA_BFLOAT16 (9)``, ``CUDA_R_16BF(14)``, ``R_16BF``, ``bf16``) as a
    short name (``bf16``); None where it is absent or unknown."""
    if not raw:
        return None
    key = raw.strip().split("(")[0].split(" ")[0].strip()
    return _TYPES.get(key)


def compute_name(raw: str | None) -> str | None:
    """A cuBLAS/cuBLASLt compute type (``CUBLAS_COMPUTE_32F_FAST_TF32(77)``, ``COMPUTE_32F``, the legacy
    ``CUDA_R_32F``) as the type it accumulates in; None where unknown."""
    if not raw:
        return None
    key = raw.strip().split("(")[0].strip().removeprefix("CUBLAS_")
    return _COMPUTE_TYPE.get(key) or type_name(key)


def compute_math(raw: str | None) -> MathRan | None:
    """The math a compute type imposes on fp32 inputs (TF32, BF16, FP16), or None where it imposes none."""
    if not raw:
        return None
    return _COMPUTE_MATH.get(raw.strip().split("(")[0].strip().removeprefix("CUBLAS_"))


def ran(operands: list[str | None], tf32: bool | None, imposed: MathRan | None = None) -> str | None:
    """The math of a call from its operands' short type names. ``tf32``: TF32 permitted for this
    call (True), not permitted (False), not known (None: fp32 operands then give no math). ``imposed``:
    a compute type's down-conversion of fp32 operands (``compute_math``)."""
    if not operands or any(t is None for t in operands):
        return None
    kinds = set(operands)
    if len(kinds) > 1:
        return MathRan.MIXED.value
    t = kinds.pop()
    math = _MATH_OF_TYPE.get(t)
    if math is None:
        return None
    if math is MathRan.FP32 and imposed is not None:
        return imposed.value
    if math is MathRan.FP32 and tf32 is None:
        return None
    return MathRan.TF32.value if math is MathRan.FP32 and tf32 else math.value


TF32_UNKNOWN = "tf32=unknown"  # fp32 operands, and the log does not say whether TF32 was permitted


def tf32_unknown(operands: list[str | None], tf32: bool | None, imposed: MathRan | None = None) -> bool:
    """Whether ``ran`` gives no math only because TF32's permission is unknown (fp32 operands)."""
    return bool(operands) and all(t == "fp32" for t in operands) and tf32 is None and imposed is None


def dtypes_text(**named: str | None) -> str | None:
    """``a=bf16 b=bf16 compute=fp32``: the named types that are known, in the order given; None if none.
    A name ``tf32`` with a true value adds ``TF32_UNKNOWN``."""
    unknown = named.pop("tf32", False)
    parts = [f"{k}={v}" for k, v in named.items() if v] + ([TF32_UNKNOWN] if unknown else [])
    return " ".join(parts) or None


# ``dtypes_text`` names that are no tensor (its callers'): the compute and scale types, oneDNN's fpmath; a token
# whose value is no data type (``mode=TENSOR_OP_MATH``, ``NVIDIA_TF32_OVERRIDE=0``) neither
NOT_TENSORS = ("compute", "scale", "fpmath")
_TYPE = re.compile(r"^(?:fp\d+(?:_e\dm\d)?|bf16|u?int\d+)$")


def tensor_types(dtypes: str | None) -> set[str]:
    """The data types of a call's tensors as ``dtypes_text`` wrote them, a record's ``math_dtypes``
    (``x=fp16 w=fp16 y=fp16 compute=fp32``: {fp16}; a table row's several texts joined by "; " read together);
    empty where none is known."""
    if not isinstance(dtypes, str):
        return set()
    pairs = (tok.split("=", 1) for tok in dtypes.replace(";", " ").split() if "=" in tok)
    return {v for k, v in pairs if k not in NOT_TENSORS and _TYPE.match(v)}


# --- XLA's HLO text: a library custom call's operands and precision --------------------------------
_HLO_INSTR = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = \(?([a-z0-9]+)\[")
_HLO_CALL = re.compile(r'custom-call\(([^)]*)\).*custom_call_target="(__cudnn\$\w+|__cublas\$[\w$]+)"')
_HLO_OPERAND = re.compile(r"%([\w.\-]+)")
_CONV_PRECISION = re.compile(r"operand_precision=\{([^}]*)\}")
_GEMM_PRECISION = re.compile(r'"operand_precision":\[([^\]]*)\]')
_GEMM_ALGORITHM = re.compile(r'"algorithm":"ALG_DOT_([A-Z0-9]+)_')
_CUDNN_MATH = re.compile(r'"math_type":"(\w+)"')


def hlo_call_math(text: str) -> dict[str, tuple[str | None, str | None]]:
    """Per library custom call of an HLO module's text (``__cudnn$…``, ``__cublas$…``): (math_ran, math_dtypes).
    The operands are the call's first two (conv: input and filter, its data gradient dy and filter, its
    weight gradient input and dy; gemm: lhs and rhs), their element types from the instructions that define
    them. TF32 for fp32 operands: a cuDNN call's ``math_type`` ``TENSOR_OP_MATH`` (XLA asks for it only where
    TF32 is allowed), a gemm's operand precision below ``HIGHEST`` (XLA computes an fp32 dot at DEFAULT or HIGH
    precision in TF32 on GPUs that have it) or a ``ALG_DOT_TF32…`` algorithm; ``HIGHEST``: fp32."""
    types: dict[str, str] = {}
    calls: list[tuple[str, list[str], str, str]] = []
    for line in text.splitlines():
        m = _HLO_INSTR.match(line)
        if not m:
            continue
        types[m.group(1)] = m.group(2)
        c = _HLO_CALL.search(line)
        if c:
            calls.append((m.group(1), _HLO_OPERAND.findall(c.group(1))[:2], c.group(2), line))
    out = {}
    for name, operands, target, line in calls:
        ab = [type_name(types.get(o)) for o in operands]
        if target.startswith("__cudnn$"):
            # TENSOR_OP_MATH: TF32 asked for; FMA_MATH: never; DEFAULT_MATH permits TF32 in cuDNN 9 unless
            # NVIDIA_TF32_OVERRIDE=0 (our jax_gpu log: DEFAULT_MATH calls with enable_tf32=true): unknown here
            mt = _CUDNN_MATH.search(line)
            tf32 = {"TENSOR_OP_MATH": True, "FMA_MATH": False}.get(mt.group(1)) if mt else None
            precision = _CONV_PRECISION.search(line)
        else:
            precision = _GEMM_PRECISION.search(line)
            levels = [p.strip().strip('"').lower() for p in precision.group(1).split(",")] if precision else []
            tf32 = (not all(p == "highest" for p in levels)) if levels else None
            alg = _GEMM_ALGORITHM.search(line)
            if alg:
                tf32 = alg.group(1).startswith("TF32")
        math = ran(ab if len(ab) == 2 else [], tf32)
        out[name] = (math, dtypes_text(a=ab[0] if ab else None, b=ab[1] if len(ab) > 1 else None,
                                       out=type_name(types.get(name)),
                                       precision=precision.group(1).replace('"', "").lower().replace(" ", "")
                                       if precision else None, tf32=tf32_unknown(ab, tf32)))
    return out
