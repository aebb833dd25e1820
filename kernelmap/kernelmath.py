"""Each library kernel's math (issue 38): its call's, else what its name spells, else unknown.

The adapters give each library call ``math_ran``, ``math_dtypes`` and ``math_source`` (``log``: the
library's API log; ``hlo``: XLA's HLO text; ``kernelmap/adapters/mathtypes.py`` says the rule). After the
calls are linked to their kernels (``calllink``, ``attribution``, XLA's in-trace calls), ``fill`` gives
each linked kernel its call's three values, but a TF32 call's kernel whose name says FP32 FMA is fp32 (a
call permits TF32; the engine it ran may not use tensor cores), and so is a bf16 or fp16 call's kernel whose name
says it multiplies fp32 operands (``FP32_ENGINES``): cuDNN's FFT and Winograd algorithms transform the low-precision
tensors into fp32 (``fft2d_r2c_16x16<__half>`` writes ``float2``, ``winogradForwardData4x4<float, __half>``) and
multiply those in an FP32-FMA GEMM (``sm80_xmma_gemm_cf32cf32_f32f32_cf32_…_ffma``, ``…_f32f32_f32f32_f32_…_ffma``),
the one-channel Winograd weight gradient in cuBLAS's ``gemvx::kernel<int, int, float, …>``: MXNet fp16 on the 4x
H200 (its autotuner's choice for conv2 in every direction and conv1's weight gradient), where the log says fp16.
The transforms themselves keep their call's math (their names give no product's type). A kernel with no call that has a math takes
one from its name only where NVIDIA's name spells the multiply's input type (``NAME_RULES``, source ``name``): the
xmma kernels of cuDNN and cuBLAS (``sm80_xmma_gemm_f32f32_tf32f32_f32_…``: storage types, then the math
and accumulator, e.g. ``tf32f32``), CUTLASS's tensor-op kernels (``cutlass_tensorop_bf16_s16816fprop…``),
the SIMT fp32 gemm and convolution kernels (``sgemm_…``, ``implicit_convolve_sgemm<float, …>`` and cuDNN's legacy
weight-gradient ``wgrad_alg0_engine[_NHWC]<float, …>``, whose first template argument is the data type; cuBLAS's
``gemvx::kernel<…>``, its third; no
tensor-core instruction takes that type, so a call that permitted TF32 ran fp32 there: seen under XLA's
DEFAULT_MATH convolutions of a JAX tf32 case on the H200). Every other kernel without a call stays NA: unknown, never
guessed (a layout conversion, cuBLASLt's split-K reduction, an FFT, the sm90 ``nvjet`` gemms) -- except a
library kernel (``attribution.library_kernels``) of an op whose logged calls all ran one math (``OP_RULE``, source
``op``): the calls of its case, batch size, layer, op and phase (and its direction where the kernel has one of
the calls' own; a coarse ``bwd`` takes every backward call of the op). A call's operand types are the framework's
tensors, not the algorithm's, so whichever of those calls launched the kernel, it ran that math. The case it
is for: a timing pass whose library chose other algorithms than the libs pass (MXNet's per-process cuDNN
autotune: at bs 1024 on the H200 its nsys pass ran conv2's backward data as FFT kernels with another cgemm tile,
``fft2d_r2c_16x16<float>`` and ``flip_filter``, which no logged call launched; calllink leaves them unlinked).
Calls of two maths: NA.

``UNIT_RULES`` (``name_unit``, the ``math_unit`` column): the unit a kernel's products ran on, from the name alone,
for every kernel, whatever its call: a kernel's operand types (``math_ran``) do not say it (cuDNN's
``implicit_convolve_sgemm<__nv_bfloat16, …>`` is a bf16 convolution on the FMA units). ``none`` first, a kernel
that multiplies no operands (``cudnn::nchwToNhwcKernel``/``nhwcToNchwKernel``, cuBLASLt's ``splitKreduce_kernel``,
cuBLAS's ``scal_kernel`` and cuDNN's ``scalePackedTensor_kernel`` (a scale by the call's beta),
CUTLASS's ``reduction::kernel::ReduceSplitK``, cuDNN's ``flip_filter``, ``calc_bias_diff``, ``memset32``,
``init_device_workspace_kernel``, an xmma GEMM's ``…_execute_split_k_kernel`` (its split-K sum, named as the GEMM:
FADD only in the 4x H200 JAX bf16 capture): their names may carry a GEMM's types as template arguments); then an xmma
kernel's math field (``tf32``/``bf16``/``f16``: ``tensor``; ``f32``: ``fma``, the ``…_ffma_…`` kernels); then
``tensor``: CUTLASS ``_tensorop_``/``MmaTensorOp``, ``wmma``, ``hmma``, ``gmma``, an MMA shape (``s16816gemm``,
``_tensor16x8x16_``), sm90 ``nvjet``; ``fma``: ``sgemm`` (``sgemm_largek``, ``implicit_convolve_sgemm``, CUTLASS
``simt_sgemm``), ``_simt_``/``MmaSimt``, ``*_engine_float*``, ``ffma``. A name that two of them claim, or none
(FFTs, Winograd transforms, cuDNN's legacy ``wgrad_alg0_engine``, framework kernels): NA. Checked against the
tensor-pipe and FFMA/HFMA counts of two H200 ncu captures (tests/test_math_unit.py).

``COUNTED_RULES`` (``counted_math``): the floating-point arithmetic a kernel executes, in the vocabulary of the
counters pass (``adapters.ncu.kernel_math``: ``tf32``/``bf16``/``fp16`` tensor cores, ``fp32`` the CUDA cores' FP32
FMA/ADD/MUL, ``fp16/bf16 (CUDA cores)``, ``none``), from the log's math and what the name says beyond it, so that
the two are compared per kernel (``reports/analyses/roofline.py``: "log math vs counter math"). A tensor-unit
kernel: its ``math_ran``. An FMA-unit kernel whose name says single precision (``sgemm``, ``_engine_float``,
``ffma``, an xmma ``f32`` math field): ``fp32`` whatever its call's operand types (``implicit_convolve_sgemm<
__nv_bfloat16, ...>`` converts its bf16 operands and multiplies in FP32: 25,690,112 FFMA, no tensor op, no HFMA but
HFMA2.MMA moves in the 2x H200 capture). A kernel that multiplies no operands but computes in a type its template
names: cuDNN's layout transforms (``nchwToNhwcKernel<in, out, compute, ...>``: one FMUL an element, the scale by
alpha: 401,408 for conv2's 64x32x14x14 input), cuBLASLt's ``splitKreduce_kernel<.., int, partials, ...>`` (the sum of
the split-K partials: FADD), CUTLASS's ``ReduceSplitK<..., ReduceAdd<float, ...>>``, an xmma split-K reduction (its
accumulator, the math field's second type: ``bf16f32``): that type (``float``/``f32``:
``fp32``; ``__half``/``bf16``: the CUDA cores' half precision); so too cuDNN's legacy no-product kernels, whose call's
operand types are their data's (``op_generic_tensor_kernel<dims, data, compute, ...>`` of cudnnAddTensor and
cudnnActivation*, ``pooling_{fw,bw}_*kernel*<data, compute, ...>``, ``calc_bias_diff_nchw_packed<data, compute, ...>``,
the Winograd transforms ``winograd*4x4<compute, data>``, the FFTs ``fft2d_{r2c,c2r}_*<data>(float2 *, ...)``, whose
complex buffer is FP32). Where that type is ``float`` and the data fp16: ``COUNTED_FP32_ON_FP16``, which ``agrees``
with counters of FP32 alone or FP32 and HADD (``ncu.MATH_FP32_HADD``): sm_80+ converts fp16 to fp32 with HADD2.F32,
counted as a half add (MXNet fp16 on an H200: the fp16 gradients' casts to fp32 ran one HADD an element and nothing
else; max pooling one HADD an input element and one FMUL, its alpha, an output element;
tests/test_gpu_mxnet_fp16_counters.py). Any other no-product kernel: unknown
(cuBLAS's ``scal_kernel`` scales by the call's beta, which its name does not give; with beta 0 it writes zeros: no
FP instruction in the capture; cuDNN's ``scalePackedTensor_kernel`` likewise). A kernel of no unit by name: its ``math_ran``. None where nothing is known.

``apply_override``: ``NVIDIA_TF32_OVERRIDE=0`` makes cuBLAS, cuBLASLt and cuDNN never use TF32, whatever
the call asked (NVIDIA's documentation of the variable). cuDNN 9's log says it per call (its
ExecuteInternal block's ``enable_tf32``, and the variable in each trailer); the cuBLAS and cuBLASLt logs
do not, so a run whose cuDNN log shows the variable at 0 has its cuBLAS/cuBLASLt TF32 calls set to fp32,
their ``math_dtypes`` saying why.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from . import attribution
from . import strings as S
from .adapters import mathtypes as MT
from .adapters import ncu
from .schema import MathRan, MathSource, MathUnit

OVERRIDE_NOTE = "NVIDIA_TF32_OVERRIDE=0"
_OVERRIDDEN_SOURCES = ("cublas_log", "cublaslt_log")
# the op, any qualifier words (``implicit_gemm``, ``indexed``, ``wo_smem``: sm80's
# ``…fprop_implicit_gemm_indexed_wo_smem_tf32f32_tf32f32_f32_…``), the storage types, then the math field
_XMMA = re.compile(r"xmma_\w*?(?:gemm|fprop|dgrad|wgrad)_(?:[a-z]+_)*?(?:tf32|bf16|f16|f32|cf32|f64)+"
                   r"_(tf32|bf16|f16|f32|cf32|f64)")
_CUTLASS = re.compile(r"cutlass\w*?_tensorop_(?:(bf16|f16)_s\d+|(s1688))")
_SIMT = re.compile(r"^(?:void )?(?:\w+_)?sgemm_|^(?:void )?(?:implicit_convolve_sgemm|wgrad_alg0_engine(?:_NHWC)?)"
                   r"<(float|__nv_bfloat16|__half)\b")
# cuBLAS's gemv (cuDNN's Winograd weight gradient of a one-channel conv runs one): its third template argument is
# the matrix's type (``internal::gemvx::kernel<int, int, float, float, float, float, ...>``)
_GEMV = re.compile(r"\bgemvx::kernel<")
_NAMED = {"tf32": MathRan.TF32, "bf16": MathRan.BF16, "f16": MathRan.FP16, "f32": MathRan.FP32,
          "cf32": MathRan.FP32, "f64": MathRan.FP64, "s1688": MathRan.TF32, "float": MathRan.FP32,
          "__nv_bfloat16": MathRan.BF16, "__half": MathRan.FP16}
COLUMNS = ("math_ran", "math_dtypes", "math_source")
# FP32_ENGINES (module docstring): the calls' maths whose kernels may yet multiply fp32 operands
LOWER_THAN_FP32 = (MathRan.TF32.value, MathRan.BF16.value, MathRan.FP16.value)
# UNIT_RULES (module docstring), in this order
_NO_PRODUCT = re.compile(r"nchwToNhwc|nhwcToNchw|splitKreduce|ReduceSplitK|reduction::kernel|flip_filter|calc_bias_diff"
                         r"|_execute_split_k_kernel"
                         r"|init_device_workspace|^memset\d*$|\bscal_kernel<|scalePackedTensor_kernel<")
_UNIT_OF_MATH = {"tf32": MathUnit.TENSOR, "bf16": MathUnit.TENSOR, "f16": MathUnit.TENSOR, "f32": MathUnit.FMA,
                 "cf32": MathUnit.FMA}
_TENSOR = re.compile(r"_tensorop_|MmaTensorOp|wmma|hmma|gmma|_[a-z]?(?:16816|1688|161616)(?:gemm|fprop|dgrad|wgrad)"
                     r"|_tensor\d+x\d+x\d+_|^nvjet_sm\d+")
_FMA = re.compile(r"sgemm|_simt_|MmaSimt|_engine_float|ffma")
OP_KEYS = ["run", "case", "batch_size", "layer", "canonical_op", "phase"]  # OP_RULE: the calls of a kernel's op


def name_math(name: str | None) -> str | None:
    """The math a kernel's name spells (``NAME_RULES`` in the module docstring), or None."""
    if not isinstance(name, str):
        return None
    for rule in (_XMMA, _CUTLASS):
        m = rule.search(name)
        if m:
            return _NAMED[next(g for g in m.groups() if g)].value
    m = _SIMT.search(name)
    if m:
        return _NAMED[m.group(1) or "float"].value
    m = _GEMV.search(name)
    if m:
        args = template_args(name, m.end() - 1)
        ran = _NAMED.get(args[2]) if len(args) > 2 else None
        return ran.value if ran else None
    return None


def name_unit(name: str | None) -> str | None:
    """The unit a kernel's name says its products ran on (``UNIT_RULES``: ``schema.MathUnit``), or None."""
    if not isinstance(name, str):
        return None
    if _NO_PRODUCT.search(name):
        return MathUnit.NONE.value
    m = _XMMA.search(name)
    if m:
        unit = _UNIT_OF_MATH.get(m.group(1))
        return unit.value if unit else None
    hits = {u for u, rule in ((MathUnit.TENSOR, _TENSOR), (MathUnit.FMA, _FMA)) if rule.search(name)}
    return hits.pop().value if len(hits) == 1 else None


# COUNTED_RULES (module docstring): the values of ``adapters.ncu.kernel_math`` a kernel's log and name can give
COUNTED_FP32, COUNTED_HALF = ncu.MATH_FP32, ncu.MATH_HALF  # FP32 / half precision on the CUDA cores
# FP32 arithmetic on fp16 data (HALF_STORAGE): the counters find FP32 alone, or FP32 and the HADD2.F32 conversions
COUNTED_FP32_ON_FP16 = "fp32 on fp16 data"
COUNTER_MATHS = {COUNTED_FP32_ON_FP16: (ncu.MATH_FP32, ncu.MATH_FP32_HADD)}  # log math -> the counter maths it allows
_SINGLE = re.compile(r"sgemm|_engine_float|ffma")  # an FMA-unit kernel that multiplies in FP32
# a no-product kernel's template arguments (0-based): the type it computes in, and the type of the data it reads
# (None: its compute type's); a function argument ``float2 *`` is an FFT's complex buffer, its compute type
_TYPED = ((re.compile(r"(?:nchwToNhwc|nhwcToNchw)Kernel<"), 2, 0), (re.compile(r"splitKreduce_kernel<"), 3, None),
          (re.compile(r"ReduceAdd<"), 0, None), (re.compile(r"\bop_generic_tensor_kernel<"), 2, 1),
          (re.compile(r"\bpooling_(?:fw|bw)_\w*kernel\w*<"), 1, 0), (re.compile(r"\bcalc_bias_diff\w*<"), 1, 0),
          (re.compile(r"\bwinograd\w*4x4<"), 0, 1), (re.compile(r"\bfft2d_(?:r2c|c2r)_\w+<"), "float2", 0))
# an xmma GEMM's split-K reduction kernel (its name is the GEMM's, ``…_bf16bf16_bf16f32_f32_…_execute_split_k_kernel``):
# it sums the partials in the GEMM's accumulator type, the second of the math field (``bf16f32``: f32)
_XMMA_SPLIT_K = re.compile(r"xmma_\w*?(?:gemm|fprop|dgrad|wgrad)_(?:[a-z]+_)*?(?:tf32|bf16|f16|f32)+"
                           r"_(?:tf32|bf16|f16|f32)(f32|bf16|f16)_\w*_execute_split_k_kernel")
_TYPE_MATH = {"float": COUNTED_FP32, "__half": COUNTED_HALF, "half": COUNTED_HALF, "__nv_bfloat16": COUNTED_HALF,
              "bfloat16_t": COUNTED_HALF, "half_t": COUNTED_HALF}
_HALF_TYPES = ("__half", "half", "half_t")  # fp16 (not bf16, whose conversion to fp32 is a shift, no FP instruction)


def template_args(name: str, at: int) -> list[str]:
    """The top-level arguments of the template list that opens at ``name[at]`` (a ``<``), each stripped and without
    its namespaces (``cutlass__5x_cudnn::bfloat16_t`` -> ``bfloat16_t``); [] where the list does not close."""
    args, depth, start = [], 0, at + 1
    for i in range(at, len(name)):
        c = name[i]
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
            if depth == 0:
                args.append(name[start:i])
                return [a.strip().split("::")[-1] for a in args]
        elif c == "," and depth == 1:
            args.append(name[start:i])
            start = i + 1
    return []


def counted_math(name: str | None, math_ran: str | None) -> str | None:
    """The arithmetic the counters should find in a kernel (``COUNTED_RULES``: ``adapters.ncu.kernel_math``'s
    values), from its log's ``math_ran`` and what its name says (its unit: ``name_unit``; the type a no-product
    kernel computes in); None where they do not say."""
    ran = None if math_ran is None or pd.isna(math_ran) else str(math_ran)
    if not isinstance(name, str):
        return None
    for rule, arg, data in _TYPED:
        m = rule.search(name)
        if m:
            return typed_math(name, template_args(name, m.end() - 1), arg, data)
    m = _XMMA_SPLIT_K.search(name)
    if m:
        return COUNTED_FP32 if m.group(1) == "f32" else COUNTED_HALF
    unit = name_unit(name)
    if unit == MathUnit.FMA.value:
        x = _XMMA.search(name)
        return COUNTED_FP32 if (x.group(1) == "f32" if x else _SINGLE.search(name)) else None
    return None if unit == MathUnit.NONE.value else ran


def typed_math(name: str, args: list[str], arg, data: int | None) -> str | None:
    """A no-product kernel's arithmetic from its template ``args``: its compute type (``args[arg]``; ``"float2"``:
    an FFT whose signature has that complex buffer computes in FP32), ``COUNTED_FP32_ON_FP16`` where that is
    ``float`` and the data (``args[data]``) ``__half``; None where the name does not say."""
    if arg == "float2":
        compute = "float" if re.search(r"[(,]\s*(?:const\s+)?float2\s*\*", name) else None
    else:
        compute = args[arg] if len(args) > arg else None
    math = _TYPE_MATH.get(compute)
    stored = args[data] if data is not None and len(args) > data else None
    return COUNTED_FP32_ON_FP16 if math == COUNTED_FP32 and stored in _HALF_TYPES else math


def agrees(log_math: str, counter_math: str) -> bool:
    """Whether a kernel's log math (``counted_math``) and counter math (``adapters.ncu.kernel_math``) say the same
    arithmetic: equal, or a counter math ``COUNTER_MATHS`` allows for the log's."""
    return counter_math in COUNTER_MATHS.get(log_math, (log_math,))


def counted_by_name(name: str | None) -> bool:
    """Whether ``counted_math`` gives ``name``'s arithmetic from the name alone, whatever the log's ``math_ran``: a
    no-product kernel whose template names its type, or an FMA-unit kernel (``sgemm`` computes FP32 whatever its
    call's operands). The log's math is then not what the counters are compared with."""
    if not isinstance(name, str):
        return False
    return (any(rule.search(name) for rule, _, _ in _TYPED) or bool(_XMMA_SPLIT_K.search(name))
            or name_unit(name) == MathUnit.FMA.value)


def _by_name(df: pd.DataFrame, rows: np.ndarray, judge) -> tuple[np.ndarray, np.ndarray]:
    """(which of ``rows`` ``judge`` gave a value from their kernel's name, the values of those): each distinct
    name judged once, not each kernel."""
    names = S.objects(df["kernel_name"])[rows]
    said = {n: judge(n) for n in set(names)}
    values = np.array([said[n] for n in names] if len(names) else [], dtype=object)
    hit = np.array([v is not None for v in values], dtype=bool)
    return hit, values[hit]


def fill_unit(df: pd.DataFrame) -> None:
    """``math_unit`` of every kernel from its name (``name_unit``, once per distinct name); other rows NA."""
    kern = np.flatnonzero(S.eq(df["kind"], "kernel"))
    if not len(kern):
        return
    hit, units = _by_name(df, kern, name_unit)
    if hit.any():
        S.set_rows(df, "math_unit", kern[hit], list(units))


def apply_override(df: pd.DataFrame, overrides: list[str]) -> int:
    """Under ``NVIDIA_TF32_OVERRIDE=0`` (``overrides``: the values the run's cuDNN log trailers and the worker's
    pass file give): the cuBLAS/cuBLASLt calls' ``tf32`` and every call whose fp32 operands left TF32 unknown
    (``mathtypes.TF32_UNKNOWN``: XLA's cuDNN calls under ``DEFAULT_MATH``) are fp32; the number of calls set."""
    if "0" not in overrides or not len(df):
        return 0
    call = S.eq(df["kind"], "library_call")
    tf32 = call & S.isin(df["source"], _OVERRIDDEN_SOURCES) & S.eq(df["math_ran"], MathRan.TF32.value)
    unknown = call & S.isna(df["math_ran"]) & S.contains(df["math_dtypes"], MT.TF32_UNKNOWN)
    rows = np.flatnonzero(tf32 | unknown)
    if not len(rows):
        return 0
    S.set_rows(df, "math_ran", rows, MathRan.FP32.value)  # math_source stays the call's (log, hlo)
    old = S.objects(df["math_dtypes"])[rows]
    S.set_rows(df, "math_dtypes", rows, [f"{t.replace(MT.TF32_UNKNOWN, '').strip()} {OVERRIDE_NOTE}".strip()
                                         if t else OVERRIDE_NOTE for t in old])
    return len(rows)


def fill(df: pd.DataFrame, overrides: list[str] = ()) -> dict:
    """Each kernel's math from its call (``call_event_id``: a library call of ``df`` with a math), else
    from its name, else from its op's calls (``from_op``); figures of what was filled from where. ``overrides``:
    ``NVIDIA_TF32_OVERRIDE`` as the run's logs and pass files give it, applied to the calls first
    (``apply_override``): every kernel then takes the math its call or op ran, never the one the override undid."""
    overridden = {"tf32_overridden_calls": apply_override(df, list(overrides))}
    kern = np.flatnonzero(S.eq(df["kind"], "kernel"))
    if not len(kern):
        return {**overridden, "kernels_math_from_call": 0, "kernels_math_from_name": 0}
    fill_unit(df)
    calls = np.flatnonzero(S.eq(df["kind"], "library_call") & S.notna(df["math_ran"]))
    ids = df["event_id"].to_numpy(dtype="float64", na_value=np.nan)
    by_id = pd.Series(calls, index=ids[calls])
    by_id = by_id[~by_id.index.duplicated(keep="last")]
    call_of = df["call_event_id"].to_numpy(dtype="float64", na_value=np.nan)[kern]
    pos = by_id.reindex(call_of).to_numpy(dtype="float64", na_value=np.nan)
    linked = ~np.isnan(pos)
    src = pos[linked].astype(np.int64)
    for col in COLUMNS:
        vals = S.objects(df[col])[src]
        S.set_rows(df, col, kern[linked], list(vals))
    # a call that permitted TF32 may run an FP32-FMA kernel (cuDNN's implicit_convolve_sgemm<float>, an xmma
    # ..._f32f32_f32f32_..._ffma kernel), and a bf16/fp16 call an algorithm whose GEMM multiplies fp32 operands
    # (FP32_ENGINES): where the kernel's name says fp32, that is what the kernel ran
    low = kern[linked][np.isin(S.objects(df["math_ran"])[src], LOWER_THAN_FP32)]
    hit, said = _by_name(df, low, name_math)
    fma = low[hit][said == MathRan.FP32.value]
    if len(fma):
        S.set_rows(df, "math_ran", fma, MathRan.FP32.value)
        S.set_rows(df, "math_source", fma, MathSource.NAME.value)
    rest = kern[~linked]
    hit, named = _by_name(df, rest, name_math)
    if hit.any():
        S.set_rows(df, "math_ran", rest[hit], list(named))
        S.set_rows(df, "math_source", rest[hit], MathSource.NAME.value)
    return {**overridden, "kernels_math_from_call": int(linked.sum()) - len(fma), "kernels_math_from_name": int(hit.sum()) + len(fma),
            "kernels_math_from_op": from_op(df)}


def from_op(df: pd.DataFrame) -> int:
    """``OP_RULE`` (module docstring): each library kernel still without a math takes the one math every logged
    call of its op ran (looked up once per distinct op key and direction); the number of kernels set."""
    keys = [k for k in OP_KEYS if k in df.columns]
    calls = df[S.eq(df["kind"], "library_call") & S.notna(df["math_ran"]) & S.notna(df["layer"])]
    bare = S.eq(df["kind"], "kernel") & S.isna(df["math_ran"]) & S.notna(df["layer"])
    if not len(calls) or "layer" not in keys or not bare.any():
        return 0
    lib = attribution.library_kernel_rows(df)
    rows = lib[bare[lib]]
    if not len(rows):
        return 0
    maths: dict[tuple, set] = {}
    for key, g in calls.groupby([*keys, "direction"], dropna=False, observed=True, sort=False):
        for k in (tuple(key), (*key[:-1], None)):  # its own direction, and the op's (any of the phase's)
            maths.setdefault(k, set()).update(g["math_ran"].astype(str))
    kern = df.iloc[rows][[*keys, "direction"]]
    own = set(calls["direction"].dropna().astype(str))
    group = kern.groupby([*keys, "direction"], dropna=False, observed=True, sort=False).ngroup().to_numpy()
    firsts = np.unique(group, return_index=True)[1]
    value = np.full(len(firsts), None, dtype=object)
    for g, (*key, direction) in zip(group[firsts], kern.iloc[firsts].itertuples(index=False, name=None), strict=True):
        ran = maths.get((*key, direction if direction in own else None), set())
        if len(ran) == 1:
            value[g] = next(iter(ran))
    picked = value[group]
    hit = np.array([v is not None for v in picked], dtype=bool)
    if hit.any():
        S.set_rows(df, "math_ran", rows[hit], list(picked[hit]))
        S.set_rows(df, "math_source", rows[hit], MathSource.OP.value)
    return int(hit.sum())
