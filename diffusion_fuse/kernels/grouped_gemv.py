"""Grouped GEMV: many linears of one short input (a row or two) in one launch, each with cuBLAS's bits.

Why: AdaLN modulation is ``linear(silu(temb))`` in every block: the whole [6 D, D] weight is read to make one
row. FLUX.1-dev runs 76 of these a forward (38 at [18432, 3072], 38 at [9216, 3072] through cuBLAS's split-K
kernel and its reduce), Qwen-Image 120. Each launch ramps up and drains on its own, short of the device's
bandwidth. All of a forward's modulation linears read the same ``silu(temb)``, so they can be one launch over
every weight: a program per ``BLOCK_N`` rows of one weight, the weights found through a table of pointers.

Numerics contract (per member ``y = x @ W.T + b``, x [M, K] with M <= 16, W [N, K] row-major):
* the program multiplies W's tile as the MMA's A operand by x padded to 16 columns (``tl.dot`` → sm_90
  ``wgmma``), K in order in tiles of ``BLOCK_K``, one fp32 accumulator: cuBLAS's non-split GEMV kernels
  (``nvjet ... 192x8 ... bias_TNT``) sum in this order, whatever the tile;
* split 2: the two contiguous halves of K are summed apart from zero and added, as cuBLAS's split-K kernel and
  ``splitKreduce_kernel`` do for FLUX's [9216, 3072] (two partials: the order of their add does not matter);
* then ``+ float(b)`` and one round-to-nearest-even to x's dtype.
Which form cuBLAS takes depends on its heuristic for (M, N, K, dtype); ``member_form`` finds it per shape on
first use by comparing both forms with ``torch.addmm`` on a random draw. A member neither form matches is
computed by ``torch.addmm(..., out=)`` into its slot (the same cuBLAS call as eager: lowering/linear_cat.py
explains why ``out=`` does not change the kernel), logged and listed in ``CUBLAS_MEMBERS``.

Verified shapes (H200, tests/gpu/test_grouped_gemv_gpu.py): FLUX.1-dev's [18432, 3072], [9216, 3072] and
[6144, 3072], Qwen-Image's [18432, 3072] and [6144, 3072], SD3.5-large's [14592, 2432] and [4864, 2432]; 1 and 2
rows, with and without bias.
"""

from __future__ import annotations

import dataclasses
import threading

import torch

from ..log import get_logger
from . import triton_interpret
from .launch import CachedLaunch
from .optional_triton import tl, triton

_log = get_logger("kernels")

DTYPES = (torch.bfloat16, torch.float16)
MAX_ROWS = 16  # x padded to 16 columns of the MMA: the smallest N of an sm_90 wgmma Triton issues


# The launch shape: weight rows a program, the largest K tile, pipeline stages, warps. Any gives the same bits (the
# order is the contract's at any tile); 64 x 64 tiles 8 stages deep are the fastest on the H200.
BLOCK_N, BLOCK_K_MAX, STAGES, WARPS = 64, 64, 8, 4
ALIGN = 16  # bytes: every member's slot, weight and bias start on a 16-byte boundary
FORMS = (1, 2)  # K in one chain, or in two halves added at the end

# (device, M, N, K, dtype, has_bias, cuBLAS settings) -> the form cuBLAS's bits follow (1, 2) or None (addmm
# into the slot)
_forms: dict[tuple, int | None] = {}
_forms_lock = threading.Lock()
CUBLAS_MEMBERS: list[str] = []  # members no form matched (tests, reports)

# Every plan's device tables, for the life of the process: a CUDA graph captured with a plan reads them by
# address at every replay, after the plan itself may be gone (dispatch's plan cache is bounded). A set of
# members planned again reuses its tables. They are small (a few KB), but weights that are not parameters
# would make a new set every call: past MAX_TABLE_SETS, planning refuses (the reference path, logged).
MAX_TABLE_SETS = 256
_live_tables: dict[tuple, _Tables] = {}


@triton.jit
def _grouped_gemv_kernel(X, TILE_MEMBER, TILE_N0, W_PTRS, B_PTRS, N_OF, OUT_OF, FORM_OF, OUT, M, stride_xm,
                         K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr,
                         INTERPRETED: tl.constexpr):
    """Program t: rows [n0, n0 + BLOCK_N) of member g's weight (both from the tile table); writes
    ``y[m, n] = rnd(acc + b)`` to ``OUT[OUT_OF[g] + m * N + n]``, acc as the module docstring says."""
    t = tl.program_id(0)
    g = tl.load(TILE_MEMBER + t)
    n0 = tl.load(TILE_N0 + t)
    n = tl.load(N_OF + g)
    form = tl.load(FORM_OF + g)
    w_base = tl.load(W_PTRS + g).to(tl.pointer_type(X.dtype.element_ty))
    rn = n0 + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    n_mask = rn < n
    # A table's address is 16-byte aligned (the guard) but Triton cannot know it: without the hint every
    # weight load is one element, with it 16-byte cp.async.
    w_ptrs = tl.multiple_of(w_base + rn[:, None].to(tl.int64) * K + rk[None, :], [16, 16])
    x_ptrs = X + rm[None, :] * stride_xm + rk[:, None]
    x_mask = rm[None, :] < M
    HALF: tl.constexpr = K // 2
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for _ in range(0, HALF, BLOCK_K):
        w = tl.load(w_ptrs, mask=n_mask[:, None], other=0.0, eviction_policy="evict_first")  # read once
        x = tl.load(x_ptrs, mask=x_mask, other=0.0)
        if INTERPRETED:  # Triton 3.6's interpreter multiplies 16-bit tiles' raw bits: logic checks in fp32
            w, x = w.to(tl.float32), x.to(tl.float32)
        acc = tl.dot(w, x, acc)  # weights as A, as cuBLAS's kernel for a one-column result has them
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    # Form 1 carries the chain on; form 2 starts the second half from zero and adds the halves at the end.
    acc2 = tl.where(form == 2, tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32), acc)
    for _ in range(HALF, K, BLOCK_K):
        w = tl.load(w_ptrs, mask=n_mask[:, None], other=0.0, eviction_policy="evict_first")
        x = tl.load(x_ptrs, mask=x_mask, other=0.0)
        if INTERPRETED:
            w, x = w.to(tl.float32), x.to(tl.float32)
        acc2 = tl.dot(w, x, acc2)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    y = tl.where(form == 2, acc + acc2, acc2)
    b_addr = tl.load(B_PTRS + g)
    if b_addr != 0:
        b_ptr = b_addr.to(tl.pointer_type(X.dtype.element_ty))
        y += tl.load(b_ptr + rn, mask=n_mask, other=0.0).to(tl.float32)[:, None]
    out = OUT + tl.load(OUT_OF + g)
    tl.store(out + rm[None, :] * n + rn[:, None], y.to(OUT.dtype.element_ty, fp_downcast_rounding="rtne"),
             mask=x_mask & n_mask[:, None])


def block_k(k: int) -> int | None:
    """The K tile: the largest power of two <= ``BLOCK_K_MAX`` (and >= 16, an MMA's K) that divides K / 2,
    so that both halves are whole tiles; None when there is none."""
    bk = BLOCK_K_MAX
    while bk >= 16:
        if k % (2 * bk) == 0:
            return bk
        bk //= 2
    return None


def can_use_grouped_gemv(x: torch.Tensor, weights, biases) -> tuple[bool, str]:
    """Whether the kernel can take these operands (each member's form is found later); else the reason."""
    if x.device.type != "cuda" and not (x.device.type == "cpu" and triton_interpret()):
        return False, f"device is {x.device.type}"
    if x.dtype not in DTYPES:
        return False, f"dtype {x.dtype} (kernel takes {[str(d) for d in DTYPES]})"
    if x.dim() != 2 or not 1 <= x.shape[0] <= MAX_ROWS or not x.is_contiguous():
        # contiguous as member_form's probe is: cuBLAS might pick another kernel for a strided x
        return False, f"x {tuple(x.shape)} strides {x.stride()} (kernel takes a contiguous [M <= {MAX_ROWS}, K])"
    k = x.shape[1]
    if block_k(k) is None:
        return False, f"K = {k} is not a multiple of 32"
    if len(weights) != len(biases) or not weights:
        return False, f"{len(weights)} weights, {len(biases)} biases"
    for i, (w, b) in enumerate(zip(weights, biases)):
        if w.device != x.device or w.dtype != x.dtype or w.dim() != 2 or w.shape[1] != k or not w.is_contiguous():
            return False, f"weight {i}: {tuple(w.shape)} {w.dtype} on {w.device}, contiguous {w.is_contiguous()}"
        if w.shape[0] % (ALIGN // x.element_size()) or w.data_ptr() % ALIGN:
            return False, f"weight {i}: {w.shape[0]} rows or its address is not {ALIGN}-byte aligned"
        if b is not None and (b.device != x.device or b.dtype != x.dtype or tuple(b.shape) != (w.shape[0],)
                              or b.stride(0) != 1):
            return False, f"bias {i}: {tuple(b.shape)} {b.dtype} on {b.device}"
    return True, ""


def out_numel(x: torch.Tensor, weights) -> int:
    return x.shape[0] * sum(w.shape[0] for w in weights)


@dataclasses.dataclass
class _Tables:
    """The kernel's device tables for one set of members (built once a plan)."""

    tile_member: torch.Tensor
    tile_n0: torch.Tensor
    w_ptrs: torch.Tensor
    b_ptrs: torch.Tensor
    n_of: torch.Tensor
    out_of: torch.Tensor
    form_of: torch.Tensor


def _tables(x, weights, biases, forms, keep: bool = True) -> _Tables:
    if not keep:  # a probe's: its weights are gone after it
        return _build_tables(x, weights, biases, forms)
    key = (x.device, x.shape[0], tuple(forms), tuple((w.data_ptr(), w.shape[0]) for w in weights),
           tuple(0 if b is None else b.data_ptr() for b in biases))
    with _forms_lock:
        tables = _live_tables.get(key)
    if tables is None:
        if len(_live_tables) >= MAX_TABLE_SETS:
            raise RuntimeError(f"grouped_gemv: {MAX_TABLE_SETS} sets of weights planned already (weights that change "
                               "address every call, not parameters?); this set takes the reference path")
        tables = _build_tables(x, weights, biases, forms)
        with _forms_lock:
            _live_tables[key] = tables
    return tables


def _build_tables(x, weights, biases, forms) -> _Tables:
    m = x.shape[0]
    tile_member, tile_n0, out_of, off = [], [], [], 0
    for g, w in enumerate(weights):
        out_of.append(off)
        off += m * w.shape[0]
        if forms[g] is not None:  # else computed by addmm into its slot: no tiles
            starts = list(range(0, w.shape[0], BLOCK_N))
            tile_member += [g] * len(starts)
            tile_n0 += starts

    def dev(values, dtype):
        return torch.tensor(values, dtype=dtype, device=x.device)

    return _Tables(dev(tile_member, torch.int32), dev(tile_n0, torch.int32),
                   dev([w.data_ptr() for w in weights], torch.int64),
                   dev([0 if b is None else b.data_ptr() for b in biases], torch.int64),
                   dev([w.shape[0] for w in weights], torch.int32), dev(out_of, torch.int64),
                   dev([f or 1 for f in forms], torch.int32))


def _launcher(x, tables: _Tables, k: int) -> CachedLaunch:
    return CachedLaunch(_grouped_gemv_kernel, (tables.tile_member.numel(),),
                        {"K": k, "BLOCK_N": BLOCK_N, "BLOCK_K": block_k(k), "BLOCK_M": MAX_ROWS,
                         "INTERPRETED": x.device.type == "cpu"},
                        num_warps=WARPS, num_stages=STAGES)


def _addmm_members(x, weights, biases, forms, out) -> None:
    m, off = x.shape[0], 0
    for w, b, f in zip(weights, biases, forms):
        n = w.shape[0]
        if f is None:
            slot = out[off:off + m * n].view(m, n)
            torch.addmm(b, x, w.t(), out=slot) if b is not None else torch.mm(x, w.t(), out=slot)
        off += m * n


def member_form(device: torch.device, m: int, n: int, k: int, dtype: torch.dtype, has_bias: bool) -> int | None:
    """The form (1 or 2) whose bits ``torch.addmm`` gives for a [m, k] @ [n, k].T (+ bias) on ``device``, found
    once per shape on a random draw (where the forms differ); None when neither does. The interpreter (CPU)
    takes form 1."""
    if device.type != "cuda":
        return 1
    matmul = torch.backends.cuda.matmul
    key = (device, m, n, k, dtype, has_bias, matmul.allow_bf16_reduced_precision_reduction,
           matmul.allow_fp16_reduced_precision_reduction, str(torch.backends.cuda.preferred_blas_library()))
    with _forms_lock:
        if key in _forms:
            return _forms[key]
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.nn.functional.silu(torch.randn(m, k, device=device, generator=g) * 2).to(dtype)
    w = (torch.randn(n, k, device=device, generator=g) * 0.02).to(dtype)
    b = (torch.randn(n, device=device, generator=g) * 0.02).to(dtype) if has_bias else None
    want = (torch.addmm(b, x, w.t()) if has_bias else torch.mm(x, w.t())).view(torch.int16)
    found = None
    for form in FORMS:
        got = plan_grouped_gemv(x, [w], [b], [form], keep_tables=False)(x, [w], [b]).view(m, n).view(torch.int16)
        if torch.equal(got, want):
            found = form
            break
    with _forms_lock:
        _forms[key] = found
    return found


def plan_grouped_gemv(x: torch.Tensor, weights, biases, forms=None, keep_tables: bool = True):
    """launch(x, weights, biases) -> the flat output, for these members (checked by ``can_use_grouped_gemv``).

    ``forms``: each member's form (1, 2, or None for addmm into its slot); by default ``member_form``'s. The
    device tables hold the weights' and biases' addresses: a plan is for these tensors (the layout key has
    their addresses). ``keep_tables=False``: the tables go with the plan (``member_form``'s probe), else they
    live with the process (``_live_tables``)."""
    m, k = x.shape
    if forms is None:
        forms = [member_form(x.device, m, w.shape[0], k, x.dtype, b is not None) for w, b in zip(weights, biases)]
    missing = [f"[{m}, {k}] @ [{w.shape[0]}, {k}]" for w, f in zip(weights, forms) if f is None]
    if missing:
        _log.warning("grouped_gemv: cuBLAS's order for %s is neither form the kernel knows; those members run "
                     "torch.addmm into their slots", ", ".join(sorted(set(missing))))
        CUBLAS_MEMBERS.extend(missing)
    tables = _tables(x, weights, biases, forms, keep_tables)
    kernel = _launcher(x, tables, k) if tables.tile_member.numel() else None
    size = out_numel(x, weights)
    any_addmm = any(f is None for f in forms)

    def launch(x, weights, biases):
        out = torch.empty(size, dtype=x.dtype, device=x.device)
        if kernel is not None:
            kernel(x, tables.tile_member, tables.tile_n0, tables.w_ptrs, tables.b_ptrs, tables.n_of, tables.out_of,
                   tables.form_of, out, m, x.stride(0))
        if any_addmm:
            _addmm_members(x, weights, biases, forms, out)
        return out

    return launch
