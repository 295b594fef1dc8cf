"""patterns/linear_cat.py and lowering/linear_cat.py on the CPU: the pattern, the guard, the op's paths.

The op's "kernel" is the ATen call eager makes, with ``out=`` the piece's rows of the ``cat`` buffer; on the
CPU that runs the CPU BLAS, so these tests check its bits too. tests/gpu/test_linear_cat_gpu.py checks cuBLAS
at FLUX's shapes.
"""

from __future__ import annotations

import pytest
import torch
from helpers import bitwise_equal, compile_and_run

from diffusion_fuse.lowering import counters
from diffusion_fuse.lowering.linear_cat import SPEC, can_use_linear_cat, linear_cat
from diffusion_fuse.testing.tiny_models import build


def _sites(report, status=None):
    return [v for g in report.graphs for k, v in g.sites.items()
            if k.startswith("linear_cat") and (status is None or v.status == status)]


def _near_misses(report):
    return [n.reason for g in report.graphs for n in g.near_misses if n.pattern == "linear_cat"]


@pytest.mark.parametrize("name, n_sites", [("flux", 1), ("flux2", 1), ("qwen_image", 1), ("sd35", 0)])
def test_joint_attention_value_cat_becomes_one_op_and_equals_eager(name, n_sites):
    # FLUX / FLUX.2 / Qwen-Image: cat([txt_v, img_v], dim=1) of [1, S, heads, D]; SD3.5 cats [B, heads, S, D]
    # along S (pieces not contiguous rows): left to ATen
    torch._dynamo.reset()
    model, kwargs = build(name)
    ref, out, report = compile_and_run(model, kwargs)
    assert bitwise_equal(ref, out)
    assert len(_sites(report, "kept")) == n_sites, [(s.status, s.reason) for s in _sites(report)]


class _JointValue(torch.nn.Module):
    def __init__(self, bias=(True, True), heads=4, dim=32, extra_user=False, dtype=torch.bfloat16):
        super().__init__()
        self.txt = torch.nn.Linear(dim, dim, bias=bias[0], dtype=dtype)
        self.img = torch.nn.Linear(dim, dim, bias=bias[1], dtype=dtype)
        self.heads, self.extra_user = heads, extra_user

    def forward(self, txt, img):
        t = self.txt(txt).unflatten(-1, (self.heads, -1))
        i = self.img(img).unflatten(-1, (self.heads, -1))
        v = torch.cat([t, i], dim=1)
        return v * 2 + (i.sum() if self.extra_user else 0)


def _inputs(batch=1, s_txt=6, s_img=10, dim=32, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(0)
    return {"txt": torch.randn(batch, s_txt, dim, generator=g).to(dtype),
            "img": torch.randn(batch, s_img, dim, generator=g).to(dtype)}


@pytest.mark.parametrize("bias", [(True, True), (False, False), (True, False)])
def test_pieces_with_and_without_bias(bias):
    torch._dynamo.reset()
    ref, out, report = compile_and_run(_JointValue(bias), _inputs())
    assert bitwise_equal(ref, out) and len(_sites(report, "kept")) == 1


def test_fp32_pieces():
    torch._dynamo.reset()
    ref, out, report = compile_and_run(_JointValue(dtype=torch.float32), _inputs(dtype=torch.float32))
    assert bitwise_equal(ref, out) and len(_sites(report, "kept")) == 1


def test_batch_two_is_a_near_miss_and_stays_aten():
    torch._dynamo.reset()
    ref, out, report = compile_and_run(_JointValue(), _inputs(batch=2))
    assert bitwise_equal(ref, out) and not _sites(report)
    assert any("not all 1" in r for r in _near_misses(report)), _near_misses(report)


def test_a_piece_read_elsewhere_is_a_near_miss():
    torch._dynamo.reset()
    ref, out, report = compile_and_run(_JointValue(extra_user=True), _inputs())
    assert bitwise_equal(ref, out) and not _sites(report)
    assert any("needs 1: the cat" in r for r in _near_misses(report)), _near_misses(report)


def test_dynamic_sequence_lengths_equal_eager():
    torch._dynamo.reset()
    import diffusion_fuse

    model = _JointValue()
    report = diffusion_fuse.Report()
    compiled = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(None, report), dynamic=True)
    with torch.no_grad():
        for s_txt, s_img in ((6, 10), (6, 14), (4, 20)):
            kw = _inputs(s_txt=s_txt, s_img=s_img)
            assert bitwise_equal(model(**kw), compiled(**kw))
    assert _sites(report) and all(s.status == "kept" for s in _sites(report))


def _operands(rows=(6, 10), n=32, k=32, bias=True, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(m, k, generator=g).to(dtype) for m in rows]
    ws = [torch.randn(n, k, generator=g).to(dtype) for _ in rows]
    bs = [torch.randn(n, generator=g).to(dtype) if bias else None for _ in rows]
    return xs, ws, bs, 1, [n]


def test_the_op_runs_the_out_path_and_equals_the_reference():
    xs, ws, bs, dim, inner = _operands()
    assert can_use_linear_cat(SPEC.bind((xs, ws, bs, dim, inner))) == (True, "")
    before = counters.snapshot()
    out = torch.ops.diffusion_fuse.linear_cat(xs, ws, bs, dim, inner)
    assert counters.diff(counters.snapshot(), before)["kernel"] == {"linear_cat": 1}
    assert bitwise_equal(out, linear_cat(xs, ws, bs, dim, inner))
    eager = torch.cat([torch.addmm(b, x, w.t()).view(1, -1, w.shape[0]) for x, w, b in zip(xs, ws, bs)], dim=1)
    assert bitwise_equal(out, eager)


def test_a_piece_not_16_byte_aligned_takes_the_reference_path_and_says_so():
    xs, ws, bs, dim, inner = _operands(rows=(3, 5), n=5)  # the second piece starts 30 bytes in
    ok, why = can_use_linear_cat(SPEC.bind((xs, ws, bs, dim, inner)))
    assert not ok and "not 16-byte aligned" in why
    before = counters.snapshot()
    out = torch.ops.diffusion_fuse.linear_cat(xs, ws, bs, dim, inner)
    assert counters.diff(counters.snapshot(), before)["fallback"] == {"linear_cat": {why: 1}}
    assert bitwise_equal(out, linear_cat(xs, ws, bs, dim, inner))


@pytest.mark.parametrize("bad, expect", [
    (lambda xs, ws, bs, dim, inner: (xs, ws, bs, dim, [7]), "not a whole number"),
    (lambda xs, ws, bs, dim, inner: (xs, [ws[0], ws[1][:, :16]], bs, dim, inner), "shapes"),
    (lambda xs, ws, bs, dim, inner: (xs, ws, [bs[0], bs[1].float()], dim, inner),
     "different devices or of different dtypes"),
])
def test_guard_names_what_it_rejects(bad, expect):
    ok, why = can_use_linear_cat(SPEC.bind(bad(*_operands())))
    assert not ok and expect in why
