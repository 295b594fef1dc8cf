"""The Triton kernels compile for the H200 (sm_90) on a machine without a GPU.

Triton's interpreter runs kernel logic on the CPU but skips the compiler, where some errors
only show (e.g. constexpr control flow). This compiles every kernel configuration the
guards can pick, through Triton's own ptxas, and checks the numerics contract in the PTX.
"""

import functools
import re

import pytest

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from diffusion_fuse.kernels import layer_norm_stats as lns  # noqa: E402
from diffusion_fuse.kernels import norm_modulate as lm  # noqa: E402
from diffusion_fuse.kernels.launch import EAGER_NUMERICS  # noqa: E402

PTR = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}
CODE = {"fp32": 0, "bf16": 1, "fp16": 2}
QUANT_TYPES = {"Q": "*u8", "q_plane": "i64", "S0": "*fp32", "S1": "*fp32", "S2": "*fp32", "S3": "*fp32",
               "q_lo": "fp32", "q_hi": "fp32"}
E4M3_CVT = "cvt.rn.satfinite.e4m3x2.f32"  # round to nearest even, saturating: eager's cast within ±448


def quant_constexprs(n_q=0, keep_out=True, out="bf16", q_mode=0):
    """The quant epilogue's constexprs (kernels/fp8_quant.py); n_q == 0 is the plain kernel."""
    return dict(N_Q=n_q, STORE_OUT=keep_out, OUT_DT=CODE[out], Q_MODE=q_mode, NAN_SIGN=True)


def compile_for_sm90(kernel, types: dict, const: dict, aligned=(), num_warps: int = 4):
    """Compile ``kernel`` for sm_90: ``types`` maps runtime argument names to Triton types (others i64);
    ``aligned`` arguments get the divisibility-by-16 specialization the launcher gives 16-byte aligned ones."""
    names = kernel.arg_names
    sig = {n: ("constexpr" if n in const else types.get(n, "i64")) for n in names}
    src = ASTSource(fn=kernel, signature=sig, constexprs={(names.index(n),): v for n, v in const.items()},
                    attrs={(names.index(n),): [["tt.divisibility", 16]] for n in aligned})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, **EAGER_NUMERICS})


def compile_norm_modulate(D, x="bf16", mod="bf16", out="bf16", ln="bf16", affine=False, shift=True, n_q=0,
                          keep_out=True, temb=None, cache_hints=False, scale=True, heads=False):
    """Compile as the launcher does for contiguous, 16-byte aligned operands: x's unit stride along D
    is a constant, pointers and row strides carry Triton's divisibility-by-16 specialization.
    ``temb``: the dtype of scale's and shift's second addends (Wan's timestep table), or None.
    ``cache_hints``: the kernel's CACHE_HINTS (what rows normalized in 16 bits take).
    ``scale=False``: no modulate (family layer_norm's launch); ``heads``: rows [B, H, S] (X_HEADS)."""
    k = lm._norm_modulate_kernel
    n_iters = lns.n_iters_for(D)
    const = dict(N_ITERS=n_iters, LANES=lns.LANES, VEC=lns.VEC, HAS_W=affine, HAS_B=affine, HAS_SHIFT=shift,
                 LN_DT=CODE[ln], T_DT=CODE[mod], U_DT=CODE[mod], V_DT=CODE[mod], AFFINE_FMA=True,
                 **lns.DEFAULT_VARIANT.constexprs(), UNIFORM=lns.is_uniform(D, n_iters),
                 **quant_constexprs(n_q, keep_out, out),
                 HAS_SCALE=scale, HAS_SCALE_TEMB=temb is not None, HAS_SHIFT_TEMB=temb is not None and shift,
                 CACHE_HINTS=cache_hints, X_HEADS=heads)
    names = k.arg_names
    sig = {"X": PTR[x], "W": PTR[ln], "B": PTR[ln], "SCALE": PTR[mod], "SHIFT": PTR[mod], "OUT": PTR[out],
           "SCALE_T": PTR[temb or mod], "SHIFT_T": PTR[temb or mod],
           "N": "i32", "S": "i32", "H": "i32", "eps": "fp32", **QUANT_TYPES}
    sig = {n: sig.get(n, "i64") for n in names}
    sig.update({n: "constexpr" for n in [*const, "x_sd"]})
    constexprs = {(names.index(n),): v for n, v in {**const, "x_sd": 1}.items()}
    aligned = ["X", "W", "B", "SCALE", "SHIFT", "OUT", "x_sb", "x_ss", "x_sh", "sc_sb", "sc_ss", "sh_sb", "sh_ss",
               "SCALE_T", "SHIFT_T", "sct_sb", "sct_ss", "sht_sb", "sht_ss"]
    aligned += ["N"] if D % 16 == 0 else []
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    src = ASTSource(fn=k, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, **EAGER_NUMERICS})


def cubin_registers(ck) -> int:
    """Registers per thread of a compiled kernel, read from its cubin (no driver needed): the ELF section
    ``.nv.info`` holds EIATTR_REGCOUNT (attribute 0x2f: symbol index, count), what cuobjdump reports."""
    import struct

    elf = ck.asm["cubin"]
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    names_at = sections[shstrndx][4]
    for sec in sections:
        if elf[names_at + sec[0]:elf.index(b"\0", names_at + sec[0])] != b".nv.info":
            continue
        pos, end = sec[4], sec[4] + sec[5]
        while pos < end:
            fmt, attr, size = struct.unpack_from("<BBH", elf, pos)
            if fmt == 0x04 and attr == 0x2F:  # EIFMT_SVAL, EIATTR_REGCOUNT
                return struct.unpack_from("<II", elf, pos + 4)[1]
            pos += 4 + (size if fmt == 0x04 else 0)
    raise ValueError("no register count in the cubin")


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
    layouts = shuffle_layouts(compile_norm_modulate(D).asm["ttgir"])
    assert layouts and layouts <= IDENTITY_LAYOUTS, layouts


def shuffle_layouts_any(ttgir: str) -> set[str]:
    """``shuffle_layouts`` for any [n] state (rms_norm's row groups hold [groups * 128])."""
    defs = dict(line.split(" = ", 1) for line in ttgir.splitlines() if line.startswith("#") and " = " in line)
    used = {m for line in ttgir.splitlines() if "shfl.sync.down" in line
            for m in re.findall(r"tensor<\d+xi32, (#\w+)>", line)}
    return {defs[u] for u in used}


@pytest.mark.parametrize("D, x", [(3072, "bf16"), (5120, "bf16"), (1024, "fp16"), (1000, "bf16"), (2432, "bf16")])
def test_cache_hints_change_the_row_loads_and_output_stores_only(D, x):
    """The kernel's CACHE_HINTS (rows normalized in 16 bits): the row's loads take an L2 evict-first policy, the
    output's stores are ``.cs``, and nothing else changes (same registers, within 2). Every row is held in
    registers (D % 512 != 0 too), so every row takes them."""
    kw = dict(x=x, mod=x, out=x, ln=x)
    ck, base = compile_norm_modulate(D, cache_hints=True, **kw), compile_norm_modulate(D, **kw)
    ptx, regs = ck.asm["ptx"], cubin_registers(ck)
    print(f"D={D} {x} cache hints: {regs} registers (without {cubin_registers(base)})")
    assert "evict_first" in ptx and "st.global.cs" in ptx
    assert "st.global.v2.b32 " not in ptx.replace("st.global.cs.v2.b32", "")  # every output store streams
    assert "evict_first" not in base.asm["ptx"] and "st.global.cs" not in base.asm["ptx"]
    assert regs <= cubin_registers(base) + 2


@pytest.mark.parametrize("D", [3072, 2432])
def test_aligned_rows_load_and_store_4_elements_per_instruction(D):
    # a row past a multiple of 512 (2432) is masked per vector of 4: its accesses stay 4 wide (D % 16 == 0, which
    # Triton specializes on, tells it the rows' 16-bit addresses are 8-byte aligned)
    ptx = compile_norm_modulate(D).asm["ptx"]
    assert "ld.global.b16" not in ptx and "st.global.b16" not in ptx
    assert "ld.global.v2.b32" in ptx and "st.global.v2.b32" in ptx


@pytest.mark.parametrize("D", [64, 1000, 3072, 5120])
@pytest.mark.parametrize("form", ["flux_bf16", "wan_fp32_ln", "affine_fp16", "wan_temb"])
def test_ln_modulate_compiles_for_sm90(D, form):
    kw = {"flux_bf16": {}, "wan_fp32_ln": dict(mod="fp32", ln="fp32"),
          "affine_fp16": dict(x="fp16", mod="fp16", out="fp16", ln="fp16", affine=True),
          "wan_temb": dict(mod="fp32", ln="fp32", temb="bf16")}[form]
    ck = compile_norm_modulate(D, **kw)
    ptx = ck.asm["ptx"]
    assert ck.asm.get("cubin")
    # Only our explicit tl.fma become FMAs: every other multiply/add is rounded on its own.
    assert "mul.rn.f32" in ptx and "fma.rn.f32" in ptx
    assert ".approx" not in ptx.replace("rsqrt.approx", "").replace("ex2.approx", "")
    assert ".ftz" not in ptx  # launch.EAGER_NUMERICS: libdevice without its FTZ reflect (rsqrt.approx.f32)
    if lns.is_uniform(D, lns.n_iters_for(D)):
        assert "div.rn.f32" in ptx  # only var = m2 / N remains a division


@pytest.mark.parametrize("heads", [False, True])
@pytest.mark.parametrize("D", [1000, 3072])
@pytest.mark.parametrize("affine", [False, True])
def test_layer_norm_launch_compiles_for_sm90_and_reads_no_scale(D, affine, heads):
    # family layer_norm: the kernel without its modulate (HAS_SCALE=False), eager's numerics as with it
    kw = dict(affine=affine, shift=False)
    ck, modulated = compile_norm_modulate(D, scale=False, heads=heads, **kw), compile_norm_modulate(D, **kw)
    ptx = ck.asm["ptx"]
    assert ck.asm.get("cubin")
    assert ".approx" not in ptx.replace("rsqrt.approx", "").replace("ex2.approx", "") and ".ftz" not in ptx
    assert ptx.count("ld.global") < modulated.asm["ptx"].count("ld.global")  # the scale loads are gone


def test_table_addends_are_added_in_fp32_once_per_element():
    # Wan's scale/shift = table + temb.float(): the kernel adds the widened bf16 temb to the fp32 table.
    base = compile_norm_modulate(3072, mod="fp32", ln="fp32").asm["ptx"]
    temb = compile_norm_modulate(3072, mod="fp32", ln="fp32", temb="bf16").asm["ptx"]
    adds = [ptx.count("add.rn.f32") for ptx in (base, temb)]
    # scale and shift each gain one add per element: 6 trips x 4 elements per thread x 2 operands
    assert adds[1] - adds[0] == 6 * 4 * 2, adds
    assert temb.count("fma.rn.f32") == base.count("fma.rn.f32")  # the add is not contracted into anything


def compile_gated_residual_norm_modulate(D, dtype="bf16", n_q=0, gated=True):
    """``dtype``: one dtype throughout, or Wan's forms: "wan_norm_out" (bf16 residual and x, fp32 table gate,
    scale and shift + bf16 temb, bf16 r, FP32LayerNorm) and "wan_norm2" (the same, affine, no modulate).
    ``gated=False``: RES is ``r``, normalized only (after the tile kernel)."""
    from diffusion_fuse.kernels import gated_residual_norm_modulate as gr

    n_iters = lns.n_iters_for(D)
    wan = dtype.startswith("wan")
    plain = dtype == "wan_norm2"  # Wan's norm2: affine FP32LayerNorm read by no modulate
    mod = "fp32" if wan else dtype  # Wan: fp32 table (+ bf16 temb), bf16 r and output, FP32LayerNorm
    const = dict(M_DT=CODE[mod], N_ITERS=n_iters, LANES=lns.LANES, VEC=lns.VEC, HAS_W=plain, HAS_B=plain,
                 HAS_SHIFT=not plain, LN_DT=CODE[mod], T_DT=CODE[mod], U_DT=CODE[mod], V_DT=CODE[mod],
                 AFFINE_FMA=True, **lns.DEFAULT_VARIANT.constexprs(), UNIFORM=lns.is_uniform(D, n_iters),
                 **quant_constexprs(n_q, out="bf16" if wan else dtype), HAS_GATE_TEMB=wan, HAS_SCALE=not plain,
                 HAS_SCALE_TEMB=wan and not plain, HAS_SHIFT_TEMB=wan and not plain, GATED=gated)
    act = "bf16" if wan else dtype
    types = {**{p: PTR[act] for p in ("RES", "X", "R_OUT", "OUT")},
             **{p: PTR[mod] for p in ("GATE", "W", "B", "SCALE", "SHIFT")},
             **{p: PTR["bf16" if wan else mod] for p in ("GATE_T", "SCALE_T", "SHIFT_T")},
             "N": "i32", "S": "i32", "eps": "fp32", **QUANT_TYPES}
    return compile_for_sm90(gr._gated_residual_norm_modulate_kernel, types, const)


@pytest.mark.parametrize("D, dtype, n_q", [(1000, "bf16", 0), (3072, "bf16", 0), (1000, "fp32", 0),
                                           (3072, "fp32", 0), (1000, "bf16", 1), (3072, "bf16", 2),
                                           (1000, "wan_norm2", 0), (3072, "wan_norm2", 0), (1000, "wan_norm_out", 0),
                                           (3072, "wan_norm_out", 0), (3072, "wan_norm_out", 1)])
def test_gated_residual_norm_modulate_compiles_for_sm90(D, dtype, n_q):
    ck = compile_gated_residual_norm_modulate(D, dtype, n_q)
    assert ck.asm.get("cubin") and "bar.sync" in ck.asm["ptx"]
    assert (E4M3_CVT in ck.asm["ptx"]) == (n_q > 0)
    assert ".approx" not in ck.asm["ptx"].replace("rsqrt.approx", "").replace("ex2.approx", "")
    assert ".ftz" not in ck.asm["ptx"]


@pytest.mark.parametrize("D", [1000, 3072])
def test_gated_residual_norm_modulate_reads_r_and_writes_none_when_not_gated(D):
    gated = compile_gated_residual_norm_modulate(D).asm["ptx"]
    ptx = compile_gated_residual_norm_modulate(D, gated=False).asm["ptx"]
    assert "mul.rn.f32" in gated and ptx.count("st.global") < gated.count("st.global")
    assert ptx.count("ld.global") < gated.count("ld.global")  # r only, no gate, x and residual


@pytest.mark.parametrize("temb", [False, True])
def test_gated_residual_tiles_read_and_write_d_major_tokens_in_whole_vectors(temb):
    # D-major residual and r (a patch embedding's tokens), row-major x and row copy: every access a 16-byte vector
    # along the operand's unit stride, the tile moved between the two orders through shared memory
    from diffusion_fuse.kernels import gated_residual as gr

    k = gr._gated_residual_tiles_kernel
    const = dict(M_DT=CODE["fp32"], HAS_GATE_TEMB=temb, GATE_PER_TOKEN=False, HAS_ROWS=True, BLOCK_S=gr.BLOCK_S,
                 BLOCK_D=gr.BLOCK_D, res_ss=1, x_sd=1, r_ss=1)  # unit strides: the launcher specializes them
    types = {"RES": "*bf16", "X": "*bf16", "GATE": "*fp32", "GATE_T": "*bf16", "R_OUT": "*bf16", "R_ROWS": "*bf16",
             "S": "i32", "D": "i32"}
    aligned = ["RES", "X", "GATE", "GATE_T", "R_OUT", "R_ROWS", "S", "D", "res_sb", "res_sd", "x_sb", "x_ss", "g_sb",
               "gt_sb", "r_sb", "r_sd"]
    ck = compile_for_sm90(k, types, const, aligned)
    ptx = ck.asm["ptx"]
    assert "mul.rn.f32" in ptx and "fma" not in ptx  # g * x rounded on its own, then + residual
    # a thread's share of the 64 x 64 tile is 32 elements an operand: residual and x in 4 vectors each, r and its
    # row copy likewise (the gate rows, 64 values a program, may be read in scalars)
    loads, stores = re.findall(r"ld\.global\S*", ptx), re.findall(r"st\.global\S*", ptx)
    assert loads.count("ld.global.v4.b32") >= 8 and stores == ["st.global.v4.b32"] * 8, (loads, stores)
    assert ck.metadata.shared > 0 and "ttg.convert_layout" in ck.asm["ttgir"]


@pytest.mark.parametrize("heads", [False, True])
def test_short_rows_compile_for_sm90_with_whole_vector_rows(heads):
    # 16 QK-norm rows of 128 a program: each thread's share of x and of the output in 8-byte vectors; the statistics
    # as the one-row kernel's (IEEE divisions, rsqrt.approx, no flush to zero)
    from diffusion_fuse.kernels import norm_modulate as nm

    const = dict(R=nm.SHORT_ROWS, HAS_W=True, HAS_B=True, LN_DT=CODE["bf16"], **lns.DEFAULT_VARIANT.constexprs(),
                 AFFINE_FMA=True, X_HEADS=heads, x_sd=1)
    types = {"X": "*bf16", "W": "*bf16", "B": "*bf16", "OUT": "*bf16", "M": "i32", "N": "i32", "S": "i32", "H": "i32",
             "eps": "fp32"}
    ck = compile_for_sm90(nm._short_rows_kernel, types, const, ["X", "W", "B", "OUT", "M", "N", "x_sb", "x_ss", "x_sh"])
    ptx = ck.asm["ptx"]
    assert ptx.count("ld.global.v2.b32") == 4 and ptx.count("st.global.v2.b32") == 4
    assert "div.rn.f32" in ptx and "rsqrt.approx.f32" in ptx and ".ftz" not in ptx and "div.full" not in ptx


def test_gated_residual_norm_modulate_takes_no_cache_hints():
    ptx = compile_gated_residual_norm_modulate(3072).asm["ptx"]
    assert "evict_first" not in ptx and "st.global.cs" not in ptx


@pytest.mark.parametrize("temb", [None, "bf16"])
def test_gated_residual_compiles_for_sm90(temb):
    ptx = compile_gated_residual(temb).asm["ptx"]
    assert "mul.rn.f32" in ptx and "fma" not in ptx  # g * x rounded on its own, then + residual
    assert "ld.global.v2.b32" in ptx and "st.global.v2.b32" in ptx  # 4 bf16 per access


def compile_gated_residual(temb=None):
    from diffusion_fuse.kernels import gated_residual as gr

    k = gr._gated_residual_kernel
    types = {"RES": "*bf16", "X": "*bf16", "GATE": "*fp32", "GATE_T": PTR[temb or "fp32"], "R_OUT": "*bf16",
             "N": "i32", "S": "i32"}
    const = dict(M_DT=CODE["fp32"], N_ITERS=lns.n_iters_for(3072), LANES=lns.LANES, VEC=lns.VEC,
                 HAS_GATE_TEMB=temb is not None)
    sig = {n: ("constexpr" if n in const else types.get(n, "i64")) for n in k.arg_names}
    aligned = [n for n in k.arg_names if n not in const and n != "S"]  # 16-byte aligned rows, D = 3072
    src = ASTSource(fn=k, signature=sig, constexprs={(k.arg_names.index(n),): v for n, v in const.items()},
                    attrs={(k.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, **EAGER_NUMERICS})


@pytest.mark.parametrize("D, n_q, keep_out, hints", [(1000, 1, False, False), (3072, 3, True, False),
                                                    (3072, 4, False, False), (3072, 2, True, True),
                                                    (3072, 1, False, True)])
def test_norm_modulate_with_quant_epilogue_compiles_for_sm90(D, n_q, keep_out, hints):
    ptx = compile_norm_modulate(D, n_q=n_q, keep_out=keep_out, cache_hints=hints).asm["ptx"]
    assert ptx.count(E4M3_CVT) >= n_q  # one conversion per quantizer (per vector pair)
    assert ".approx" not in ptx.replace("rsqrt.approx", "").replace("ex2.approx", "")
    assert ".ftz" not in ptx  # launch.EAGER_NUMERICS: libdevice without its FTZ reflect (rsqrt.approx.f32)
    stores = ptx.count("st.global")
    assert stores >= n_q and (keep_out or "st.global.v2.b32" not in ptx)  # no bf16 row store without keep_out
    assert ("st.global.cs" in ptx) == (hints and keep_out)


def compile_static_quant(x="bf16", q_mode=0):
    from diffusion_fuse.kernels import fp8_quant as fq
    from diffusion_fuse.kernels import static_quant as sq

    return compile_for_sm90(sq._static_quant_kernel, {"X": PTR[x], "SCALE": "*fp32", "Q": "*u8", "N": "i32",
                                                      "S": "i32", "q_lo": "fp32", "q_hi": "fp32"},
                            dict(BLOCK=fq.BLOCK, Q_MODE=q_mode, NAN_SIGN=True))


@pytest.mark.parametrize("x, q_mode", [("bf16", "div"), ("bf16", "mul"), ("fp32", "div")])
def test_static_quant_compiles_for_sm90(x, q_mode):
    from diffusion_fuse.kernels.fp8_quant import Q_MODES

    ptx = compile_static_quant(x, Q_MODES[q_mode]).asm["ptx"]
    assert E4M3_CVT in ptx and ".approx" not in ptx
    assert ("div.rn.f32" in ptx) == (q_mode == "div")  # the division is IEEE, as nvcc compiles eager's


def compile_cat_quant(keep_cat=False):
    from diffusion_fuse.kernels import cat_quant as cq
    from diffusion_fuse.kernels import fp8_quant as fq

    return compile_for_sm90(cq._cat_quant_kernel, {"A": "*bf16", "B": "*bf16", "SCALE": "*fp32", "C": "*bf16",
                                                    "Q": "*u8", "NA": "i32", "W": "i32", "S": "i32", "q_lo": "fp32",
                                                    "q_hi": "fp32"},
                            dict(BLOCK=fq.BLOCK, KEEP_CAT=keep_cat, Q_MODE=0, NAN_SIGN=False))


@pytest.mark.parametrize("keep_cat", [False, True])
def test_cat_quant_compiles_for_sm90(keep_cat):
    ck = compile_cat_quant(keep_cat)
    assert E4M3_CVT in ck.asm["ptx"] and ck.asm.get("cubin")


@pytest.mark.parametrize("compile_kernel", [
    lambda: compile_norm_modulate(3072), lambda: compile_norm_modulate(1000),
    lambda: compile_norm_modulate(3072, shift=False, scale=False, cache_hints=True, heads=True),
    lambda: compile_norm_modulate(3072, n_q=2, cache_hints=True),
    lambda: compile_gated_residual_norm_modulate(3072, n_q=1), compile_static_quant, lambda: compile_cat_quant(True),
    lambda: compile_norm_modulate(3072, mod="fp32", ln="fp32", temb="bf16"),
    lambda: compile_gated_residual_norm_modulate(3072, "wan_norm_out"), lambda: compile_gated_residual("bf16")],
    ids=["norm_modulate", "norm_modulate_general", "layer_norm_heads", "norm_modulate_quant_hints",
         "gated_residual_norm_modulate_quant", "static_quant", "cat_quant", "norm_modulate_temb",
         "gated_residual_norm_modulate_wan", "gated_residual"])
def test_kernels_are_cuda_graph_capture_safe(compile_kernel):
    """No scratch memory: Triton's launcher would take it from its own allocator, outside the
    graph pool, on every launch. The kernels take no other host-side action when launched
    (kernels/launch.py: the current stream, outputs from torch.empty; see diffusion_fuse/cudagraphs.py)."""
    ck = compile_kernel()
    assert ck.metadata.global_scratch_size == 0
    assert ck.metadata.profile_scratch_size == 0
    # row -> (batch, token) is an int32 division (layer_norm_stats.program_row): a 64-bit one is a long
    # routine every thread would run before its first load
    assert not re.search(r"\b(div|rem)\.[su]64\b", ck.asm["ptx"])


# --- kernels the pointwise pass generates (kernels/pointwise.py) ------------------------
def compile_pointwise(fn, *args):
    """Generate the kernel for ``fn`` (as one program) at these inputs' layout and compile it for sm_90."""
    import torch

    from diffusion_fuse.kernels.pointwise import load_kernel
    from diffusion_fuse.lowering.pointwise import generate_source
    from diffusion_fuse.testing.pointwise import program_of

    # (a complex input is passed as its view_as_real: pairs of its component dtype)
    ptr = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.bool: "*i1",
           torch.complex64: "*fp32", torch.complex128: "*fp64"}
    src = generate_source(list(args), program_of(fn, *args))
    k = load_kernel(src)
    sig = {**{f"in{i}": ptr[t.dtype] for i, t in enumerate(args)},
           **{f"out{j}": ptr[o.dtype] for j, o in enumerate(src.outputs)}, "numel": "i32",
           **{f"lut{i}": "*i32" for i in range(len(src.tables))},  # lookup tables (kernels/lut16.py)
           **{c: "constexpr" for c in src.constexprs}}
    # what Triton's JIT specializes at runtime for aligned pointers and a numel divisible by 16
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(args) + len(src.outputs) + 1 + len(src.tables))}
    ast = ASTSource(fn=k, signature=sig, constexprs={(k.arg_names.index(c),): v for c, v in src.constexprs.items()},
                    attrs=attrs)
    return src, triton.compile(ast, target=GPUTarget("cuda", 90, 32),
                               options={"num_warps": src.num_warps, **EAGER_NUMERICS})


def _pointwise_case(name):
    import torch

    from diffusion_fuse.testing import pointwise as pw

    g = torch.Generator().manual_seed(0)
    rn = lambda *s, dtype=torch.bfloat16: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    return {
        "gated_residual": (pw.gated_residual, (rn(1, 64, 3072), rn(1, 3072), rn(1, 64, 3072))),
        "rope_double": (pw.rope_double, (rn(1, 8, 24, 128), rn(1, 16, 24, 128), rn(24, 1, 128, dtype=torch.float32),
                                         rn(24, 1, 128, dtype=torch.float32))),
        "wan_residual": (pw.wan_residual, (rn(1, 64, 3072), rn(1, 64, 3072), rn(1, 1, 3072, dtype=torch.float32))),
        "gelu_cat": (pw.gelu_cat, (rn(1, 64, 3072), rn(1, 64, 12288))),
        "silu_div": (lambda x, y: torch.nn.functional.silu(x) / y, (rn(64, 3072, dtype=torch.float32),
                                                                     rn(64, 3072, dtype=torch.float32))),
        # transposes (tiled kernels): SANA's linear attention at 70 heads of 32, 256 tokens
        "sana_query_relu": (functools.partial(pw.sana_query_relu, heads=70), (rn(2, 256, 2240),)),
        "sana_attn_out": (pw.sana_attn_out, (rn(2, 70, 33, 256, dtype=torch.float32),)),
        # Lumina's complex128 RoPE: 24 heads of 96, 64 tokens
        "lumina_rope": (pw.lumina_rope, (rn(1, 64, 24, 96), pw.rope_freqs(64, 48, "cpu", g, torch.complex128)[None])),
        # ... on its key of 8 heads, repeated 3 times (grouped-query attention)
        "lumina_key_gqa": (functools.partial(pw.lumina_key_gqa, n_rep=3),
                           (rn(1, 64, 8, 96), pw.rope_freqs(64, 48, "cpu", g, torch.complex128)[None])),
    }[name]


@pytest.mark.parametrize("name", ["gated_residual", "rope_double", "wan_residual", "gelu_cat", "silu_div",
                                  "sana_query_relu", "sana_attn_out", "lumina_rope", "lumina_key_gqa"])
def test_pointwise_kernels_compile_for_sm90(name):
    fn, args = _pointwise_case(name)
    src, ck = compile_pointwise(fn, *args)
    ptx = ck.asm["ptx"]
    assert ck.asm.get("cubin")
    # CUDA-graph capture-safe, as test_kernels_are_cuda_graph_capture_safe checks for the others
    assert ck.metadata.global_scratch_size == 0 and ck.metadata.profile_scratch_size == 0
    # IEEE division only (div_rn), never the approximate one Triton's `/` gives
    assert "div.full" not in ptx and "div.approx" not in ptx
    if "libdevice" not in src.source and "tl.fma" not in src.source:
        assert "fma" not in ptx  # enable_fp_fusion=False: no contraction of our mul + add
    if "tl.fma" in src.source:
        assert re.search(r"fma\.rn\.f(32|64)", ptx)
    # libdevice without its FTZ reflect (launch.EAGER_NUMERICS): the only .ftz left are the approximations
    # __nv_expf/__nv_tanhf use whatever the reflect (with it on: abs/fma/cvt .ftz too, which flush subnormals)
    ftz_ops = set(re.findall(r"\b([a-z0-9]+(?:\.[a-z0-9]+)*\.ftz(?:\.[a-z0-9]+)*)", ptx))
    assert ftz_ops <= {"ex2.approx.ftz.f32", "rcp.approx.ftz.f32"}, ftz_ops
    if name in ("gated_residual", "wan_residual", "gelu_cat"):
        # contiguous operands: the index simplifies to the flat offset, loads and stores are 16-byte vectors
        assert "ld.global.v4" in ptx and "st.global.v4" in ptx, name
    if name == "gelu_cat":
        # FLUX's single block: row tiles of CAT_ROWS x BLOCK, gelu looked up (one table in shared memory)
        assert "CAT_ROWS" in src.constexprs and len(src.tables) == 1 and ck.metadata.shared >= 16384, src.constexprs
    if name == "rope_double":
        # the rotation partner is the neighbouring lane's element, swapped in registers: x is read once with
        # vector loads, no scalar partner loads, no shared memory
        assert "ld.global.v4" in ptx and not re.search(r"ld\.global(\.nc)?\.(b16|u16)\b", ptx), name
        assert ck.metadata.shared == 0
    if name.startswith("lumina_"):
        # the product in doubles as c10::complex<double>: fma(a, c, -(b*d)) with C++'s negation, then the double
        # narrowed to float before bf16
        assert "neg.f64" in ptx and "fma.rn.f64" in ptx and "cvt.rn.f32.f64" in ptx, name
    if name.startswith("sana_"):
        # a transpose, tiled: loads contiguous along one tile index, stores along the other, both 16-byte
        # vectors; the values change layout once, through shared memory
        assert src.tile is not None, src
        assert "ld.global.v4" in ptx and "st.global.v4" in ptx, name
        assert ck.asm["ttgir"].count("ttg.convert_layout") == 1 and ck.metadata.shared > 0


def sass_instructions(ck) -> list[str]:
    """The sm_90 instructions of a compiled kernel (Triton's own nvdisasm on its cubin)."""
    import os
    import subprocess
    import tempfile

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(ck.asm["cubin"])
        f.flush()
        text = subprocess.run([tool, "-c", f.name], capture_output=True, text=True, check=True).stdout
    return [ln.split(";")[0].split("*/", 1)[1].strip() for ln in text.splitlines()
            if re.match(r"\s+/\*[0-9a-f]{4}\*/", ln)]


def test_lut16_gelu_takes_fewer_instructions_than_its_recipe():
    """kernels/lut16.py: gelu-tanh looked up (the table through shared memory: STS to fill, LDS to gather) in
    8192-element / 16-warp programs against the recipe's libdevice ``tanhf`` (pointwise_ops), per element.
    ``-s`` prints the counts."""
    import triton.language as tl
    from triton.language.extra import libdevice

    from diffusion_fuse.kernels import lut16
    from diffusion_fuse.kernels.pointwise_ops import GELU_TANH_BETA, GELU_TANH_KAPPA

    @triton.jit
    def gelu_recipe(X, O, n, BETA: tl.constexpr, KAPPA: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(X + offs, mask=offs < n, other=0.0).to(tl.float32)
        t = libdevice.tanh(BETA * tl.fma(KAPPA, (x * x) * x, x))
        tl.store(O + offs, ((0.5 * x) * (1.0 + t)).to(tl.bfloat16), mask=offs < n)

    def build(k, types, const, warps):
        sig = {n: ("constexpr" if n in const else types.get(n, "i64")) for n in k.arg_names}
        attrs = {(k.arg_names.index(n),): [["tt.divisibility", 16]] for n in types}
        src = ASTSource(fn=k, signature=sig, constexprs={(k.arg_names.index(n),): v for n, v in const.items()},
                        attrs=attrs)
        return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, **EAGER_NUMERICS})

    block = 8192
    ref = build(gelu_recipe, {"X": "*bf16", "O": "*bf16", "n": "i32"},
                {"BETA": GELU_TANH_BETA, "KAPPA": GELU_TANH_KAPPA, "BLOCK": block}, 16)
    # the window and table size build_lut16 gives gelu-tanh on the H200
    const = dict(LO=0x3B4B, SPAN=1371, SPECIAL=0x7F80, TABLE=4096, BLOCK=block)
    look = build(lut16._lut16_kernel, {"X": "*bf16", "O": "*bf16", "LUT": "*i32", "n": "i32"}, const, 16)
    per_thread = block // (32 * 16)
    r, lk = sass_instructions(ref), sass_instructions(look)
    print(f"gelu-tanh per element: recipe {len(r) / per_thread:.1f}, lookup {len(lk) / per_thread:.1f} sm_90 "
          f"instructions; lookup {look.metadata.shared} B shared")
    assert any(i.startswith("LDS") for i in lk) and any(i.startswith("STS") for i in lk)
    assert not any(i.startswith("MUFU") for i in lk)  # no ex2/rcp: nothing of tanhf is computed
    assert len(lk) < 0.7 * len(r)


def compile_depthwise_conv(dtype="bf16", glu=False, order_index=0, has_bias=True, channels_last=True):
    """Compile as the launcher does for 16-byte aligned operands with strides that are multiples of 16 (SANA's
    11200 channels): each layout's kernel at its own constants, a 3 x 3 filter padded by 1."""
    from diffusion_fuse.kernels import depthwise_conv as dw

    tap_order, bias_first, skip = dw.CANDIDATES[order_index]
    const = dict(KH=3, KW=3, PAD_H=1, PAD_W=1, HAS_BIAS=has_bias, BIAS_FIRST=bias_first, TAP_ORDER=tap_order,
                 SKIP=skip, GLU=glu, INTERPRETED=False)
    if channels_last:
        block_c, rows, warps = dw.CL_CONSTANTS[glu]
        k = dw.depthwise_conv_cl_kernel
        const.update(BLOCK_C=block_c, ROWS=rows)
    else:
        k, warps = dw.depthwise_conv_kernel, dw.NUM_WARPS
        const.update(BLOCK_C=dw.BLOCK_C, BLOCK_W=dw.MAX_BLOCK_W, ROWS=dw.ROWS, xs_w=1, ys_w=1)
    names = k.arg_names
    types = {n: {"X": PTR[dtype], "Wt": PTR[dtype], "B": PTR[dtype], "Y": PTR[dtype]}.get(n, "i32") for n in names}
    aligned = [n for n in ("X", "Wt", "B", "Y", "C_OUT", "xs_n", "xs_c", "xs_h", "xs_w", "ys_n", "ys_c", "ys_h",
                           "ys_w", "value_off", "gate_off") if n in names and n not in const]
    return compile_for_sm90(k, types, const, aligned, warps)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("glu", [False, True])
@pytest.mark.parametrize("order_index, has_bias", [(0, True), (1, True), (0, False)])
@pytest.mark.parametrize("channels_last", [True, False])
def test_depthwise_conv_compiles_for_sm90(dtype, glu, order_index, has_bias, channels_last):
    """Each candidate order, with and without the GLU tail, with and without a bias, both layouts' kernels. The
    convolution contracts nothing to an FMA (the order of the adds is the contract); the tail's silu divides with
    div.rn and negates with neg.f32 (eager's ``-x``); its FMAs are libdevice's expf's own."""
    ptx = compile_depthwise_conv(dtype, glu, order_index, has_bias, channels_last).asm["ptx"]
    assert glu or "fma" not in ptx
    assert ("div.rn.f32" in ptx and "neg.f32" in ptx) == glu


def sass_loop_bodies(ck) -> list[list[str]]:
    """The sm_90 instructions of each loop of a compiled kernel (from a label to the branch back to it)."""
    import os
    import subprocess
    import tempfile

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(ck.asm["cubin"])
        f.flush()
        text = subprocess.run([tool, "-c", f.name], capture_output=True, text=True, check=True).stdout
    lines, labels, bodies = [], {}, []
    for ln in text.splitlines():
        if m := re.match(r"\s*\.(L_x_\d+):", ln):
            labels[m.group(1)] = len(lines)
        elif m := re.match(r"\s+/\*[0-9a-f]{4}\*/\s+(.*?);", ln):
            lines.append(m.group(1).strip())
            target = re.search(r"BRA\s+`?\(?\.(L_x_\d+)", lines[-1])
            if target and labels.get(target.group(1), len(lines)) < len(lines) - 1:
                bodies.append(lines[labels[target.group(1)]:])
    return bodies


@pytest.mark.parametrize("glu", [False, True])
def test_channels_last_depthwise_loads_each_input_once_per_filter_row(glu):
    """``depthwise_conv_cl_kernel`` at its constants: each step along the columns loads one new input column, 3
    vector loads of adjacent channels a thread for a 3 x 3 filter (twice that with the GLU: value and gate); the
    filters stay in registers; nothing goes through shared memory or spills to local memory. ``-s`` prints the
    step's size."""
    from diffusion_fuse.kernels import depthwise_conv as dw

    ck = compile_depthwise_conv(glu=glu)
    (body,) = sass_loop_bodies(ck)
    ops = [i.split()[1] if i.startswith("@") else i.split()[0] for i in body]
    loads = [o for o in ops if o.startswith("LDG")]
    block_c, rows, warps = dw.CL_CONSTANTS[glu]
    per_thread = block_c * rows // (32 * warps)
    print(f"glu={glu}: {len(body)} instructions a step, {len(body) / per_thread:.1f} an output, {cubin_registers(ck)}"
          f" registers")
    # a thread holding several adjacent channels loads them as one vector; one holding a single output, alone
    widths = ("LDG.E.64", "LDG.E.128") if per_thread > 1 else ("LDG.E.U16",)
    assert len(loads) == (6 if glu else 3) and all(o in widths for o in loads), loads
    assert not any(o.startswith(("LDL", "STL", "LDS", "STS", "BAR")) for o in ops), sorted(set(ops))
