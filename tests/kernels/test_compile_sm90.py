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


def compile_for_sm90(kernel, types: dict, const: dict):
    """Compile ``kernel`` for sm_90: ``types`` maps runtime argument names to Triton types (others i64)."""
    sig = {n: ("constexpr" if n in const else types.get(n, "i64")) for n in kernel.arg_names}
    src = ASTSource(fn=kernel, signature=sig, constexprs={(kernel.arg_names.index(n),): v for n, v in const.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, **EAGER_NUMERICS})


def compile_ln_modulate(D, x="bf16", mod="bf16", out="bf16", ln="bf16", affine=False, shift=True, n_q=0,
                        keep_out=True, rows=0, temb=None, group=1, one_exchange=False, max_registers=None,
                        cache_hints=0):
    """Compile as the launcher does for contiguous, 16-byte aligned operands: x's unit stride along D
    is a constant, pointers and row strides carry Triton's divisibility-by-16 specialization.
    ``rows`` > 0: the several-rows-per-program kernel (UNIFORM D only). ``temb``: the dtype of
    scale's and shift's second addends (Wan's timestep table), or None. ``group`` > 1: the row-group
    kernel (``group`` rows side by side, 4 * group warps; UNIFORM D only)."""
    assert not (rows and group > 1)
    k = lm._ln_modulate_rows_kernel if rows else lm._ln_modulate_row_group_kernel if group > 1 else \
        lm._ln_modulate_kernel
    rows = rows or (group if group > 1 else 0)  # both take ROWS and M
    n_iters = lns.n_iters_for(D)
    const = dict(N_ITERS=n_iters, LANES=lns.LANES, VEC=lns.VEC, HAS_W=affine, HAS_B=affine, HAS_SHIFT=shift,
                 LN_DT=CODE[ln], T_DT=CODE[mod], U_DT=CODE[mod], V_DT=CODE[mod], AFFINE_FMA=True,
                 **lns.DEFAULT_VARIANT.constexprs(), UNIFORM=lns.is_uniform(D, n_iters),
                 **quant_constexprs(n_q, keep_out, out), **({"ROWS": rows} if rows else {}),
                 HAS_SCALE_TEMB=temb is not None, HAS_SHIFT_TEMB=temb is not None and shift,
                 ONE_EXCHANGE=one_exchange, **({} if rows else {"CACHE_HINTS": cache_hints}))
    names = k.arg_names
    sig = {"X": PTR[x], "W": PTR[ln], "B": PTR[ln], "SCALE": PTR[mod], "SHIFT": PTR[mod], "OUT": PTR[out],
           "SCALE_T": PTR[temb or mod], "SHIFT_T": PTR[temb or mod],
           "N": "i32", "S": "i32", "M": "i32", "eps": "fp32", **QUANT_TYPES}
    sig = {n: sig.get(n, "i64") for n in names}
    sig.update({n: "constexpr" for n in [*const, "x_sd"]})
    constexprs = {(names.index(n),): v for n, v in {**const, "x_sd": 1}.items()}
    aligned = ["X", "W", "B", "SCALE", "SHIFT", "OUT", "x_sb", "x_ss", "sc_sb", "sc_ss", "sh_sb", "sh_ss",
               "SCALE_T", "SHIFT_T", "sct_sb", "sct_ss", "sht_sb", "sht_ss"]
    aligned += ["N"] if D % 16 == 0 else []
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    src = ASTSource(fn=k, signature=sig, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": 4 * group, **EAGER_NUMERICS}
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options=options if max_registers is None else {**options, "maxnreg": max_registers})


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


def cubin_stack_bytes(ck) -> int:
    """Stack bytes per thread (register spills land there), from Triton's own cuobjdump."""
    import os
    import subprocess
    import tempfile

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(ck.asm["cubin"])
        f.flush()
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"STACK:(\d+)", usage).group(1))


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


def identity_layout(threads: int) -> set[str]:
    """IDENTITY_LAYOUTS for a [threads] tensor in a program of threads // 32 warps."""
    warps = ", ".join(f"[{1 << b}]" for b in range(5, threads.bit_length() - 1))
    blocked = f"sizePerThread = [1], threadsPerWarp = [32], warpsPerCTA = [{threads // 32}], order = [0]"
    return {f"#ttg.linear<{{register = [], lane = [[1], [2], [4], [8], [16]], warp = [{warps}], block = []}}>",
            f"#ttg.blocked<{{{blocked}}}>"}


def shuffle_layouts_any(ttgir: str) -> set[str]:
    """``shuffle_layouts`` for any [n] state (a row group's is [rows * 128])."""
    defs = dict(line.split(" = ", 1) for line in ttgir.splitlines() if line.startswith("#") and " = " in line)
    used = {m for line in ttgir.splitlines() if "shfl.sync.down" in line
            for m in re.findall(r"tensor<\d+xi32, (#\w+)>", line)}
    return {defs[u] for u in used}


# kernels/norm_modulate.py LaunchVariant: (row_group, one_exchange) at the three benchmark forms. Registers and
# shared memory per variant print with -s (the NOTES.md numbers); the default's PTX is unchanged.
LAUNCH_FORMS = {"flux_3072": (3072, {}), "wan21_5120": (5120, dict(mod="fp32", ln="fp32")),
                "wan22_3072": (3072, dict(mod="fp32", ln="fp32"))}


@pytest.mark.parametrize("group, one_exchange", [(1, False), (2, False), (4, False), (1, True), (2, True), (4, True)])
@pytest.mark.parametrize("form", list(LAUNCH_FORMS))
def test_launch_variants_compile_for_sm90(form, group, one_exchange):
    D, kw = LAUNCH_FORMS[form]
    ck = compile_ln_modulate(D, group=group, one_exchange=one_exchange, **kw)
    ptx = ck.asm["ptx"]
    regs = cubin_registers(ck)
    print(f"{form} group={group} one_exchange={one_exchange}: {regs} registers, {ck.metadata.shared} B shared, "
          f"{ptx.count('bar.sync')} bar.sync")
    assert ck.asm.get("cubin") and ck.metadata.global_scratch_size == 0
    # every row's lanes are threads in the one-row order: the shuffles see lane i in thread i
    assert shuffle_layouts_any(ck.asm["ttgir"]) <= identity_layout(128 * group)
    # the cross-warp levels: one exchange (one barrier), or one per quantity (mean, m2: three barriers)
    assert ptx.count("bar.sync") == (1 if one_exchange else 3)
    assert ".approx" not in ptx.replace("rsqrt.approx", "").replace("ex2.approx", "")
    assert ".ftz" not in ptx  # launch.EAGER_NUMERICS: libdevice without its FTZ reflect (rsqrt.approx.f32)
    if group == 2:  # a second row per program costs (almost) no registers per thread (what idea 1 relies on):
        # ptxas' allocation moves by a register or two (Wan2.1 with one exchange: 72 against the one-row 70)
        assert regs <= cubin_registers(compile_ln_modulate(D, **kw)) + 2


@pytest.mark.parametrize("name", [n for n, lv in lm.LAUNCH_CANDIDATES.items() if lv.max_registers])
@pytest.mark.parametrize("form", list(LAUNCH_FORMS))
def test_register_capped_candidates_compile_for_sm90(form, name):
    lv = lm.LAUNCH_CANDIDATES[name]
    D, kw = LAUNCH_FORMS[form]
    ck = compile_ln_modulate(D, group=lv.row_group, one_exchange=lv.one_exchange, max_registers=lv.max_registers,
                             **kw)
    regs, stack = cubin_registers(ck), cubin_stack_bytes(ck)
    print(f"{form} {name}: {regs} registers, {stack} B stack (spills)")
    assert regs <= lv.max_registers
    # the one-row caps were chosen where they fit without spilling: 40 at D = 3072, 56 at D = 5120 (fp32 LN);
    # a row group at 40 spills a few bytes (measured as is: the GPU decides)
    if lv.row_group == 1 and (lv.max_registers, D) in ((40, 3072), (56, 5120)):
        assert stack == 0


@pytest.mark.parametrize("name", [n for n, lv in lm.LAUNCH_CANDIDATES.items() if lv.cache_hints])
@pytest.mark.parametrize("form", list(LAUNCH_FORMS))
def test_cache_hint_candidates_compile_for_sm90(form, name):
    """Cache hints change the row's loads (an L2 evict-first policy) or the output's stores (``.cs``) and
    nothing else: same registers, same instruction count but for the policy's own."""
    lv = lm.LAUNCH_CANDIDATES[name]
    D, kw = LAUNCH_FORMS[form]
    ck, base = compile_ln_modulate(D, cache_hints=lv.cache_hints, **kw), compile_ln_modulate(D, **kw)
    ptx, regs = ck.asm["ptx"], cubin_registers(ck)
    print(f"{form} {name}: {regs} registers (default {cubin_registers(base)})")
    assert ("evict_first" in ptx) == bool(lv.cache_hints & 1)
    assert ("st.global.cs" in ptx) == bool(lv.cache_hints & 2)
    assert "evict_first" not in base.asm["ptx"] and "st.global.cs" not in base.asm["ptx"]
    assert regs <= cubin_registers(base) + 2


def test_aligned_rows_load_and_store_4_elements_per_instruction():
    ptx = compile_ln_modulate(3072).asm["ptx"]
    assert "ld.global.b16" not in ptx and "st.global.b16" not in ptx
    assert "ld.global.v2.b32" in ptx and "st.global.v2.b32" in ptx


@pytest.mark.parametrize("D", [64, 1000, 3072, 5120])
@pytest.mark.parametrize("form", ["flux_bf16", "wan_fp32_ln", "affine_fp16", "wan_temb"])
def test_ln_modulate_compiles_for_sm90(D, form):
    kw = {"flux_bf16": {}, "wan_fp32_ln": dict(mod="fp32", ln="fp32"),
          "affine_fp16": dict(x="fp16", mod="fp16", out="fp16", ln="fp16", affine=True),
          "wan_temb": dict(mod="fp32", ln="fp32", temb="bf16")}[form]
    ck = compile_ln_modulate(D, **kw)
    ptx = ck.asm["ptx"]
    assert ck.asm.get("cubin")
    # Only our explicit tl.fma become FMAs: every other multiply/add is rounded on its own.
    assert "mul.rn.f32" in ptx and "fma.rn.f32" in ptx
    assert ".approx" not in ptx.replace("rsqrt.approx", "").replace("ex2.approx", "")
    assert ".ftz" not in ptx  # launch.EAGER_NUMERICS: libdevice without its FTZ reflect (rsqrt.approx.f32)
    if lns.is_uniform(D, lns.n_iters_for(D)):
        assert "div.rn.f32" in ptx  # only var = m2 / N remains a division


def test_table_addends_are_added_in_fp32_once_per_element():
    # Wan's scale/shift = table + temb.float(): the kernel adds the widened bf16 temb to the fp32 table.
    base = compile_ln_modulate(3072, mod="fp32", ln="fp32").asm["ptx"]
    temb = compile_ln_modulate(3072, mod="fp32", ln="fp32", temb="bf16").asm["ptx"]
    adds = [ptx.count("add.rn.f32") for ptx in (base, temb)]
    # scale and shift each gain one add per element: 6 trips x 4 elements per thread x 2 operands
    assert adds[1] - adds[0] == 6 * 4 * 2, adds
    assert temb.count("fma.rn.f32") == base.count("fma.rn.f32")  # the add is not contracted into anything


def compile_gated_residual_ln_modulate(D, dtype="bf16", n_q=0, cache_hints=0):
    """``dtype``: one dtype throughout, or Wan's forms: "wan_norm_out" (bf16 residual and x, fp32 table gate,
    scale and shift + bf16 temb, bf16 r, FP32LayerNorm) and "wan_norm2" (the same, affine, no modulate)."""
    from diffusion_fuse.kernels import gated_residual_ln as gr

    n_iters = lns.n_iters_for(D)
    wan = dtype.startswith("wan")
    plain = dtype == "wan_norm2"  # Wan's norm2: affine FP32LayerNorm read by no modulate
    mod = "fp32" if wan else dtype  # Wan: fp32 table (+ bf16 temb), bf16 r and output, FP32LayerNorm
    const = dict(M_DT=CODE[mod], N_ITERS=n_iters, LANES=lns.LANES, VEC=lns.VEC, HAS_W=plain, HAS_B=plain,
                 HAS_SHIFT=not plain, LN_DT=CODE[mod], T_DT=CODE[mod], U_DT=CODE[mod], V_DT=CODE[mod],
                 AFFINE_FMA=True, **lns.DEFAULT_VARIANT.constexprs(), UNIFORM=lns.is_uniform(D, n_iters),
                 **quant_constexprs(n_q, out="bf16" if wan else dtype), HAS_GATE_TEMB=wan, HAS_SCALE=not plain,
                 HAS_SCALE_TEMB=wan and not plain, HAS_SHIFT_TEMB=wan and not plain, CACHE_HINTS=cache_hints)
    act = "bf16" if wan else dtype
    types = {**{p: PTR[act] for p in ("RES", "X", "R_OUT", "OUT")},
             **{p: PTR[mod] for p in ("GATE", "W", "B", "SCALE", "SHIFT")},
             **{p: PTR["bf16" if wan else mod] for p in ("GATE_T", "SCALE_T", "SHIFT_T")},
             "N": "i32", "S": "i32", "eps": "fp32", **QUANT_TYPES}
    return compile_for_sm90(gr._gated_residual_ln_modulate_kernel, types, const)


@pytest.mark.parametrize("D, dtype, n_q", [(1000, "bf16", 0), (3072, "bf16", 0), (1000, "fp32", 0),
                                           (3072, "fp32", 0), (1000, "bf16", 1), (3072, "bf16", 2),
                                           (1000, "wan_norm2", 0), (3072, "wan_norm2", 0), (1000, "wan_norm_out", 0),
                                           (3072, "wan_norm_out", 0), (3072, "wan_norm_out", 1)])
def test_gated_residual_ln_modulate_compiles_for_sm90(D, dtype, n_q):
    ck = compile_gated_residual_ln_modulate(D, dtype, n_q)
    assert ck.asm.get("cubin") and "bar.sync" in ck.asm["ptx"]
    assert (E4M3_CVT in ck.asm["ptx"]) == (n_q > 0)
    assert ".approx" not in ck.asm["ptx"].replace("rsqrt.approx", "").replace("ex2.approx", "")
    assert ".ftz" not in ck.asm["ptx"]


@pytest.mark.parametrize("cache_hints", [1, 2, 3])
def test_gated_cache_hints_compile_for_sm90(cache_hints):
    """The gated kernel's hints: evict-first on x's and residual's loads, ``.cs`` on r's and the output's
    stores, nothing else (same registers, within 2)."""
    ck, base = compile_gated_residual_ln_modulate(3072, cache_hints=cache_hints), compile_gated_residual_ln_modulate(3072)
    ptx = ck.asm["ptx"]
    print(f"gated cache_hints={cache_hints}: {cubin_registers(ck)} registers (default {cubin_registers(base)})")
    assert ("evict_first" in ptx) == bool(cache_hints & 1)
    assert ("st.global.cs" in ptx) == bool(cache_hints & 2)
    if cache_hints & 2:  # r and the output: every store of the row streams
        assert "st.global.v2.b32 " not in ptx.replace("st.global.cs.v2.b32", "")
    assert cubin_registers(ck) <= cubin_registers(base) + 2


@pytest.mark.parametrize("temb", [None, "bf16"])
def test_gated_residual_compiles_for_sm90(temb):
    ptx = compile_gated_residual(temb).asm["ptx"]
    assert "mul.rn.f32" in ptx and "fma" not in ptx  # g * x rounded on its own, then + residual
    assert "ld.global.v2.b32" in ptx and "st.global.v2.b32" in ptx  # 4 bf16 per access


def compile_gated_residual(temb=None):
    from diffusion_fuse.kernels import gated_residual_ln as gr

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


@pytest.mark.parametrize("D, n_q, keep_out, rows", [(1000, 1, False, 0), (3072, 3, True, 0), (3072, 4, False, 0),
                                                   (3072, 2, True, 4), (3072, 1, False, 4)])
def test_ln_modulate_with_quant_epilogue_compiles_for_sm90(D, n_q, keep_out, rows):
    ptx = compile_ln_modulate(D, n_q=n_q, keep_out=keep_out, rows=rows).asm["ptx"]
    assert ptx.count(E4M3_CVT) >= n_q  # one conversion per quantizer (per vector pair)
    assert ".approx" not in ptx.replace("rsqrt.approx", "").replace("ex2.approx", "")
    assert ".ftz" not in ptx  # launch.EAGER_NUMERICS: libdevice without its FTZ reflect (rsqrt.approx.f32)
    stores = ptx.count("st.global")
    assert stores >= n_q and (keep_out or "st.global.v2.b32" not in ptx)  # no bf16 row store without keep_out


def compile_static_quant(x="bf16", q_mode=0):
    from diffusion_fuse.kernels import fp8_quant as fq

    return compile_for_sm90(fq._static_quant_kernel, {"X": PTR[x], "SCALE": "*fp32", "Q": "*u8", "N": "i32",
                                                      "S": "i32", "q_lo": "fp32", "q_hi": "fp32"},
                            dict(BLOCK=fq.BLOCK, Q_MODE=q_mode, NAN_SIGN=True))


@pytest.mark.parametrize("x, q_mode", [("bf16", 0), ("bf16", 1), ("bf16", 2), ("fp32", 0)])
def test_static_quant_compiles_for_sm90(x, q_mode):
    ptx = compile_static_quant(x, q_mode).asm["ptx"]
    assert E4M3_CVT in ptx and ".approx" not in ptx
    assert ("div.rn.f32" in ptx) == (q_mode != 1)  # the division is IEEE, as nvcc compiles eager's


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
    lambda: compile_ln_modulate(3072), lambda: compile_ln_modulate(1000),
    lambda: compile_ln_modulate(3072, n_q=2, rows=4), lambda: compile_gated_residual_ln_modulate(3072, n_q=1),
    compile_static_quant, lambda: compile_cat_quant(True), lambda: compile_ln_modulate(3072, temb="bf16", rows=4),
    lambda: compile_gated_residual_ln_modulate(3072, "wan_norm_out"), lambda: compile_gated_residual("bf16")],
    ids=["norm_modulate", "ln_modulate_general", "ln_modulate_rows_quant", "gated_residual_quant", "static_quant",
         "cat_quant", "ln_modulate_rows_temb", "gated_residual_ln_wan", "gated_residual"])
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

    ptr = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.bool: "*i1"}
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
    }[name]


@pytest.mark.parametrize("name", ["gated_residual", "rope_double", "wan_residual", "gelu_cat", "silu_div",
                                  "sana_query_relu", "sana_attn_out"])
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
        assert "fma.rn.f32" in ptx
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
    ``-s`` prints the counts BENCHMARKS.md quotes (~18 against ~33)."""
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
    # the window and table size gelu-tanh gets on the H200 (results/h200-2026-11-30j/run1/probe_lut16.json)
    const = dict(LO=0x3B4B, SPAN=1371, SPECIAL=0x7F80, TABLE=4096, BLOCK=block)
    look = build(lut16._lut16_kernel, {"X": "*bf16", "O": "*bf16", "LUT": "*i32", "n": "i32"}, const, 16)
    per_thread = block // (32 * 16)
    r, lk = sass_instructions(ref), sass_instructions(look)
    print(f"gelu-tanh per element: recipe {len(r) / per_thread:.1f}, lookup {len(lk) / per_thread:.1f} sm_90 "
          f"instructions; lookup {look.metadata.shared} B shared")
    assert any(i.startswith("LDS") for i in lk) and any(i.startswith("STS") for i in lk)
    assert not any(i.startswith("MUFU") for i in lk)  # no ex2/rcp: nothing of tanhf is computed
    assert len(lk) < 0.7 * len(r)
