"""The Triton kernels compile for the H200 (sm_90) on a machine without a GPU.

Triton's interpreter runs kernel logic on the CPU but skips the compiler, where some errors
only show (e.g. constexpr control flow). This compiles every kernel configuration the
guards can pick, through Triton's own ptxas, and checks the numerics contract in the PTX.
"""

import re

import pytest

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from diffusion_fuse.kernels import layer_norm_stats as lns  # noqa: E402
from diffusion_fuse.kernels import ln_modulate as lm  # noqa: E402

PTR = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}
CODE = {"fp32": 0, "bf16": 1, "fp16": 2}


def compile_ln_modulate(D, x="bf16", mod="bf16", out="bf16", ln="bf16", affine=False, shift=True):
    """Compile as the launcher does for contiguous, 16-byte aligned operands: x's unit stride along D
    is a constant, pointers and row strides carry Triton's divisibility-by-16 specialization."""
    k = lm._ln_modulate_kernel
    n_iters = lns.n_iters_for(D)
    const = dict(N_ITERS=n_iters, LANES=lns.LANES, VEC=lns.VEC, HAS_W=affine, HAS_B=affine, HAS_SHIFT=shift,
                 LN_DT=CODE[ln], T_DT=CODE[mod], U_DT=CODE[mod], V_DT=CODE[mod], AFFINE_FMA=True,
                 **lns.DEFAULT_VARIANT.constexprs(), UNIFORM=lns.is_uniform(D, n_iters))
    names = k.arg_names
    sig = {"X": PTR[x], "W": PTR[ln], "B": PTR[ln], "SCALE": PTR[mod], "SHIFT": PTR[mod], "OUT": PTR[out],
           "N": "i32", "S": "i32", "eps": "fp32", **{n: "i64" for n in names[9:len(names) - len(const)]}}
    sig.update({n: "constexpr" for n in [*const, "x_sd"]})
    constexprs = {(names.index(n),): v for n, v in {**const, "x_sd": 1}.items()}
    aligned = ["X", "W", "B", "SCALE", "SHIFT", "OUT", "x_sb", "x_ss", "sc_sb", "sc_ss", "sh_sb", "sh_ss"]
    aligned += ["N"] if D % 16 == 0 else []
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    src = ASTSource(fn=k, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "enable_fp_fusion": False})


def shuffle_layouts(ttgir: str) -> set[str]:
    """The layouts of the tensors the warp shuffles (inline PTX) operate on."""
    defs = dict(line.split(" = ", 1) for line in ttgir.splitlines() if line.startswith("#") and " = " in line)
    used = {m for line in ttgir.splitlines() if "shfl.sync.down" in line
            for m in re.findall(r"tensor<128xi32, (#\w+)>", line)}
    return {defs[u] for u in used}


IDENTITY_LAYOUTS = {  # element i of a [128] tensor lives in thread i (lane i % 32 of warp i // 32)
    "#ttg.linear<{register = [], lane = [[1], [2], [4], [8], [16]], warp = [[32], [64]], block = []}>",
    "#ttg.blocked<{sizePerThread = [1], threadsPerWarp = [32], warpsPerCTA = [4], order = [0]}>",
}


@pytest.mark.parametrize("D", [1000, 3072])
def test_warp_shuffles_see_lane_i_in_thread_i(D):
    # _shfl_down returns lane l+offset's state only if lane l of the Welford state is thread l.
    layouts = shuffle_layouts(compile_ln_modulate(D).asm["ttgir"])
    assert layouts and layouts <= IDENTITY_LAYOUTS, layouts


def test_aligned_rows_load_and_store_4_elements_per_instruction():
    ptx = compile_ln_modulate(3072).asm["ptx"]
    assert "ld.global.b16" not in ptx and "st.global.b16" not in ptx
    assert "ld.global.v2.b32" in ptx and "st.global.v2.b32" in ptx


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
