"""The Triton kernels compile for the H200 (sm_90) on a machine without a GPU.

Triton's interpreter runs kernel logic on the CPU but skips the compiler, where some errors
only show (e.g. constexpr control flow). This compiles every kernel configuration the
guards can pick, through Triton's own ptxas, and checks the numerics contract in the PTX.
"""

import pytest

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from diffusion_fuse.kernels import layer_norm_stats as lns  # noqa: E402
from diffusion_fuse.kernels import ln_modulate as lm  # noqa: E402

PTR = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}
CODE = {"fp32": 0, "bf16": 1, "fp16": 2}


def compile_ln_modulate(D, x="bf16", mod="bf16", out="bf16", ln="bf16", affine=False, shift=True):
    k = lm._ln_modulate_kernel
    n_iters = lns.n_iters_for(D)
    const = dict(N_ITERS=n_iters, LANES=lns.LANES, VEC=lns.VEC, HAS_W=affine, HAS_B=affine, HAS_SHIFT=shift,
                 LN_DT=CODE[ln], T_DT=CODE[mod], U_DT=CODE[mod], V_DT=CODE[mod], AFFINE_FMA=True,
                 **lns.DEFAULT_VARIANT.constexprs(), UNIFORM=lns.is_uniform(D, n_iters))
    sig = {"X": PTR[x], "W": PTR[ln], "B": PTR[ln], "SCALE": PTR[mod], "SHIFT": PTR[mod], "OUT": PTR[out],
           "N": "i32", "S": "i32", "eps": "fp32", **{n: "i64" for n in k.arg_names[9:len(k.arg_names) - len(const)]}}
    sig.update({n: "constexpr" for n in const})
    src = ASTSource(fn=k, signature=sig, constexprs={(k.arg_names.index(n),): v for n, v in const.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "enable_fp_fusion": False})


@pytest.mark.parametrize("D", [64, 1000, 3072, 5120])
@pytest.mark.parametrize("form", ["flux_bf16", "wan_fp32_ln", "affine_fp16"])
def test_ln_modulate_compiles_for_sm90(D, form):
    kw = {"flux_bf16": {}, "wan_fp32_ln": dict(mod="fp32", ln="fp32"),
          "affine_fp16": dict(x="fp16", mod="fp16", out="fp16", ln="fp16", affine=True)}[form]
    ck = compile_ln_modulate(D, **kw)
    ptx = ck.asm["ptx"]
    assert ck.asm.get("cubin")
    # Only our explicit tl.fma become FMAs: every other multiply/add is rounded on its own.
    assert "mul.rn.f32" in ptx and "fma.rn.f32" in ptx
    assert ".approx" not in ptx.replace("rsqrt.approx", "").replace("ex2.approx", "")
    if lns.is_uniform(D, lns.n_iters_for(D)):
        assert "div.rn.f32" in ptx  # only var = m2 / N remains a division


@pytest.mark.parametrize("D", [1000, 3072])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_gated_residual_ln_modulate_compiles_for_sm90(D, dtype):
    from diffusion_fuse.kernels import gated_residual_ln as gr

    k = gr._gated_residual_ln_modulate_kernel
    n_iters = lns.n_iters_for(D)
    const = dict(M_DT=CODE[dtype], N_ITERS=n_iters, LANES=lns.LANES, VEC=lns.VEC, HAS_W=False, HAS_B=False,
                 HAS_SHIFT=True, LN_DT=CODE[dtype], T_DT=CODE[dtype], U_DT=CODE[dtype], V_DT=CODE[dtype],
                 AFFINE_FMA=True, **lns.DEFAULT_VARIANT.constexprs(), UNIFORM=lns.is_uniform(D, n_iters))
    ptrs = ["RES", "X", "GATE", "W", "B", "SCALE", "SHIFT", "R_OUT", "OUT"]
    sig = {**{p: PTR[dtype] for p in ptrs}, "N": "i32", "S": "i32", "eps": "fp32",
           **{n: "i64" for n in k.arg_names[12:22]}, **{n: "constexpr" for n in const}}
    src = ASTSource(fn=k, signature=sig, constexprs={(k.arg_names.index(n),): v for n, v in const.items()})
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "enable_fp_fusion": False})
    assert ck.asm.get("cubin") and "bar.sync" in ck.asm["ptx"]
