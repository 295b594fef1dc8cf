"""The pointwise pass (fxpasses/pointwise.py): which ops it groups, what each group reads and writes.

CPU: every op call takes the reference path (the group's ATen subgraph), so outputs equal
eager by construction; these tests check the grouping itself, the generated index arithmetic
(kernels/pointwise.py, no interpreter needed to read the source) and the plumbing
(options, tier high, the verifier putting a group back). The kernels run in
tests/kernels/test_pointwise_kernel.py (interpreter) and tests/gpu/test_pointwise_gpu.py.
"""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from helpers import bitwise_equal, compile_and_run

import diffusion_fuse
from diffusion_fuse.kernels.pointwise import Generator, Lin, Term, flatten
from diffusion_fuse.lowering import faults
from diffusion_fuse.lowering.pointwise import PROGRAMS, generate_source
from diffusion_fuse.testing import pointwise as pw
from diffusion_fuse.testing.tiny_models import build

bf16, f32 = torch.bfloat16, torch.float32


def rn(*shape, dtype=bf16, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def ops_of(site) -> list[str]:
    return pw.site_ops(site)


def pointwise_calls(gm) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.target is torch.ops.diffusion_fuse.pointwise.default]


def run(gm, fn, args):
    ref, got = fn(*args), gm(*args)
    assert bitwise_equal(ref, got)
    return got


# --- grouping ---------------------------------------------------------------------------------
def test_rope_with_its_cat_is_one_group_reading_the_inputs_once():
    args = (rn(1, 8, 2, 16), rn(1, 16, 2, 16), rn(24, 1, 16, dtype=f32), rn(24, 1, 16, dtype=f32))
    gm, sites = pw.fuse(pw.rope_double, *args)
    (site,) = sites
    assert ops_of(site) == ["cat", "neg", "stack", "_to_copy", "mul", "_to_copy", "mul", "add", "_to_copy"]
    (call,) = pointwise_calls(gm)
    assert [a.name for a in call.args[0]] == [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    # nothing but the op (and the getitem of its one output) is left of the chain
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"] == [call.target, operator.getitem]
    run(gm, pw.rope_double, args)


def test_rope_reads_x_once_and_takes_each_pair_partner_from_registers():
    args = (rn(1, 24, 2, 16), rn(24, 1, 16, dtype=f32), rn(24, 1, 16, dtype=f32))
    gm, (site,) = pw.fuse(pw.rope, *args)
    (call,) = pointwise_calls(gm)
    # x's reshape + unbind joined the group (it reads x itself too): x, cos and sin are its only inputs
    assert [a.name for a in call.args[0]] == [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    src = generate_source(list(args), call.args[1]).source
    assert src.count("tl.load(in0") == 1 and "tl.split(tl.reshape(" in src and "tl.join(" in src, src
    run(gm, pw.rope, args)


def test_a_lone_view_of_an_outside_value_is_read_at_its_strides():
    x, y = rn(3, 7, 96), rn(3, 7, 48)
    fn = lambda x, y: F.silu(x[..., 48:]) * y  # noqa: E731
    gm, (site,) = pw.fuse(fn, x, y)
    assert ops_of(site) == ["silu", "mul"]
    # the one view of x stays outside the group: the kernel reads it in place
    assert [n.op if n.op == "placeholder" else describe(n) for n in site.inputs] == ["slice.Tensor", "placeholder"]
    run(gm, fn, (x, y))


def test_views_of_one_outside_value_join_the_group_that_reads_two():
    x = rn(3, 7, 96)
    gm, (site,) = pw.fuse(pw.swiglu, x)
    assert ops_of(site) == ["silu", "mul"]
    # both halves of x: the kernel takes x itself and reads each half at its offset
    assert [n.op for n in site.inputs] == ["placeholder"]
    run(gm, pw.swiglu, (x,))


def test_wan_rope_loads_each_pair_once_in_one_contiguous_load():
    # the rotation reads x only through unbind's two items: x joins the group, and each lane loads its own element
    # and takes its partner from the neighbouring lane (one load of x where there were four, at stride 2)
    args = (rn(1, 24, 2, 16), rn(1, 24, 1, 16, dtype=f32), rn(1, 24, 1, 16, dtype=f32))
    gm, (site,) = pw.fuse(pw.wan_rope, *args)
    (call,) = pointwise_calls(gm)
    assert call.args[0][0].op == "placeholder"
    kernel = generate_source([args[0], args[1][..., 0::2], args[2][..., 1::2]], call.args[1])
    src = kernel.source
    # cos[..., 0::2]: each pair's lanes read one element, spanning the sectors a contiguous read does
    assert kernel.strided_bytes == 0
    loads = [ln for ln in src.splitlines() if "tl.load(in0" in ln]
    assert len(loads) == 1 and "tl.load(in0 + f," in loads[0] and src.count("tl.split(") == 1, src
    # the tables: one load each, shared by both halves of the stack
    assert src.count("tl.load(in1") == 1 and src.count("tl.load(in2") == 1, src
    run(gm, pw.wan_rope, args)


def describe(n):
    return getattr(n.target, "__name__", str(n.target))


def test_a_small_producer_is_recomputed_and_not_written():
    def modulate(x, s):
        return x * (1 + s)[:, None] + s[:, None]

    args = (rn(2, 30, 40), rn(2, 40))
    gm, (site,) = pw.fuse(modulate, *args)
    assert ops_of(site) == ["add", "mul", "add"] and len(site.outputs) == 1
    run(gm, modulate, args)


def test_a_value_read_outside_at_another_size_stays_in_the_graph():
    def f(x, s):
        t = s + 1
        return x * t[:, None] + 0.5, t

    args = (rn(2, 30, 40), rn(2, 40))
    gm, (site,) = pw.fuse(f, *args)
    assert ops_of(site) == ["mul", "add"] and len(site.outputs) == 1  # t is computed by its own ATen op
    assert any(n.target is torch.ops.aten.add.Tensor for n in gm.graph.nodes)
    run(gm, f, args)


def test_two_outputs_of_one_size_are_written_by_one_kernel():
    def f(x):
        xf = x.float()
        return xf.pow(2), (xf * 3).to(x.dtype)

    gm, (site,) = pw.fuse(f, rn(6, 2, 16))
    assert len(site.outputs) == 2 and len(pointwise_calls(gm)) == 1
    run(gm, f, (rn(6, 2, 16),))


def test_an_outside_op_between_two_ops_is_never_made_a_cycle():
    def f(x, w):
        h = torch.sin(x) * 2
        return h * (h @ w) + 1  # h feeds the matmul and the mul after it

    args = (rn(8, 16), rn(16, 16, seed=1))
    gm, sites = pw.fuse(f, *args)
    gm.graph.lint()
    assert [ops_of(s) for s in sites] == [["sin", "mul"], ["mul", "add"]]  # split at the matmul
    run(gm, f, args)


@pytest.mark.parametrize("fn", [torch.sin, lambda x: F.gelu(x, approximate="tanh"), lambda x: x.float()],
                         ids=["sin", "gelu", "cast"])
def test_a_single_op_is_left_to_eager(fn):
    _, sites = pw.fuse(fn, rn(4, 64))
    assert sites == []


@pytest.mark.parametrize("fn, args", [
    (torch.add, (rn(2, 300, 256), rn(256))),  # a bias broadcast over rows
    (torch.mul, (rn(2, 256, 300).transpose(1, 2), rn(2, 300, 256))),  # operands laid out differently
    (lambda x: x.float(), (rn(2, 256, 300).transpose(1, 2),)),  # a cast of a non-contiguous input
], ids=["broadcast", "layouts", "strided_cast"])
def test_a_large_single_op_eager_runs_strided_is_fused(fn, args):
    from diffusion_fuse.fxpasses.pointwise import LONE_OP_MIN_NUMEL

    assert args[0].numel() >= LONE_OP_MIN_NUMEL
    gm, sites = pw.fuse(fn, *args)
    assert len(sites) == 1 and len(pointwise_calls(gm)) == 1
    run(gm, fn, args)


@pytest.mark.parametrize("fn, args", [
    (torch.add, (rn(2, 300, 256), rn(2, 300, 256, seed=1))),  # same layouts: eager's vectorized loop
    (torch.add, (rn(2, 30, 256), rn(256))),  # small
    (lambda x: x.float(), (rn(2, 300, 256),)),  # a contiguous cast
    (lambda a, b: torch.cat([a, b], 1), (rn(1, 300, 256), rn(1, 300, 256))),  # a lone cat: a batched copy
    (torch.add, (rn(1, 300, 256), rn(300, 256))),  # only a size-1 dim differs: not a broadcast
], ids=["same_layout", "small", "contiguous_cast", "cat", "size1_dim"])
def test_a_single_op_eager_runs_vectorized_or_small_is_left_to_eager(fn, args):
    _, sites = pw.fuse(fn, *args)
    assert sites == []


@pytest.mark.parametrize("shape, dtype, taken", [((1, 4096, 4096), bf16, True), ((1, 4096, 2048), bf16, False),
                                                  ((1, 4096, 4096), f32, False)], ids=["large", "smaller", "fp32"])
def test_a_very_large_lone_bf16_activation_is_looked_up(monkeypatch, shape, dtype, taken):
    # eager's gelu-tanh arithmetic falls behind the H200's bandwidth on an MLP's activations; the kernel looks each
    # value up in eager's own output table (CUDA only: there the tables are built; the test lets the CPU pass it)
    from diffusion_fuse.fxpasses import pointwise

    monkeypatch.setattr(pointwise, "LOOKUP_DEVICES", {"cuda", "cpu"})
    fn = lambda x: F.gelu(x, approximate="tanh")  # noqa: E731
    _, sites = pw.fuse(fn, torch.empty(shape, dtype=dtype))
    assert [pw.site_ops(s) for s in sites] == ([["gelu"]] if taken else [])


def test_ops_it_cannot_reproduce_stay_eager():
    def f(x, y):
        return (x.double() * 2).float() + y.pow(3) * 2  # fp64 arithmetic, pow 3: not reproduced

    gm, sites = pw.fuse(f, rn(4, 8, dtype=f32), rn(4, 8, dtype=f32))
    # only the double's narrowing to float joins (exact: one rounding to nearest), with the ops after it
    assert [ops_of(s) for s in sites] == [["_to_copy", "mul", "add"]]
    eager = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert {"aten._to_copy.default", "aten.mul.Tensor", "aten.pow.Tensor_Scalar"} <= eager, eager
    run(gm, f, (rn(4, 8, dtype=f32), rn(4, 8, dtype=f32)))


@pytest.mark.parametrize("pad, value, taken", [((0, 0, 0, 1), 1.0, True), ((1, 2), 0.5, True),
                                                 ((0, 0, 0, -1), 1.0, False), ((0, 0, 0, 1), float("-inf"), False)])
def test_a_constant_pad_joins_its_group_unless_it_crops_or_fills_non_finite(pad, value, taken):
    # SANA pads its fp32 value with a row of ones: the pad's copies and its fill are exact in the kernel; a crop
    # (negative pad) or a non-finite fill stays eager's op
    def fn(x):
        return F.pad((x * 2).float(), pad, mode="constant", value=value)

    x = torch.randn(2, 6, 8).bfloat16()
    gm, sites = pw.fuse(fn, x)
    (site,) = sites
    assert ("constant_pad_nd" in pw.site_ops(site)) == taken, pw.site_ops(site)
    assert bitwise_equal(fn(x), gm(x))


def test_erf_gelu_stays_eager_and_says_why():
    from diffusion_fuse.kernels.pointwise_ops import ERF_NOT_REPRODUCED, RECIPES

    def f(x, y):
        return F.gelu(x * 2) + F.gelu(y, approximate="tanh") * 3  # erf: not reproduced; tanh: fused

    args = (rn(4, 64), rn(4, 64, seed=1))
    gm, sites = pw.fuse(f, *args)
    fused = [op for s in sites for op in ops_of(s)]
    assert fused.count("gelu") == 1, fused  # the tanh one
    gelu_erf = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.gelu.default)
    assert RECIPES[torch.ops.aten.gelu.default].check(gelu_erf) == ERF_NOT_REPRODUCED
    run(gm, f, args)


@pytest.mark.parametrize("dtype, joins", [(bf16, True), (f32, False)], ids=["bf16", "fp32"])
def test_erf_gelu_joins_a_group_where_the_kernel_looks_it_up(monkeypatch, dtype, joins):
    # a bf16 table of eager's erf gelu is exact by construction (CUDA only: there the tables are built for the
    # pass; the test lets the CPU pass it); fp32 has no table, and its recipe is not eager's
    from diffusion_fuse.fxpasses import pointwise

    monkeypatch.setattr(pointwise, "LOOKUP_DEVICES", {"cuda", "cpu"})
    fn = lambda a, x: torch.cat([a, F.gelu(x)], 2)  # noqa: E731  (FLUX's single block with nn.GELU())
    args = (rn(1, 8, 1024, dtype=dtype), rn(1, 8, 2048, dtype=dtype, seed=1) * 3)
    gm, sites = pw.fuse(fn, *args)
    assert [ops_of(s) for s in sites] == ([["gelu", "cat"]] if joins else [])
    run(gm, fn, args)  # a lookup and copies: bitwise in the interpreter too


def test_addcmul_joins_a_group_only_with_value_one():
    def f(x, g, y):  # a gated residual and a modulate spelled with addcmul; value 0.5 rounds alpha's product
        return torch.addcmul(x, g, y) * 2, torch.addcmul(x, g, y, value=0.5) + 1

    args = (rn(4, 64), rn(4, 64, seed=1), rn(4, 64, seed=2))
    gm, sites = pw.fuse(f, *args)
    fused = [op for s in sites for op in ops_of(s)]
    assert fused.count("addcmul") == 1, fused
    left = [n for n in gm.graph.nodes if n.target is torch.ops.aten.addcmul.default]
    assert [n.kwargs.get("value") for n in left] == [0.5]
    run(gm, f, args)


# --- generated code ---------------------------------------------------------------------------
def test_index_of_a_view_of_contiguous_data_simplifies_to_the_flat_offset():
    gen = Generator(torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph()), {}, [])
    f = Lin.of(Term("f", 1, 0))
    for shape, view in [((4, 24, 2, 16), (4, 24, 2, 8, 2)), ((1, 4608, 3072), (4608, 3072)), ((7, 1, 5), (35,))]:
        idx = gen.unravel(f, shape)
        back = gen.unravel(flatten(idx, [s for s in torch.empty(shape).stride()], shape), view)
        assert flatten(back, torch.empty(view).stride(), view) == f, (shape, view)


def _source(fn, *args):
    key = pw.program_of(fn, *args)
    return generate_source(list(args), key).source


def test_contiguous_operands_are_loaded_and_stored_at_the_flat_index():
    src = _source(pw.gated_residual, rn(2, 40, 64), rn(2, 64), rn(2, 40, 64))
    assert "tl.load(in0 + f," in src and "tl.load(in2 + f," in src and "tl.store(out0 + f," in src
    assert "= f % 64 + (f // 2560) * 64\n" in src  # the gate [2, 64], broadcast over the 40 tokens


def test_division_by_a_python_scalar_multiplies_by_the_fp32_reciprocal_as_eager_cuda():
    src = _source(lambda x: x / 3.0 + 1, rn(4, 8, dtype=f32))
    assert f"* {float(torch.tensor(1.0) / torch.tensor(3.0))!r}" in src and "div_rn" not in src
    src = _source(lambda x, y: x / y + 1, rn(4, 8, dtype=f32), rn(4, 8, dtype=f32))
    assert "tl.math.div_rn(" in src


def test_bf16_operands_round_after_every_op():
    src = _source(lambda a, b: (a * b + a) * 2, rn(4, 8), rn(4, 8))
    assert src.count(".to(tl.bfloat16).to(tl.float32)") == 3


def test_bf16_gelu_is_a_lookup_in_eagers_outputs_and_the_recipe_where_no_table_is_built(monkeypatch):
    from diffusion_fuse.kernels import lut16
    from diffusion_fuse.kernels import pointwise as pointwise_codegen

    fn = lambda x: torch.nn.functional.gelu(x, approximate="tanh").clone()  # noqa: E731
    src = generate_source([rn(4, 40)], pw.program_of(fn, rn(4, 40)))
    assert src.source.count("lut16_apply(") == 1 and "libdevice.tanh" not in src.source
    assert src.constexprs["BLOCK"] == pointwise_codegen.LUT_BLOCK and src.num_warps == pointwise_codegen.LUT_WARPS
    assert len(src.tables) == 1 and src.tables[0].dtype == torch.int32
    # fp32 input: the recipe
    src = generate_source([rn(4, 40, dtype=f32)], pw.program_of(fn, rn(4, 40, dtype=f32)))
    assert "lut16_apply" not in src.source and "libdevice.tanh" in src.source and not src.tables

    def fail(*args, **kwargs):
        raise RuntimeError("no table here")

    monkeypatch.setattr(pointwise_codegen, "_tables", {})
    monkeypatch.setattr(lut16, "build_lut16", fail)
    src = generate_source([rn(4, 40)], pw.program_of(fn, rn(4, 40)))
    assert "lut16_apply" not in src.source and "libdevice.tanh" in src.source
    assert src.constexprs["BLOCK"] == pointwise_codegen.BLOCK and src.num_warps == pointwise_codegen.NUM_WARPS


# --- a convolution's bias added in the kernel (SANA's GLUMBConv) ------------------------------------------
def _conv_args(depthwise=False):
    if depthwise:
        return pw.conv_glu, (pw.tokens_as_image(rn(2, 36, 40), 6), rn(40, 1, 3, 3, seed=1), rn(40, seed=2))
    return pw.conv_silu, (pw.tokens_as_image(rn(2, 36, 16), 6), rn(40, 16, 1, 1, seed=1), rn(40, seed=2))


def _cudnn_path(fn, h, w, b):
    """What eager computes on CUDA: cuDNN's convolution without the bias, then ``output.add_(bias)``."""
    conv = F.conv2d
    with pytest.MonkeyPatch.context() as m:
        m.setattr(F, "conv2d", lambda x, wt, bias, **kw: conv(x, wt, None, **kw).add_(bias.view(1, -1, 1, 1)))
        return fn(h, w, b)


@pytest.fixture
def conv_bias_on_cpu(monkeypatch):
    """Let the pass take CPU convolutions' biases (it does so for CUDA ones only: oneDNN adds the bias inside)."""
    from diffusion_fuse.fxpasses import pointwise

    monkeypatch.setattr(pointwise, "CONV_BIAS_DEVICES", {"cuda", "cpu"})


def test_a_cpu_convolution_keeps_its_bias():
    fn, args = _conv_args()
    gm, sites = pw.fuse(fn, *args)
    assert sites == []  # a lone silu: left to eager, and the convolution as it was


@pytest.mark.parametrize("depthwise", [False, True], ids=["conv_silu", "depthwise_glu"])
def test_a_convolution_read_only_by_the_group_adds_its_bias_in_the_kernel(conv_bias_on_cpu, depthwise):
    fn, args = _conv_args(depthwise)
    gm, sites = pw.fuse(fn, *args)
    (site,) = sites
    assert ops_of(site)[0] == "convolution" and site.n_ops == 2
    h, w, b = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert [n.name for n in site.inputs] == [h.name, w.name, b.name]
    (conv,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten.convolution.default]
    (call,) = pointwise_calls(gm)
    assert conv.args[:3] == (h, w, None) and call.args[0] == [conv, b]
    prog = PROGRAMS[call.args[1]].gm
    first = [n for n in prog.graph.nodes if n.op == "call_function"][:2]
    assert [n.target for n in first] == [torch.ops.aten.view.default, torch.ops.aten.add.Tensor]
    assert first[0].args[1] == [1, -1, 1, 1]
    # the CPU runs the program: eager's cuDNN path, bit for bit
    assert bitwise_equal(_cudnn_path(fn, *args), gm(*args))


@pytest.mark.parametrize("filter_channels_last", [False, True], ids=["nchw", "filter_channels_last"])
def test_a_depthwise_convolution_on_nchw_keeps_its_bias(conv_bias_on_cpu, filter_channels_last):
    """ATen's own depthwise kernel, which runs NCHW ones, adds the bias inside: only a channels-last input or
    filter (cuDNN's path) gives its bias to the kernel."""
    h, w, b = rn(2, 40, 6, 6), rn(40, 1, 3, 3, seed=1), rn(40, seed=2)
    if filter_channels_last:
        w = w.to(memory_format=torch.channels_last)
    gm, sites = pw.fuse(pw.conv_glu, h, w, b)
    (site,) = sites
    (conv,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten.convolution.default]
    assert ("convolution" in ops_of(site)) is filter_channels_last
    assert (conv.args[2] is None) is filter_channels_last


@pytest.mark.parametrize("shape, make, expected", [
    ((2, 40, 6, 6), lambda t: t, False),
    ((2, 40, 6, 6), lambda t: t.to(memory_format=torch.channels_last), True),
    ((40, 1, 3, 3), lambda t: t.to(memory_format=torch.channels_last), True),  # contiguous too, by is_contiguous
    ((40, 1, 3, 3), lambda t: t, False),
    ((4, 1, 1, 1), lambda t: t.to(memory_format=torch.channels_last), False),  # c10's N111: contiguous
    ((2, 40, 3, 6, 6), lambda t: t.to(memory_format=torch.channels_last_3d), True),
    ((2, 40, 6), lambda t: t, False),
])
def test_channels_last_strides_as_c10_reads_them(shape, make, expected):
    from diffusion_fuse.fxpasses.pointwise import _strides_like_channels_last

    t = make(torch.empty(shape))
    assert _strides_like_channels_last(t) is expected
    if hasattr(torch._prims_common, "are_strides_like_channels_last_or_false"):  # torch's own port, where it has one
        assert torch._prims_common.are_strides_like_channels_last_or_false(t.shape, t.stride()) is expected


def test_a_convolution_read_outside_the_group_keeps_its_bias(conv_bias_on_cpu):
    def fn(h, w, b):
        y = F.conv2d(h, w, b)
        return F.silu(y) * 2, y

    _, args = _conv_args()
    gm, sites = pw.fuse(fn, *args)
    (site,) = sites
    assert "convolution" not in ops_of(site)
    (conv,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten.convolution.default]
    assert conv.args[2] is not None


def test_sana_on_cpu_keeps_its_convolutions_and_their_sites():
    model, kwargs = build("sana", bf16)
    ref, out, report = compile_and_run(model, kwargs)
    assert bitwise_equal(ref, out)
    assert all("convolution" not in s.before for s in report.sites())


def test_sana_convolutions_absorbed_are_judged_by_the_verifier(conv_bias_on_cpu):
    """On the CPU oneDNN adds a convolution's bias inside it: the sites differ from eager, and go back."""
    model, kwargs = build("sana", bf16)
    ref, out, report = compile_and_run(model, kwargs)
    assert bitwise_equal(ref, out)
    conv_sites = [s for s in report.sites() if "convolution" in s.before]
    assert len(conv_sites) == 2 and all(s.status == "rejected" and "differ" in s.reason for s in conv_sites)
    assert all("backend adds it inside" in s.reason for s in conv_sites)
    assert all(s.status == "kept" for s in report.sites() if s not in conv_sites)


def test_each_program_outputs_the_strides_eager_gives():
    x = rn(2, 16, 12, dtype=f32).permute(0, 2, 1)
    key = pw.program_of(lambda t: t * 2 + 1, x)
    (spec,) = generate_source([x], key).outputs
    assert spec.stride == (x * 2 + 1).stride() == x.stride()


@pytest.mark.parametrize("batch, int64", [(1, False), (2, True)])
def test_a_channels_last_glu_walks_tiles_indexing_in_int64_only_where_int32_could_wrap(batch, int64):
    """The GLU after a channels-last convolution reads channels c and c + C/2 of each pixel: tiles over channels and
    rows. At batch 1 the batch stride (here 25M elements, 96 of them past the edge tiles would wrap int32) is in no
    offset, so the kernel stays int32; at batch 2 it is, and the tiles index in int64 rather than fall back to a
    flat kernel that reads every element at a stride of C."""
    def fn(y, b):
        x, g = torch.chunk(y + b.view(1, -1, 1, 1), 2, dim=1)
        return x * F.silu(g)

    y = torch.empty(batch, 8192, 64, 48, dtype=bf16, device="meta").to(memory_format=torch.channels_last)
    b = torch.empty(8192, dtype=bf16, device="meta")
    src = generate_source([y, b], pw.program_of(fn, y, b))
    assert src.tile == (1, 2) and src.strided_bytes == 0
    assert ("tl.program_id(1).to(tl.int64)" in src.source) is int64


def test_a_kernel_left_reading_at_a_stride_says_so(caplog):
    x = rn(64, 128)[:, ::2]  # every other element: no tiling reads it contiguously
    with caplog.at_level("INFO", logger="diffusion_fuse"):
        src = generate_source([x], pw.program_of(lambda t: t * 2, x))
    assert src.strided_bytes and "at a stride (flat)" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="diffusion_fuse"):
        generate_source([x.contiguous()], pw.program_of(lambda t: t * 2, x.contiguous()))
    assert "at a stride" not in caplog.text


# the chains the CPU pass leaves alone: a convolution's bias (CONV_BIAS_DEVICES) and an erf gelu, exact only as a
# table of the GPU's outputs
_NO_CPU_SITE = {"sana_conv_silu", "gelu_erf_cat"}


@pytest.mark.parametrize("name", [c for c in pw.CHAINS if c not in _NO_CPU_SITE])
def test_each_chain_at_its_real_shape_reads_and_writes_contiguously(name):
    """The kernels the benchmarks time, generated at the models' real shapes (fake tensors: no memory), in int32
    and walking their inputs and outputs contiguously, so a layout or size that falls back to reading at a stride
    fails here on the CPU. ``rope_into_slice`` loads each pair's partner through a materialized index (the slice's
    offset is not a whole row), which counts as strided: one bf16 read of q, a contiguous one in fact."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fn, fake = pw.chain(name, device="cpu")
        specs = [(t.shape, t.stride(), t.dtype) for t in fake]
    args = [torch.empty_strided(shape, stride, dtype=dtype, device="meta") for shape, stride, dtype in specs]
    gm, _ = pw.fuse(fn, *args)
    calls = pointwise_calls(gm)
    assert calls
    for call in calls:
        ins = [a.meta["val"] for a in call.args[0]]
        src = generate_source([torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta") for t in ins],
                              call.args[1])
        assert "tl.int64" not in src.source
        assert src.strided_bytes == (src.numel * 2 if name == "rope_into_slice" else 0), (src.tile, src.strided_bytes)


# --- plumbing ---------------------------------------------------------------------------------
def test_site_keys_ops_and_programs_in_the_report():
    model, kwargs = build("flux", bf16)
    ref, out, report = compile_and_run(model, kwargs)
    assert bitwise_equal(ref, out)
    sites = [s for s in report.sites() if s.pattern == "pointwise"]
    assert sites and all(s.status == "kept" and s.verdict == "bitwise equal" for s in sites)
    assert all(s.after == "diffusion_fuse::pointwise" and s.ops == 1 for s in sites)
    # the site lists the ATen ops it replaced, e.g. FLUX's single block: the MLP's gelu, then the cat with attention
    assert any(s.before == ["gelu", "cat"] for s in sites), [s.before for s in sites]
    row = next(r for r in report.summary() if r["family"] == "pointwise")
    assert row["guard fallbacks"] == 2 * len(sites)  # CPU: the verifier's check and the run, per site
    # the program of a site is the group's own ATen subgraph
    calls = [n for n in report.graphs[0].final_code.splitlines() if "diffusion_fuse.pointwise" in n]
    assert len(calls) == len(sites)
    assert all(k in PROGRAMS for k in (c.split("'")[1] for c in calls))


def test_disabled_by_option():
    # off in tier high, where Inductor fuses pointwise ops: tests/test_high_tier.py
    model, kwargs = build("flux", f32)
    _, _, report = compile_and_run(model, kwargs, {"patterns": {"pointwise": False}})
    assert report.count("pointwise") == 0 and report.count() == 7  # 6 norm sites, the joint attention's linear_cat


def test_a_group_the_verifier_rejects_goes_back_and_the_others_stay():
    model, kwargs = build("flux", bf16)
    with faults.inject("pointwise", "perturb", index=3):
        ref, out, report = compile_and_run(model, kwargs)
    assert bitwise_equal(ref, out)
    pws = [s for s in report.sites() if s.pattern == "pointwise"]
    assert pws and all(s.status == "rejected" and "elements differ" in s.reason for s in pws)
    assert all(s.status == "kept" for s in report.sites() if s.pattern != "pointwise")


def test_dynamic_shapes_compile_and_equal_eager():
    def f(x, g):
        return F.gelu(x + g * x, approximate="tanh").to(f32)

    compiled = torch.compile(f, backend=diffusion_fuse.DiffusionFuseBackend(None, diffusion_fuse.Report()),
                             dynamic=True)
    for n in (5, 9):
        args = (rn(n, 32), rn(n, 32, seed=1))
        assert bitwise_equal(f(*args), compiled(*args))


# --- a write into a slice: slice → f → copy → slice_scatter, one kernel -------------------------------------
@pytest.mark.parametrize("text", [0, 3, 8])
def test_a_write_into_a_slice_is_one_group_with_eagers_output(text):
    q, cos, sin = rn(2, 9, 3, 16), rn(9 - text, 1, 16, dtype=torch.float32), rn(9 - text, 1, 16, dtype=torch.float32)

    def fn(q, cos, sin):
        return pw.rope_into_slice(q, cos, sin)  # text = 9 - len(cos)

    gm, sites = pw.fuse(fn, q, cos, sin)
    (site,) = sites
    assert {"copy", "clone"} <= set(pw.site_ops(site)), pw.site_ops(site)
    assert any(n.target is torch.ops.aten.slice_scatter.default for n in site.nodes) == (text > 0)
    ref, out, report = compile_and_run(lambda q, cos, sin: fn(q, cos, sin), dict(q=q, cos=cos, sin=sin))
    assert bitwise_equal(ref, out) and report.count("pointwise", status="kept") == 1, report.table()


def test_a_write_into_a_row_is_one_group_with_eagers_output():
    def fn(x, y):
        x = x * 2
        x[:, 1] = torch.sigmoid(y)
        return x + 1

    x, y = rn(2, 5, 16), rn(2, 16, seed=1)
    gm, sites = pw.fuse(fn, x, y)
    (site,) = sites
    assert any(n.target is torch.ops.aten.select_scatter.default for n in site.nodes)
    ref, out, report = compile_and_run(lambda x, y: fn(x, y), dict(x=x, y=y))
    assert bitwise_equal(ref, out) and report.count("pointwise", status="kept") == 1, report.table()
