"""Triton kernel for ``diffusion_fuse::depthwise_conv``: a 2-D depthwise convolution (one filter a channel, stride
1, no dilation) in the order of the kernel eager runs for it.

Numerics contract (lossless tier): per output element, in fp32 and rounded once to x's dtype::

    acc = bias (BIAS_FIRST: the bias itself, so a -0 bias stays -0) or 0
    for each tap (i, j) in the order ``TAP_ORDER`` names, skipping taps that fall in the padding (SKIP)
    or adding their zero product (not SKIP):
        acc = acc + w[c, i, j] * x[n, c, h + i - pad_h, w + j - pad_w]
    y = round(acc)
    y = round(float(y) + float(bias))            # bias added after the convolution (not BIAS_FIRST)

With the GLU tail (``glu_gate`` 0 or 1: the half of the channels that is the gate), per output channel c of C / 2,
value v and gate g being y at channels c and c + C / 2 (or the other way round), each op rounded as eager's::

    s = round(div_rn(g, 1 + expf(-g)))           # silu (ActivationSiluKernel; libdevice __nv_expf, -g as neg.f32)
    out = round(float(v) * float(s))             # mul

A product of two bf16 or two fp16 values is exact in fp32, so an FMA and a multiply then add agree and only
the order of the adds and where the bias enters decide the bits. ATen runs cuDNN for a channels-last input
and a contiguous fp16 one (``use_cudnn_depthwise``; the bias is a separate ``add_``, Convolution.cpp), and its own
``conv_depthwise2d_forward_kernel`` for a contiguous bf16 one (from the bias, the taps row-major, out-of-range
taps skipped). Which candidate (``CANDIDATES``: row-major, padding skipped, the bias after or first) a layout's
eager kernel matches is found once per layout and cuDNN flags by running eager on a wide-range draw of that
layout (``eager_order``); a layout that no single candidate matches runs eager's convolution, and so does one
under ``cudnn.benchmark`` (cuDNN then picks its kernel by timing). ``ORDERS`` are the forms the kernel takes.

Two kernels, one per layout, each loading the filters once a program. For a channels-last x (what a 1 x 1
convolution before it leaves: SANA's GLUMBConv), ``depthwise_conv_cl_kernel`` computes ``ROWS`` output rows of
``BLOCK_C`` channels one output column at a time: every load is a vector of a row's adjacent channels,
and the input columns under the filter slide along with the output column, so each step loads one new column and
every input is loaded once per filter row. For a contiguous x, ``depthwise_conv_kernel`` computes ``ROWS`` output
rows of ``BLOCK_C`` channels, ``BLOCK_W`` columns at a time, loading every input under the filter for each output
row (the rows above come from the cache). With the GLU a program convolves the value's and the gate's channels
and writes only the product: the convolution's output never goes to memory. fp32 inputs are not taken: their
products are not exact (an FMA and a multiply then add differ), and cuDNN convolves them in TF32 by default.
"""

from __future__ import annotations

import torch

from . import triton_interpret
from .launch import CachedLaunch
from .optional_triton import tl, triton

try:
    from triton.language.extra import libdevice
except ImportError:  # no Triton: the kernels are never launched
    libdevice = None

DTYPES = (torch.bfloat16, torch.float16)
MAX_K = 7  # filter sizes up to 7 x 7 (the taps are unrolled)
ROW_MAJOR, COL_MAJOR = 0, 1
# (tap order, bias first, skip the padding's taps): the orders eager's kernels were found to sum in (H100, torch
# 2.11: cuDNN's conv2d_c1_k1_nhwc / _nchw_shmem_tiling row-major with the bias after, ATen's own kernel row-major
# from the bias); each layout's is found among them on first use. The kernel also takes the others (tests).
CANDIDATES = ((ROW_MAJOR, False, True), (ROW_MAJOR, True, True))
ORDERS = tuple((o, bf, skip) for bf in (False, True) for o in (ROW_MAJOR, COL_MAJOR) for skip in (True, False))
BLOCK_C, MAX_BLOCK_W, ROWS, NUM_WARPS = 64, 32, 8, 4  # contiguous x
# channels-last x, (BLOCK_C, ROWS, num_warps) without and with the GLU tail: the fastest bitwise constants of a
# sweep at SANA's [2, 11200, 32, 32] and [1, 11200, 64, 64] (H100); the GLU's two input tiles want smaller programs
CL_CONSTANTS = {False: (256, 4, 4), True: (64, 2, 4)}
NO_GLU = -1  # glu_gate without the GLU tail


@triton.jit
def _load_taps(Wt, c, c_ok, KH: tl.constexpr, KW: tl.constexpr):
    """The filters of channels c, ``taps[i][j]`` tap (i, j) in fp32 and c's shape (loaded once a program)."""
    taps = ()
    for i in tl.static_range(KH):
        row = ()
        for j in tl.static_range(KW):
            row = row + (tl.load(Wt + c * (KH * KW) + (i * KW + j), mask=c_ok, other=0.0).to(tl.float32),)
        taps = taps + (row,)
    return taps


@triton.jit
def _load_filters(Wt, B, cv, cg, c_ok, KH: tl.constexpr, KW: tl.constexpr, HAS_BIAS: tl.constexpr,
                  GLU: tl.constexpr):
    """(taps, bias) of the value's channels cv and of the gate's cg (the value's again without the GLU)."""
    taps_v = _load_taps(Wt, cv, c_ok, KH, KW)
    taps_g = taps_v
    bias_v = 0.0
    bias_g = 0.0
    if HAS_BIAS:
        bias_v = tl.load(B + cv, mask=c_ok, other=0.0).to(tl.float32)
    if GLU:
        taps_g = _load_taps(Wt, cg, c_ok, KH, KW)
        if HAS_BIAS:
            bias_g = tl.load(B + cg, mask=c_ok, other=0.0).to(tl.float32)
    return taps_v, bias_v, taps_g, bias_g


@triton.jit
def _rows_inside(h, H, KH: tl.constexpr, PAD_H: tl.constexpr):
    """Whether the input row under filter row i of output rows h lies in x, a tuple over i."""
    rows = ()
    for i in tl.static_range(KH):
        rows = rows + ((h + i - PAD_H >= 0) & (h + i - PAD_H < H),)
    return rows


@triton.jit
def _input(x_base, h_in, w_in, W, xs_h, xs_w, c_ok, row_ok):
    """x at row h_in and column w_in in fp32, 0 outside x."""
    ok = c_ok & row_ok & (w_in >= 0) & (w_in < W)
    return tl.load(x_base + h_in * xs_h + w_in * xs_w, mask=ok, other=0.0).to(tl.float32)


@triton.jit
def _input_column(x_base, h, w_in, W, xs_h, xs_w, c_ok, rows_ok, KH: tl.constexpr, PAD_H: tl.constexpr):
    """Input column ``w_in`` under the KH filter rows of output rows h, a tuple over the filter rows."""
    col = ()
    for i in tl.static_range(KH):
        col = col + (_input(x_base, h + i - PAD_H, w_in, W, xs_h, xs_w, c_ok, rows_ok[i]),)
    return col


@triton.jit
def _start(bias, SHAPE0: tl.constexpr, SHAPE1: tl.constexpr, HAS_BIAS: tl.constexpr, BIAS_FIRST: tl.constexpr):
    """The sums' first value: the bias itself (not 0 + bias: a -0 bias stays -0), or 0."""
    if HAS_BIAS and BIAS_FIRST:
        acc = tl.broadcast_to(bias, (SHAPE0, SHAPE1))
    else:
        acc = tl.zeros((SHAPE0, SHAPE1), tl.float32)
    return acc


@triton.jit
def _add_tap(acc, wv, xv, row_ok, w_in, W, SKIP: tl.constexpr):
    """acc plus one tap's product: skipped where the tap lies in the padding (SKIP), else its zero added."""
    if SKIP:
        acc = tl.where(row_ok & (w_in >= 0) & (w_in < W), acc + wv * xv, acc)
    else:
        acc = acc + wv * xv
    return acc


@triton.jit
def _finish(acc, bias, HAS_BIAS: tl.constexpr, BIAS_FIRST: tl.constexpr, DTYPE: tl.constexpr):
    """The sums rounded to DTYPE, the bias added after them (rounded again) unless it came first; in fp32."""
    y = acc.to(DTYPE)
    if HAS_BIAS and not BIAS_FIRST:
        y = (y.to(tl.float32) + bias).to(DTYPE)
    return y.to(tl.float32)


@triton.jit
def _window_sums(window, rows_ok, w, W, taps, bias, SHAPE0: tl.constexpr, SHAPE1: tl.constexpr, KH: tl.constexpr,
                 KW: tl.constexpr, PAD_W: tl.constexpr, HAS_BIAS: tl.constexpr, BIAS_FIRST: tl.constexpr,
                 TAP_ORDER: tl.constexpr, SKIP: tl.constexpr, DTYPE: tl.constexpr):
    """The contract's outputs of a [SHAPE0, SHAPE1] tile at columns w from the inputs already loaded:
    ``window[j][i]`` is the input under tap (i, j), ``rows_ok[i]`` whether its row lies in x (``_rows_inside``),
    ``taps[i][j]`` the weight."""
    acc = _start(bias, SHAPE0, SHAPE1, HAS_BIAS, BIAS_FIRST)
    if TAP_ORDER == 0:
        for i in tl.static_range(KH):
            for j in tl.static_range(KW):
                acc = _add_tap(acc, taps[i][j], window[j][i], rows_ok[i], w + j - PAD_W, W, SKIP)
    else:
        for j in tl.static_range(KW):
            for i in tl.static_range(KH):
                acc = _add_tap(acc, taps[i][j], window[j][i], rows_ok[i], w + j - PAD_W, W, SKIP)
    return _finish(acc, bias, HAS_BIAS, BIAS_FIRST, DTYPE)


@triton.jit
def _conv_tile(x_base, taps, bias, h, w, H, W, xs_h, xs_w, c_ok, KH: tl.constexpr, KW: tl.constexpr,
               PAD_H: tl.constexpr, PAD_W: tl.constexpr, SHAPE0: tl.constexpr, SHAPE1: tl.constexpr,
               HAS_BIAS: tl.constexpr, BIAS_FIRST: tl.constexpr, TAP_ORDER: tl.constexpr, SKIP: tl.constexpr,
               DTYPE: tl.constexpr):
    """The contract's outputs of a [SHAPE0, SHAPE1] tile at row h and columns w, each tap's inputs loaded in its
    turn (not a window held whole: a [channels, columns] tile's window would take too many registers)."""
    rows_ok = _rows_inside(h, H, KH, PAD_H)
    acc = _start(bias, SHAPE0, SHAPE1, HAS_BIAS, BIAS_FIRST)
    if TAP_ORDER == 0:
        for i in tl.static_range(KH):
            for j in tl.static_range(KW):
                xv = _input(x_base, h + i - PAD_H, w + j - PAD_W, W, xs_h, xs_w, c_ok, rows_ok[i])
                acc = _add_tap(acc, taps[i][j], xv, rows_ok[i], w + j - PAD_W, W, SKIP)
    else:
        for j in tl.static_range(KW):
            for i in tl.static_range(KH):
                xv = _input(x_base, h + i - PAD_H, w + j - PAD_W, W, xs_h, xs_w, c_ok, rows_ok[i])
                acc = _add_tap(acc, taps[i][j], xv, rows_ok[i], w + j - PAD_W, W, SKIP)
    return _finish(acc, bias, HAS_BIAS, BIAS_FIRST, DTYPE)


@triton.jit
def _times_silu(y, g, DTYPE: tl.constexpr, INTERPRETED: tl.constexpr):
    """``y * silu(g)``, each op rounded to DTYPE as eager's: silu is ``div_rn(g, 1 + expf(-g))``."""
    if INTERPRETED:  # no PTX, no libdevice: the sign flip and Triton's exp (logic only)
        neg_g = (g.to(tl.int32, bitcast=True) ^ -2147483648).to(tl.float32, bitcast=True)
        e = tl.math.exp(neg_g)
    else:  # -g as C++ negates it (Triton's -g is 0 - g), eager's expf
        neg_g = tl.inline_asm_elementwise("neg.f32 $0, $1;", "=f,f", [g], dtype=tl.float32, is_pure=True, pack=1)
        e = libdevice.exp(neg_g)
    s = tl.math.div_rn(g, 1.0 + e).to(DTYPE).to(tl.float32)
    return y * s


@triton.jit
def depthwise_conv_kernel(X, Wt, B, Y, C_OUT, H, W, H_OUT, W_OUT, xs_n, xs_c, xs_h, xs_w, ys_n, ys_c, ys_h, ys_w,
                          h_blocks, value_off, gate_off, KH: tl.constexpr, KW: tl.constexpr, PAD_H: tl.constexpr,
                          PAD_W: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_W: tl.constexpr, ROWS: tl.constexpr,
                          HAS_BIAS: tl.constexpr, BIAS_FIRST: tl.constexpr, TAP_ORDER: tl.constexpr,
                          SKIP: tl.constexpr, GLU: tl.constexpr, INTERPRETED: tl.constexpr):
    """Contiguous x: ``ROWS`` output rows of ``BLOCK_C`` channels, each row ``BLOCK_W`` columns at a time."""
    pid = tl.program_id(0)  # batch x row blocks on the axis without the 65535 limit
    n = pid // h_blocks
    h0 = (pid % h_blocks) * ROWS
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)[:, None]  # output channels
    c_ok = c < C_OUT
    cv = c + value_off  # the convolution's channels of the value (all of them without GLU) and of the gate
    cg = c + gate_off
    x_nv = X + n.to(tl.int64) * xs_n + cv.to(tl.int64) * xs_c
    x_ng = X + n.to(tl.int64) * xs_n + cg.to(tl.int64) * xs_c
    y_nc = Y + n.to(tl.int64) * ys_n + c.to(tl.int64) * ys_c
    taps_v, bias_v, taps_g, bias_g = _load_filters(Wt, B, cv, cg, c_ok, KH, KW, HAS_BIAS, GLU)
    w0 = 0
    while w0 < W_OUT:  # a while loop: the interpreter cannot take a runtime bound in range()
        w = w0 + tl.arange(0, BLOCK_W)[None, :]
        for r in range(ROWS):  # a loop, not unrolled: the taps already are
            h = h0 + r
            y = _conv_tile(x_nv, taps_v, bias_v, h, w, H, W, xs_h, xs_w, c_ok, KH, KW, PAD_H, PAD_W, BLOCK_C,
                           BLOCK_W, HAS_BIAS, BIAS_FIRST, TAP_ORDER, SKIP, Y.dtype.element_ty)
            if GLU:
                g = _conv_tile(x_ng, taps_g, bias_g, h, w, H, W, xs_h, xs_w, c_ok, KH, KW, PAD_H, PAD_W, BLOCK_C,
                               BLOCK_W, HAS_BIAS, BIAS_FIRST, TAP_ORDER, SKIP, Y.dtype.element_ty)
                y = _times_silu(y, g, Y.dtype.element_ty, INTERPRETED)
            tl.store(y_nc + h * ys_h + w * ys_w, y.to(Y.dtype.element_ty), mask=c_ok & (h < H_OUT) & (w < W_OUT))
        w0 += BLOCK_W


@triton.jit
def depthwise_conv_cl_kernel(X, Wt, B, Y, C_OUT, H, W, H_OUT, W_OUT, xs_n, xs_h, xs_w, ys_n, ys_h, ys_w, h_blocks,
                             value_off, gate_off, KH: tl.constexpr, KW: tl.constexpr, PAD_H: tl.constexpr,
                             PAD_W: tl.constexpr, BLOCK_C: tl.constexpr, ROWS: tl.constexpr,
                             HAS_BIAS: tl.constexpr, BIAS_FIRST: tl.constexpr, TAP_ORDER: tl.constexpr,
                             SKIP: tl.constexpr, GLU: tl.constexpr, INTERPRETED: tl.constexpr):
    """Channels-last x (unit channel stride): ``ROWS`` output rows of ``BLOCK_C`` channels, one output column at a
    time. Every load is a vector of a row's adjacent channels; the input columns under the filter slide along with
    the output column (``_drop_first``), so a step loads one new column."""
    pid = tl.program_id(0)
    n = pid // h_blocks
    h = (pid % h_blocks) * ROWS + tl.arange(0, ROWS)[:, None]
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
    c_ok = c < C_OUT
    cv = c + value_off
    cg = c + gate_off
    x_n = X + n.to(tl.int64) * xs_n
    y_n = Y + n.to(tl.int64) * ys_n + c
    # the filters and biases in the tile's own layout ([ROWS, BLOCK_C], every row alike): used as they are in the
    # loop, where a [1, BLOCK_C] vector would be moved into that layout through shared memory at every tap
    tile_cv = cv + 0 * h
    tile_cg = cg + 0 * h
    tile_ok = c_ok & (h >= 0)
    taps_v, bias_v, taps_g, bias_g = _load_filters(Wt, B, tile_cv, tile_cg, tile_ok, KH, KW, HAS_BIAS, GLU)
    # the input columns under the filter's first KW - 1 columns at output column 0; each step loads the last one
    # and drops the first, so every input is loaded once per filter row
    rows_ok = _rows_inside(h, H, KH, PAD_H)
    win_v = ()
    win_g = ()
    for j in tl.static_range(KW - 1):
        win_v = win_v + (_input_column(x_n + cv, h, j - PAD_W, W, xs_h, xs_w, c_ok, rows_ok, KH, PAD_H),)
        if GLU:
            win_g = win_g + (_input_column(x_n + cg, h, j - PAD_W, W, xs_h, xs_w, c_ok, rows_ok, KH, PAD_H),)
    w = 0
    while w < W_OUT:
        w_in = w + KW - 1 - PAD_W
        win_v = win_v + (_input_column(x_n + cv, h, w_in, W, xs_h, xs_w, c_ok, rows_ok, KH, PAD_H),)
        y = _window_sums(win_v, rows_ok, w, W, taps_v, bias_v, ROWS, BLOCK_C, KH, KW, PAD_W, HAS_BIAS, BIAS_FIRST,
                         TAP_ORDER, SKIP, Y.dtype.element_ty)
        win_v = _drop_first(win_v, KW)
        if GLU:
            win_g = win_g + (_input_column(x_n + cg, h, w_in, W, xs_h, xs_w, c_ok, rows_ok, KH, PAD_H),)
            g = _window_sums(win_g, rows_ok, w, W, taps_g, bias_g, ROWS, BLOCK_C, KH, KW, PAD_W, HAS_BIAS,
                             BIAS_FIRST, TAP_ORDER, SKIP, Y.dtype.element_ty)
            win_g = _drop_first(win_g, KW)
            y = _times_silu(y, g, Y.dtype.element_ty, INTERPRETED)
        tl.store(y_n + h * ys_h + w * ys_w, y.to(Y.dtype.element_ty), mask=c_ok & (h < H_OUT))
        w += 1


@triton.jit
def _drop_first(t, N: tl.constexpr):
    """(t[1], ..., t[N - 1]) of an N-tuple."""
    rest = ()
    for k in tl.static_range(1, N):
        rest = rest + (t[k],)
    return rest


def output_strides(x: torch.Tensor, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Eager's output layout: channels-last for a channels-last input (cuDNN keeps it), else contiguous."""
    n, c, h, w = shape
    if channels_last(x):
        return (h * w * c, 1, w * c, c)
    return (c * h * w, h * w, w, 1)


def channels_last(x: torch.Tensor) -> bool:
    return not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)


def plan_depthwise_conv(x: torch.Tensor, weight: torch.Tensor, has_bias: bool, padding: tuple[int, int],
                        order: tuple[int, bool, bool], glu_gate: int = NO_GLU):
    """launch(x, weight, bias) -> y for this layout, summing in ``order`` (tap order, bias first, skip); with
    ``glu_gate`` 0 or 1, y is ``value * silu(gate)`` of the convolution's channel halves, the gate half that one."""
    n, c, h, w = x.shape
    kh, kw = weight.shape[-2:]
    ph, pw = padding
    c_out = c if glu_gate == NO_GLU else c // 2
    shape = (n, c_out, h + 2 * ph - kh + 1, w + 2 * pw - kw + 1)
    strides = output_strides(x, shape)
    tap_order, bias_first, skip = order
    value_off, gate_off = {NO_GLU: (0, 0), 0: (c_out, 0), 1: (0, c_out)}[glu_gate]
    const = dict(KH=kh, KW=kw, PAD_H=ph, PAD_W=pw, HAS_BIAS=has_bias, BIAS_FIRST=bias_first, TAP_ORDER=tap_order,
                 SKIP=skip, GLU=glu_gate != NO_GLU, INTERPRETED=triton_interpret())
    cl = channels_last(x)
    if cl:
        block_c, rows, warps = CL_CONSTANTS[glu_gate != NO_GLU]
        h_blocks = triton.cdiv(shape[2], rows)
        kernel = CachedLaunch(depthwise_conv_cl_kernel, (n * h_blocks, triton.cdiv(c_out, block_c)),
                              dict(const, BLOCK_C=block_c, ROWS=rows), num_warps=warps)
    else:
        h_blocks = triton.cdiv(shape[2], ROWS)
        block_w = min(triton.next_power_of_2(shape[3]), MAX_BLOCK_W)
        kernel = CachedLaunch(depthwise_conv_kernel, (n * h_blocks, triton.cdiv(c_out, BLOCK_C)),
                              dict(const, BLOCK_C=BLOCK_C, BLOCK_W=block_w, ROWS=ROWS), num_warps=NUM_WARPS)

    def launch(x, weight, bias):
        y = torch.empty_strided(shape, strides, dtype=x.dtype, device=x.device)
        xs, ys = x.stride(), strides
        if cl:  # unit channel strides (checked by channels_last): the kernel adds the channel itself
            xs, ys = (xs[0], *xs[2:]), (ys[0], *ys[2:])
        kernel(x, weight, bias if bias is not None else weight, y, c_out, h, w, shape[2], shape[3], *xs, *ys,
               h_blocks, value_off, gate_off)
        return y

    return launch


_orders: dict[tuple, tuple[int, bool, bool] | None] = {}
MAX_ORDERS = 4096  # layouts remembered (as dispatch's plans)


def _draw(x: torch.Tensor, weight: torch.Tensor, has_bias: bool, seed: int = 0):
    """Inputs of x's and weight's layout whose sums round differently in each candidate order: magnitudes over
    2**-8..2**8, and the first filter-height rows zero (negative zero in every other channel) so that the outputs
    next to them sum zeros. Every fourth channel has positive weights, negative zeros there and a negative-zero
    bias: its zero sums are -0 from the bias and +0 from 0 with the bias added after."""
    g = torch.Generator(device=x.device).manual_seed(seed)

    def wide(t: torch.Tensor) -> torch.Tensor:
        v = torch.randn(t.shape, generator=g, device=t.device)
        v = v * torch.exp2(torch.randint(-8, 9, t.shape, generator=g, device=t.device).float())
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(v)

    xs, ws = wide(x), wide(weight)
    kh = weight.shape[-2]  # zero rows enough for a window of them, whatever the padding
    xs[:, :, :kh] = 0.0
    xs[:, 1::2, :kh] = -0.0
    xs[:, ::4, :kh] = -0.0
    ws[::4] = ws[::4].abs()
    b = wide(weight.new_empty(weight.shape[0])) if has_bias else None
    if b is not None:
        b[::4] = -0.0
    return xs, ws, b


def cudnn_flags() -> tuple[bool, bool, bool]:
    """What decides which kernel eager's convolution runs, beside the layout."""
    return torch.backends.cudnn.enabled, torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic


def eager_order(x: torch.Tensor, weight: torch.Tensor, has_bias: bool, padding: tuple[int, int]):
    """The candidate order (tap order, bias first, skip) that alone gives eager's bits on a wide-range draw of this
    layout, or None (none does, or the draw cannot tell two apart); cached per layout and cuDNN flags. It runs
    eager's convolution and the kernel, so it is not asked inside a CUDA graph capture (None there until known)."""
    key = (x.device, x.dtype, tuple(x.shape), x.stride(), tuple(weight.shape), weight.stride(), has_bias, padding,
           cudnn_flags())
    if key in _orders:
        return _orders[key]
    if x.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None
    xs, ws, b = _draw(x, weight, has_bias)
    want = torch.ops.aten.convolution(xs, ws, b, [1, 1], list(padding), [1, 1], False, [0, 0], x.shape[1])
    bits = torch.int16
    found = []
    # without a bias the candidates differ in where it enters only
    for order in CANDIDATES if has_bias else CANDIDATES[:1]:
        got = plan_depthwise_conv(x, weight, has_bias, padding, order)(xs, ws, b)
        if got.stride() == want.stride() and torch.equal(got.view(bits), want.view(bits)):
            found.append(order)
    if len(_orders) >= MAX_ORDERS:
        _orders.clear()
    _orders[key] = found[0] if len(found) == 1 else None
    return _orders[key]


def can_use_depthwise_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                           padding: tuple[int, int], glu_gate: int = NO_GLU) -> tuple[bool, str]:
    """Whether the kernel gives eager's bits for this convolution (the contract above); else the reason."""
    if x.device.type != "cuda" and not (x.device.type == "cpu" and triton_interpret()):
        return False, f"device is {x.device.type}"
    tensors = [t for t in (weight, bias) if t is not None]
    if x.dtype not in DTYPES or any(t.dtype != x.dtype or t.device != x.device for t in tensors):
        return False, f"dtypes (kernel takes x, weight and bias of one dtype among {[str(d) for d in DTYPES]})"
    if x.dim() != 4 or weight.dim() != 4 or weight.shape[:2] != (x.shape[1], 1):
        return False, f"x {tuple(x.shape)}, weight {tuple(weight.shape)}: not one filter a channel"
    kh, kw = weight.shape[-2:]
    if kh > MAX_K or kw > MAX_K or not weight.is_contiguous() or (bias is not None and not bias.is_contiguous()):
        return False, f"filter {kh}x{kw} (kernel takes contiguous filters up to {MAX_K}x{MAX_K}, a contiguous bias)"
    if glu_gate not in (NO_GLU, 0, 1) or (glu_gate != NO_GLU and x.shape[1] % 2):
        return False, f"GLU gate half {glu_gate} of {x.shape[1]} channels (the kernel takes 0 or 1 of an even count)"
    if not (x.is_contiguous() or channels_last(x)):
        return False, "x neither contiguous nor channels-last (eager's backend then depends on more)"
    h_out, w_out = x.shape[2] + 2 * padding[0] - kh + 1, x.shape[3] + 2 * padding[1] - kw + 1
    out_numel = x.shape[0] * x.shape[1] * h_out * w_out
    if x.numel() == 0 or max(x.numel(), out_numel) >= 2**31 or h_out <= 0 or w_out <= 0:
        return False, f"{x.numel()} elements in, {out_numel} out (kernel takes 1 to 2**31 - 1)"
    if x.device.type != "cuda":
        return True, ""
    if any(t.data_ptr() % 16 for t in (x, *tensors)):
        return False, "an operand not 16-byte aligned (eager's order is found on aligned tensors)"
    if torch.backends.cudnn.benchmark:
        return False, "torch.backends.cudnn.benchmark is on: cuDNN picks its kernel by timing, so its order may vary"
    try:
        order = eager_order(x, weight, bias is not None, padding)
    except Exception as e:  # noqa: BLE001 - finding the order runs eager and the kernel: never the forward's error
        return False, f"finding eager's order failed: {type(e).__name__}: {e}"
    if order is None:
        return False, "eager's convolution for this layout sums in no one order the kernel knows"
    return True, ""
