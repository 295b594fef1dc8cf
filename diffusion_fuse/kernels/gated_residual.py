"""Triton kernel for ``diffusion_fuse::gated_residual``: ``r = residual + (gate [+ gate_temb]) * x [→ r_dtype]``.

Numerics contract (lossless tier): per element, in fp32 and rounded as eager rounds each op::

    g = gate [+ gate_temb]          # second addend: one fp32 add (a timestep table's table + temb.float())
    m = round_m(g * x)              # promote(gate, x)
    r = round_r(residual + m)       # promote(residual, m), or r_dtype (``.type_as``)

``r`` rounded to its dtype once from the fp32 sum is what eager's add and then ``_to_copy`` give. One program per
row; ``r`` is stored and nothing else. kernels/gated_residual_norm_modulate.py computes the same ``r`` and
normalizes it.

Inputs: residual and x [M, D] or [B, S, D] of one shape with unit stride along D (any row strides), D % 4 == 0;
gate and its second addend broadcast to x with unit stride along D.

A residual that is not laid out in rows (D-major tokens: a patch embedding's ``flatten(2).transpose(1, 2)``) runs
the tile kernel instead: each program computes a [BLOCK_S tokens, BLOCK_D] tile with the same arithmetic, reading
every operand and writing ``r`` at their own strides (Triton moves the tile between the operands' orders through
shared memory, so every access is coalesced), and optionally writes a second, row-major copy of ``r`` for a
LayerNorm that reads rows (kernels/gated_residual_norm_modulate.py with ``GATED=False``).
"""

from __future__ import annotations

import torch

from .launch import CachedLaunch
from .layer_norm_stats import LANES, VEC, n_iters_for, program_row
from .norm_modulate import DT_CODE, batch_token_strides, round_to, sum_dtype
from .optional_triton import tl, triton


def residual_dtypes(residual_dtype, x_dtype, gate_dtype, r_dtype=None) -> tuple[torch.dtype, torch.dtype]:
    """dtypes of (gate * x, residual + gate * x [→ r_dtype]) under eager's type promotion."""
    m_dt = torch.promote_types(gate_dtype, x_dtype)
    return m_dt, r_dtype or torch.promote_types(residual_dtype, m_dt)


@triton.jit
def residual_plus_gated(g, x, res, M_DT: tl.constexpr):
    """The contract's arithmetic in fp32: ``residual + round_m(g * x)``, g already summed with its addend."""
    m = round_to(g * x.to(tl.float32), M_DT)
    return res.to(tl.float32) + m


@triton.jit
def gated_residual_row(res_row, x_row, g_row, gt_row, r_row, N, N_ITERS: tl.constexpr, LANES: tl.constexpr,
                       VEC: tl.constexpr, M_DT: tl.constexpr, HAS_GATE_TEMB: tl.constexpr):
    """One row of ``r = residual + (gate [+ gate_temb]) * x``, stored in r_row's dtype (the contract above)."""
    lane = tl.arange(0, LANES)
    col = tl.arange(0, VEC)
    for it in tl.static_range(N_ITERS):
        offs = (it * LANES + lane)[:, None] * VEC + col[None, :]
        mask = offs < N
        g = tl.load(g_row + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_GATE_TEMB:
            g = g + tl.load(gt_row + offs, mask=mask, other=0.0).to(tl.float32)
        r = residual_plus_gated(g, tl.load(x_row + offs, mask=mask, other=0.0),
                                tl.load(res_row + offs, mask=mask, other=0.0), M_DT)
        tl.store(r_row + offs, r.to(r_row.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["S"])
def _gated_residual_kernel(RES, X, GATE, GATE_T, R_OUT, N, S, res_sb, res_ss, x_sb, x_ss, g_sb, g_ss, gt_sb, gt_ss,
                           M_DT: tl.constexpr, N_ITERS: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr,
                           HAS_GATE_TEMB: tl.constexpr):
    row, bi, si = program_row(S)
    gated_residual_row(res_row=RES + bi * res_sb + si * res_ss, x_row=X + bi * x_sb + si * x_ss,
                       g_row=GATE + bi * g_sb + si * g_ss, gt_row=GATE_T + bi * gt_sb + si * gt_ss,
                       r_row=R_OUT + row * N, N=N, N_ITERS=N_ITERS, LANES=LANES, VEC=VEC, M_DT=M_DT,
                       HAS_GATE_TEMB=HAS_GATE_TEMB)


@triton.jit  # S specialized too: a multiple of 16 lets the token-major accesses take vectors
def _gated_residual_tiles_kernel(RES, X, GATE, GATE_T, R_OUT, R_ROWS, S, D, res_sb, res_ss, res_sd, x_sb, x_ss, x_sd,
                                 g_sb, g_ss, gt_sb, gt_ss, r_sb, r_ss, r_sd,
                                 M_DT: tl.constexpr, HAS_GATE_TEMB: tl.constexpr, GATE_PER_TOKEN: tl.constexpr,
                                 HAS_ROWS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """One [BLOCK_S, BLOCK_D] tile of batch ``program_id(2)``: ``r`` at R_OUT's strides, and with HAS_ROWS also
    into R_ROWS, contiguous [B, S, D]."""
    bi = tl.program_id(2).to(tl.int64)
    s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = (s < S)[:, None] & (d < D)[None, :]
    s, d = s.to(tl.int64)[:, None], d.to(tl.int64)[None, :]
    if GATE_PER_TOKEN:
        g = tl.load(GATE + bi * g_sb + s * g_ss + d, mask=mask, other=0.0).to(tl.float32)
        if HAS_GATE_TEMB:
            g = g + tl.load(GATE_T + bi * gt_sb + s * gt_ss + d, mask=mask, other=0.0).to(tl.float32)
    else:  # one gate row for every token: loaded once, as a row
        g = tl.load(GATE + bi * g_sb + d, mask=d < D, other=0.0).to(tl.float32)
        if HAS_GATE_TEMB:
            g = g + tl.load(GATE_T + bi * gt_sb + d, mask=d < D, other=0.0).to(tl.float32)
    r = residual_plus_gated(g, tl.load(X + bi * x_sb + s * x_ss + d * x_sd, mask=mask, other=0.0),
                            tl.load(RES + bi * res_sb + s * res_ss + d * res_sd, mask=mask, other=0.0), M_DT)
    r = r.to(R_OUT.dtype.element_ty)
    tl.store(R_OUT + bi * r_sb + s * r_ss + d * r_sd, r, mask=mask)
    if HAS_ROWS:
        tl.store(R_ROWS + (bi * S + s) * D + d, r, mask=mask)


BLOCK_S, BLOCK_D = 64, 64  # a 64-token run of a D-major operand is 128 bytes in bf16: whole sectors either way


def _bsd_strides(t: torch.Tensor | None, x: torch.Tensor) -> tuple[int, int, int]:
    """(batch, token, D) strides of ``t`` broadcast to x ([M, D] as [1, M, D]); zeros for None."""
    if t is None:
        return 0, 0, 0
    e = t.expand(x.shape)
    return tuple(e.stride()) if x.dim() == 3 else (0, *e.stride())


def plan_gated_residual_tiles(a, r_strides: tuple[int, ...], rows: bool):
    """A launch of the tile kernel: ``r`` with strides ``r_strides`` (eager's), and with ``rows`` a contiguous copy
    of it too. The launch returns ``(r, rows or None)``."""
    x = a.x
    B, S, D = (1, *x.shape) if x.dim() == 2 else x.shape
    m_dt, r_dt = residual_dtypes(a.residual.dtype, x.dtype, sum_dtype(a.gate, a.gate_temb), a.r_dtype)
    shape, device = x.shape, x.device
    gate_strides = [_bsd_strides(t, x)[:2] for t in (a.gate, a.gate_temb)]  # (batch, token): unit stride along D
    strides = [s for t in (a.residual, x) for s in _bsd_strides(t, x)] + [s for bs in gate_strides for s in bs]
    strides += list(_bsd_strides(torch.empty_strided(shape, r_strides, device="meta"), x))
    const = dict(M_DT=DT_CODE[m_dt], HAS_GATE_TEMB=a.gate_temb is not None,
                 GATE_PER_TOKEN=any(token != 0 for _, token in gate_strides), HAS_ROWS=rows, BLOCK_S=BLOCK_S,
                 BLOCK_D=BLOCK_D)
    kernel = CachedLaunch(_gated_residual_tiles_kernel, (-(-S // BLOCK_S), -(-D // BLOCK_D), B), const,
                          num_warps=4)

    def launch(a):
        r = torch.empty_strided(shape, r_strides, dtype=r_dt, device=device)
        r_rows = torch.empty(shape, dtype=r_dt, device=device) if rows else None
        kernel(a.residual, a.x, a.gate, a.gate_temb if a.gate_temb is not None else a.gate, r,
               r_rows if rows else r, S, D, *strides)
        return r, r_rows

    return launch


def plan_gated_residual(a):
    """A launch for inputs of this layout: ``a`` holds the op's arguments by name (lowering/gated_residual.py; its
    guard accepted them), and so does the launch's argument."""
    x = a.x
    D = x.shape[-1]
    S = x.shape[1] if x.dim() == 3 else 1
    m_dt, r_dt = residual_dtypes(a.residual.dtype, x.dtype, sum_dtype(a.gate, a.gate_temb), a.r_dtype)
    shape, device = x.shape, x.device
    strides = [s for t in (a.residual, x, a.gate, a.gate_temb) for s in batch_token_strides(t, x)]
    const = dict(M_DT=DT_CODE[m_dt], N_ITERS=n_iters_for(D), LANES=LANES, VEC=VEC,
                 HAS_GATE_TEMB=a.gate_temb is not None)
    kernel = CachedLaunch(_gated_residual_kernel, (x.numel() // D,), const, num_warps=LANES // 32)

    def launch(a):
        r = torch.empty(shape, dtype=r_dt, device=device)
        kernel(a.residual, a.x, a.gate, a.gate_temb if a.gate_temb is not None else a.gate, r, D, S, *strides)
        return r

    return launch
