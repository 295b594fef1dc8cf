"""16-bit unary ops as a table of eager's own outputs (``lut16``): exact by construction.

A unary op on a bf16/fp16 tensor whose result is rounded to 16 bits is a function of 65,536 inputs.
``build_lut16`` runs eager's op once on every bit pattern, on the device and torch that will run the
model, and keeps the outputs: the kernel then looks each input up instead of recomputing it, so its
output is eager's, whatever eager's kernel computes (gelu-tanh's ``tanhf``, erf's ``erff``, ...).

Table layout, per sign (positive first, then negative; K slots each), by the input's magnitude bits m:

- slots 0..255: m < 256 (zero, the subnormals, the smallest normal binade: each its own entry);
- slot 256: 256 <= m < LO, one *rule* for all of them;
- slots 257..256 + SPAN: the window LO <= m < LO + SPAN, each its own entry;
- slot 257 + SPAN: LO + SPAN <= m < inf's magnitude, one rule;
- the last slots: inf and the NaN payloads, each its own entry (128 for bf16, 1024 for fp16).

The slot is a min/max chain of m (monotone), and every entry is (mask << 16) | value with output
``(b & mask) + value`` (low 16 bits) for the input pattern b: an entry of its own has mask 0; a rule is
``x`` (0xFFFF, 0), a signed zero (0x8000, 0), a constant c (0, c) or ``0.5 * x`` for normal results
(0xFFFF, -(1 << mantissa bits)). ``build_lut16`` picks, per sign, the rules covering the most
magnitudes below and above the window, and refuses (None, with the reason) when the window is wider
than the largest table allows: then the op keeps its arithmetic recipe. gelu-tanh on bf16: small ``0.5 * x``,
large ``x`` (positive) / signed zero (negative).

Numerics contract: for every one of the 65,536 inputs the kernel's output bits are the table's, i.e.
eager's; ``tests/gpu/test_lut16_gpu.py`` checks all 65,536 on the GPU against eager, and
``tests/kernels/test_lut16.py`` the same on the CPU (Triton's interpreter, CPU eager as the table).
Gather: the table is one [TABLE] int32 register tensor per program, read through shared memory by
``tl.gather`` (TABLE 4096 or 8192: 16 or 32 KB of shared memory, the smaller that fits).
"""

from __future__ import annotations

import dataclasses

import torch

from .optional_triton import tl, triton

TABLES = (4096, 8192)  # entries (int32; 16 or 32 KB): two signs of K = 256 + 1 + SPAN + 1 + specials slots
SUBNORMAL_SLOTS = 256
EXP_ALL_ONES = {torch.bfloat16: 0x7F80, torch.float16: 0x7C00}  # magnitudes >= this: inf, NaN
MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10}


@dataclasses.dataclass(frozen=True)
class Lut16:
    """A 16-bit op's table (layout above) and its window [lo, lo + span); rules: (mask, value) per
    sign and side, kept for the report."""

    table: torch.Tensor  # int32 [TABLE] on the device
    lo: int
    span: int
    small: tuple[tuple[int, int], tuple[int, int]]
    large: tuple[tuple[int, int], tuple[int, int]]
    special: int  # EXP_ALL_ONES of the dtype

    def constexprs(self) -> dict[str, int]:
        return dict(LO=self.lo, SPAN=self.span, SPECIAL=self.special, TABLE=self.table.numel())

    def describe(self) -> str:
        return (f"table: window of {self.span} magnitudes from {self.lo:#06x}; rules below "
                f"{[rule_name(r) for r in self.small]}, above {[rule_name(r) for r in self.large]}")


def rule_name(rule: tuple[int, int]) -> str:
    mask, value = rule
    return {0xFFFF: "x" if value == 0 else "0.5 * x", 0x8000: "signed zero"}.get(mask, f"{value:#06x}")


def all_patterns(dtype: torch.dtype, device) -> torch.Tensor:
    """Every 16-bit pattern as a ``dtype`` tensor, pattern i at index i."""
    return torch.arange(65536, dtype=torch.int32, device=device).to(torch.int16).view(dtype)


def apply_entry(b: torch.Tensor, entry: torch.Tensor | int) -> torch.Tensor:
    """The kernel's output for patterns b (int32 in [0, 65536)) and table entries (mask << 16 | value)."""
    return ((b & (entry >> 16)) + entry) & 0xFFFF


def _rules(mb: int, edge_out: int) -> list[tuple[int, int]]:
    return [(0xFFFF, 0), (0x8000, 0), (0xFFFF, (-(1 << mb)) & 0xFFFF), (0, edge_out)]


def _longest(b: torch.Tensor, want: torch.Tensor, rules) -> tuple[tuple[int, int], int]:
    """The rule matching ``want`` on the longest prefix of ``b``, and that prefix's length."""
    best = (rules[0], 0)
    for mask, value in rules:
        ok = apply_entry(b, (mask << 16) | value) == want
        n = int(ok.numel()) if bool(ok.all()) else int(torch.argmin(ok.to(torch.int8)).item())
        if n > best[1]:
            best = ((mask, value), n)
    return best


def build_lut16(op, dtype: torch.dtype, device) -> tuple[Lut16 | None, str]:
    """The table of ``op`` (eager, on ``device``) over every ``dtype`` pattern, or (None, why not)."""
    if dtype not in EXP_ALL_ONES:
        return None, f"lut16 takes bf16/fp16 inputs, not {dtype}"
    x = all_patterns(dtype, device)
    y = op(x)
    if y.dtype != dtype or y.shape != x.shape:
        return None, f"lut16: the op returns {y.dtype}{list(y.shape)} for {dtype}{list(x.shape)}"
    out = y.view(torch.int16).to(torch.int32) & 0xFFFF
    b_all = x.view(torch.int16).to(torch.int32) & 0xFFFF
    special, mb = EXP_ALL_ONES[dtype], MANTISSA_BITS[dtype]
    small, large, bounds = [], [], []
    for sign in (0, 0x8000):
        mags = torch.arange(SUBNORMAL_SLOTS, special, device=device) + sign
        b, want = b_all[mags], out[mags]
        rs, ns = _longest(b, want, _rules(mb, int(want[0])))
        rl, nl = _longest(b.flip(0), want.flip(0), _rules(mb, int(want[-1])))
        small.append(rs)
        large.append(rl)
        bounds.append((SUBNORMAL_SLOTS + ns, special - nl))
    lo, hi = min(a for a, _ in bounds), max(h for _, h in bounds)
    lo = min(lo, hi)  # both rules cover every magnitude between: an empty window at hi (< special)
    span = hi - lo
    k = SUBNORMAL_SLOTS + 2 + span + (0x8000 - special)
    size = next((t for t in TABLES if 2 * k <= t), None)
    if size is None:
        return None, (f"lut16: {span} magnitudes between the rules' ranges "
                      f"(at most {TABLES[-1] // 2 - SUBNORMAL_SLOTS - 2 - (0x8000 - special)})")
    table = torch.zeros(size, dtype=torch.int64, device=device)
    for s, sign in enumerate((0, 0x8000)):
        base = s * k
        table[base:base + SUBNORMAL_SLOTS] = out[torch.arange(SUBNORMAL_SLOTS, device=device) + sign]
        table[base + SUBNORMAL_SLOTS] = (small[s][0] << 16) | small[s][1]
        table[base + SUBNORMAL_SLOTS + 1:base + SUBNORMAL_SLOTS + 1 + span] = out[
            torch.arange(lo, hi, device=device) + sign]
        table[base + SUBNORMAL_SLOTS + 1 + span] = (large[s][0] << 16) | large[s][1]
        table[base + SUBNORMAL_SLOTS + 2 + span:base + k] = out[torch.arange(special, 0x8000, device=device) + sign]
    lut = Lut16(table.to(torch.int32), lo, span, (small[0], small[1]), (large[0], large[1]), special)
    return lut, ""


@triton.jit
def lut16_slot(m, LO: tl.constexpr, SPAN: tl.constexpr, SPECIAL: tl.constexpr):
    """A magnitude's slot within its sign's K slots (the layout in the module docstring; LO + SPAN < SPECIAL)."""
    top = SPAN + 1 + tl.maximum(m - (SPECIAL - 1), 0)  # the large-rule slot, or inf's / a NaN's own
    inner = tl.maximum(tl.minimum(m - (LO - 1), top), 0)  # 0: small rule, 1..SPAN: window
    return tl.minimum(m, 256 + inner)


@triton.jit
def lut16_apply(b, lut, LO: tl.constexpr, SPAN: tl.constexpr, SPECIAL: tl.constexpr):
    """Output patterns (int32, low 16 bits) for input patterns ``b`` (int32 in [0, 65536), any 1-D block)."""
    K: tl.constexpr = 256 + 2 + SPAN + (0x8000 - SPECIAL)
    idx = lut16_slot(b & 0x7FFF, LO, SPAN, SPECIAL) + (b >> 15) * K
    entry = tl.gather(lut, idx, 0)
    return (b & (entry >> 16)) + entry


@triton.jit
def _lut16_kernel(X, O, LUT, n, LO: tl.constexpr, SPAN: tl.constexpr, SPECIAL: tl.constexpr,
                  TABLE: tl.constexpr, BLOCK: tl.constexpr):
    lut = tl.load(LUT + tl.arange(0, TABLE))
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    b = tl.load(X.to(tl.pointer_type(tl.uint16)) + offs, mask=mask, other=0).to(tl.int32)
    r = lut16_apply(b, lut, LO, SPAN, SPECIAL)
    tl.store(O.to(tl.pointer_type(tl.uint16)) + offs, r.to(tl.uint16), mask=mask)


def lut16_triton(x: torch.Tensor, lut: Lut16, block: int = 2048, num_warps: int = 4) -> torch.Tensor:
    """The table applied to contiguous ``x`` (tests, benchmarks)."""
    from .launch import EAGER_NUMERICS

    out = torch.empty_like(x)
    n = x.numel()
    _lut16_kernel[(triton.cdiv(n, block),)](x, out, lut.table, n, **lut.constexprs(), BLOCK=block,
                                            num_warps=num_warps, **EAGER_NUMERICS)
    return out
