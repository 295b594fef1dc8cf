"""Family gated_residual: a gated residual no LayerNorm reads, in the forms that otherwise write fp32 tensors."""

import torch
from helpers import bitwise_equal, compile_and_run

from diffusion_fuse.patterns.registry import example_tensor

R = "gated_residual"


class BlockEnd(torch.nn.Module):
    """A block's last residual, ``(x.float() + out * gate).type_as(x)``, with nothing normalizing it in the graph."""

    def __init__(self, read_product: bool = False, norm_after: bool = False) -> None:
        super().__init__()
        self.read_product, self.norm_after = read_product, norm_after

    def forward(self, x, out, gate):
        prod = out * gate
        r = (x.float() + prod).type_as(x)
        if self.norm_after:
            r = torch.nn.functional.layer_norm(r.float(), (r.shape[-1],)).type_as(x)
        return (r, prod) if self.read_product else r


def inputs():
    return dict(x=example_tensor(1, 8, 64), out=example_tensor(1, 8, 64, seed=1),
                gate=example_tensor(1, 1, 64, dtype=torch.float32, seed=2))


def test_the_fp32_round_trip_is_one_site():
    ref, out, report = compile_and_run(BlockEnd(), inputs())
    assert bitwise_equal(ref, out)
    (site,) = [s for s in report.sites() if s.pattern == R]
    assert site.status == "kept" and site.after == "diffusion_fuse::gated_residual"


def test_a_product_read_elsewhere_is_a_near_miss():
    ref, out, report = compile_and_run(BlockEnd(read_product=True), inputs())
    assert bitwise_equal(ref, out) and report.count(R) == 0
    assert any(m.pattern == R and "users" in m.reason for g in report.graphs for m in g.near_misses), report.table()


def test_a_residual_a_layer_norm_reads_is_left_to_gated_residual_norm_modulate():
    ref, out, report = compile_and_run(BlockEnd(norm_after=True), inputs())
    assert bitwise_equal(ref, out)
    assert report.count(R) == 0 and report.count("gated_residual_norm_modulate") == 1, report.table()


def test_a_permuted_residual_keeps_eagers_layout_and_its_site():
    # a patch embedding's permuted residual: eager's add follows its layout; the op's reference does too (the
    # verifier judges strides), and the guard takes it to the tile kernel, which writes that layout
    # (tests/kernels/test_gated_residual_norm_modulate_kernel.py runs it)
    from diffusion_fuse.lowering.gated_residual import SPEC, _row_major, r_in_rows

    res = example_tensor(2, 16, 8, dtype=torch.float32).permute(0, 2, 1)  # [2, 8, 16], strides (128, 1, 8)
    x, gate = example_tensor(2, 8, 16, dtype=torch.float32, seed=1), example_tensor(2, 1, 16, dtype=torch.float32)
    eager = res + gate * x
    assert SPEC.reference(res, x, gate).stride() == eager.stride() == (128, 1, 8)
    assert not _row_major(res) and _row_major(x) and _row_major(res.contiguous())
    assert not r_in_rows(SPEC.bind((res, x, gate)))
