"""Helpers to exercise the pointwise pass and its generated kernels on small functions (tests, benchmarks).

    gm, sites = fuse(fn, *args)            # fn traced to ATen, rewritten by the pointwise pass
    key = program_of(fn, *args)            # the whole traced fn as one program (even a single op)
    outs = run_program(key, inputs)        # its generated kernel, launched directly (no guard, no cache)
"""

from __future__ import annotations

import functools

import torch
import torch.fx as fx

from ..kernels.pointwise_ops import DEFAULT_VARIANTS, Variants


def trace(fn, *args) -> fx.GraphModule:
    """``fn`` as an ATen graph without decompositions (what the lossless tier sees), with fake values; writes
    into intermediates functionalized as AOTAutograd does (``slice_scatter``, not ``copy_`` into a view)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(torch.func.functionalize(fn, remove="mutations"), tracing_mode="fake")(*args)


def fuse(fn, *args):
    """(graph module rewritten by the pointwise pass, its sites), after the rewrite the pipeline runs before it."""
    from ..config import Options
    from ..fxpasses.base import PassContext
    from ..fxpasses.cleanup import CleanupPass
    from ..fxpasses.interleave_scatter import InterleaveScatterPass
    from ..fxpasses.pointwise import PointwiseFusionPass

    gm = trace(fn, *args)
    ctx = PassContext(options=Options())
    InterleaveScatterPass()(gm.graph, ctx)
    PointwiseFusionPass()(gm.graph, ctx)
    CleanupPass()(gm.graph, ctx)
    gm.recompile()
    return gm, ctx.sites


def site_ops(site) -> list[str]:
    """Short names of the computing ops a pointwise site replaced, in graph order (views left out)."""
    import operator

    from ..kernels.pointwise import COMPLEX_VIEWS, MULTI_VIEW_OPS, VIEW_OPS
    from ..patterns.match_utils import describe

    views = VIEW_OPS | MULTI_VIEW_OPS | COMPLEX_VIEWS | {operator.getitem}
    return [d.split(".")[0] for n, d in zip(site.nodes, describe(site.nodes)) if n.target not in views]


def program_of(fn, *args) -> str:
    """Register all of ``fn``'s ops as one program (no grouping rules); returns its key."""
    from ..fxpasses.pointwise import _program
    from ..lowering.pointwise import register_program
    from ..patterns.match_utils import describe

    gm = trace(fn, *args)
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    body = [n for n in gm.graph.nodes if n.op == "call_function"]
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    outputs = list(out) if isinstance(out, (list, tuple)) else [out]
    return register_program(_program(body, inputs, outputs), describe(body))


def run_program(key: str, inputs, variants: Variants = DEFAULT_VARIANTS) -> list[torch.Tensor]:
    """Generate ``key``'s kernel for ``inputs`` (with ``variants``) and launch it through Triton's JIT."""
    from ..lowering.pointwise import launch_once

    return launch_once(key, list(inputs), variants)


# ---------------------------------------------------------------------------------------------
# The chains the pass fuses in diffusion transformers, at real shapes (GPU test, benchmark)
# ---------------------------------------------------------------------------------------------
def rope(x, cos, sin):
    """diffusers ``apply_rotary_emb(use_real=True, use_real_unbind_dim=-1)`` (FLUX, HunyuanVideo, ...)."""
    x_real, x_imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
    x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(3)
    return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)


def rope_double(q_txt, q_img, cos, sin):  # FLUX double block: txt/img cat, then RoPE
    return rope(torch.cat([q_txt, q_img], dim=1), cos, sin)


def gated_residual(res, gate, y):  # x + gate.unsqueeze(1) * attn_output
    return res + gate.unsqueeze(1) * y


def gelu_cat(attn, mlp):  # FLUX single block: cat([attn, gelu(proj_mlp(x))]) feeding proj_out
    return torch.cat([attn, torch.nn.functional.gelu(mlp, approximate="tanh")], dim=2)


def gelu_erf_cat(attn, mlp):  # the same with nn.GELU()'s erf form: exact only as a table lookup
    return torch.cat([attn, torch.nn.functional.gelu(mlp)], dim=2)


def residual_split_cat(res, gate, y):  # single block output, split into txt/img, cat by the next block
    h = res + gate.unsqueeze(1) * y
    return torch.cat([h[:, :512], h[:, 512:]], dim=1)


def swiglu(x):  # FLUX.2 feed-forward
    a, b = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(a) * b


def wan_residual(x, y, gate):  # Wan: (x.float() + y * gate).type_as(x), gate fp32
    return (x.float() + y * gate).type_as(x)


def gelu_clone(x):  # FF: GELU then Dropout(p=0) = clone
    return torch.nn.functional.gelu(x, approximate="tanh").clone()


# SANA's linear attention (diffusers SanaLinearAttnProcessor2_0), between its linears and matmuls: heads are
# split off a [B, N, heads * dim] linear output by a transpose, so each group reads or writes across the layout
# (tiled kernels), and two of them are lone ops eager runs with its strided loop.
def sana_query_relu(q, heads):  # relu(q).float(), then matmul's reshape copies it contiguous
    return torch.relu(q.transpose(1, 2).unflatten(1, (heads, -1))).float().contiguous()


def sana_key_relu(k, heads):
    return torch.relu(k.transpose(1, 2).unflatten(1, (heads, -1)).transpose(2, 3)).float().contiguous()


def sana_value_float(v, heads):  # v.float() alone (F.pad follows)
    return v.transpose(1, 2).unflatten(1, (heads, -1)).float()


def sana_value_pad(v, heads):  # v.float(), then F.pad with a row of ones (the linear attention's normalizer)
    return torch.nn.functional.pad(v.transpose(1, 2).unflatten(1, (heads, -1)).float(), (0, 0, 0, 1), mode="constant",
                                   value=1.0)


def sana_attn_out(h):  # h: [B, heads, dim + 1, N] fp32 from the second matmul; to_out's reshape copies it
    h = h[:, :, :-1] / (h[:, :, -1:] + 1e-15)
    return h.flatten(1, 2).transpose(1, 2).to(torch.bfloat16).contiguous()


def bias_add(x, bias):  # a linear's bias added alone (at::linear on a non-contiguous input: mm, then add)
    return x + bias


def wan_rope(x, freqs_cos, freqs_sin):  # diffusers' WanAttnProcessor.apply_rotary_emb: halves written into empty_like
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos = freqs_cos[..., 0::2]
    sin = freqs_sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


def qwen_rope(x, freqs_cis):  # diffusers' apply_rotary_emb_qwen(use_real=False): a complex multiply
    x_rotated = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(x_rotated * freqs_cis.unsqueeze(1)).flatten(3).type_as(x)


def qwen_rope_cat(txt, img, txt_freqs, img_freqs):  # Qwen-Image's joint attention: both RoPEs, then cat([txt, img])
    return torch.cat([qwen_rope(txt, txt_freqs), qwen_rope(img, img_freqs)], 1)


def rope_freqs(tokens: int, pairs: int, device="cuda", generator=None, dtype=torch.complex64) -> torch.Tensor:
    """A RoPE table as Qwen-Image builds it: unit complex64 numbers ``polar(1, theta)``, [tokens, pairs];
    ``dtype=torch.complex128`` as Lumina builds it (``polar`` of float64 angles, kept)."""
    theta = torch.rand(tokens, pairs, device=device, generator=generator, dtype=torch.float64) * 4096
    return torch.polar(torch.ones_like(theta), theta).to(dtype)


def lumina_rope(x, freqs_cis):  # Lumina2's RoPE: a complex128 table ([B, S, pairs]) makes the product complex128
    x_rotated = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(x_rotated * freqs_cis.unsqueeze(2)).flatten(3).type_as(x)


def lumina_key_gqa(k, freqs_cis, n_rep: int):  # Lumina2's key: its RoPE, then repeated for grouped-query attention
    k = lumina_rope(k, freqs_cis)
    return k.unsqueeze(3).repeat(1, 1, 1, n_rep, 1).flatten(2, 3)


def rope_into_slice(q, cos, sin):  # ``q[:, :, text:] = rope(q[:, :, text:])``: the image tokens only
    text = q.shape[1] - cos.shape[0]
    q = q.transpose(1, 2).clone()  # [B, S, H, D] from the projection, attended as [B, H, S, D]
    q[:, :, text:] = rope(q[:, :, text:].transpose(1, 2), cos, sin).transpose(1, 2)
    return q


def heads_first(v, heads: int):  # SD3's attention: a [B, S, H*D] projection viewed as [B, H, S, D]
    return v.view(v.shape[0], -1, heads, v.shape[-1] // heads).transpose(1, 2)


def joint_value_cat(v_img, v_txt, heads: int):  # SD3: the projections as [B, H, S, D], cat along S
    return torch.cat([heads_first(v_img, heads), heads_first(v_txt, heads)], dim=2)


def rms_norm_explicit(x, w, eps=1e-6):  # diffusers' RMSNorm (a half-precision weight): the pow → mean → rsqrt chain
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    return (x * torch.rsqrt(variance + eps)).to(w.dtype) * w


def joint_qk_norm(q_img, q_txt, w_img, w_txt, heads: int):  # SD3: both QK norms on [B, H, S, D] views, cat along S
    return torch.cat([rms_norm_explicit(heads_first(q_img, heads), w_img),
                      rms_norm_explicit(heads_first(q_txt, heads), w_txt)], dim=2)


def qwen_qk_norm_rope_cat(txt, img, w_txt, w_img, txt_freqs, img_freqs):  # Qwen-Image: QK norm, RoPE, cat([txt, img])
    return qwen_rope_cat(rms_norm_explicit(txt, w_txt), rms_norm_explicit(img, w_img), txt_freqs, img_freqs)


def split_rope(x, cos, sin):  # LTX-2's split RoPE: x [B, T, H*D], cos/sin [B, H, T, D/2] fp32, halves by addcmul_
    b, h, t, r = cos.shape
    x = x.reshape(b, t, h, -1).swapaxes(1, 2)
    split_x = x.reshape(*x.shape[:-1], 2, r).float()
    cos_u, sin_u = cos.unsqueeze(-2), sin.unsqueeze(-2)
    out = split_x * cos_u
    out[..., :1, :].addcmul_(-sin_u, split_x[..., 1:, :])
    out[..., 1:, :].addcmul_(sin_u, split_x[..., :1, :])
    return out.reshape(*out.shape[:-2], 2 * r).swapaxes(1, 2).reshape(b, t, -1).to(x.dtype)


def tokens_as_image(x, height: int):  # SANA's GLUMBConv input: [B, N, C] tokens as an NCHW view (NHWC memory)
    return x.unflatten(1, (height, x.shape[1] // height)).permute(0, 3, 1, 2)


def conv_silu(h, w, b):  # GLUMBConv: the 1x1 inverted conv (cuDNN, then its bias added), then SiLU
    return torch.nn.functional.silu(torch.nn.functional.conv2d(h, w, b))


def conv_glu(h, w, b):  # GLUMBConv: the depthwise 3x3 conv (bias), chunked in two: x * silu(gate)
    x, gate = torch.chunk(torch.nn.functional.conv2d(h, w, b, padding=1, groups=h.shape[1]), 2, dim=1)
    return x * torch.nn.functional.silu(gate)


CHAINS = ("flux_rope_single", "flux_rope_double", "flux_gated_residual", "flux_gelu_cat", "flux_residual_split_cat",
          "flux_gelu_clone", "swiglu", "wan_fp32_residual", "sana_query_relu", "sana_key_relu", "sana_value_float",
          "sana_attn_out", "sana_bias_add", "sana_conv_silu", "sana_conv_glu", "wan_rope", "sana_value_pad",
          "qwen_rope_cat", "rope_into_slice", "sd35_value_cat", "split_rope", "gelu_erf_cat", "sd35_qk_norm_cat",
          "qwen_qk_norm_rope_cat", "lumina_rope", "lumina_key_gqa")


# Unary ops a bf16 table of eager's outputs can stand for (kernels/lut16.py): the lookup tests and the probe
LUT16_UNARY = {
    "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "gelu_erf": torch.nn.functional.gelu,  # exact as a table only (kernels/pointwise_ops.py lookup_only)
    "silu": torch.nn.functional.silu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "exp": torch.exp,
}


def chain(name: str, device="cuda", seed: int = 0):
    """(fn, args) of one of ``CHAINS`` at FLUX-dev / FLUX.2 / Wan2.2-5B shapes (bf16 activations)."""
    g = torch.Generator(device=device).manual_seed(seed)
    bf16, f32 = torch.bfloat16, torch.float32

    def rn(*s, dtype=bf16):
        return torch.randn(*s, device=device, generator=g).to(dtype)

    freqs = torch.rand(4608, 1, 128, device=device, generator=g) * 3000
    cos, sin = freqs.cos(), freqs.sin()
    return {
        "flux_rope_single": (rope, (rn(1, 4608, 24, 128), cos, sin)),
        "flux_rope_double": (rope_double, (rn(1, 512, 24, 128), rn(1, 4096, 24, 128), cos, sin)),
        "flux_gated_residual": (gated_residual, (rn(1, 4096, 3072), rn(1, 3072), rn(1, 4096, 3072))),
        "flux_gelu_cat": (gelu_cat, (rn(1, 4608, 3072), rn(1, 4608, 12288))),
        "gelu_erf_cat": (gelu_erf_cat, (rn(1, 4608, 3072), rn(1, 4608, 12288))),
        "flux_residual_split_cat": (residual_split_cat, (rn(1, 4608, 3072), rn(1, 3072), rn(1, 4608, 3072))),
        "flux_gelu_clone": (gelu_clone, (rn(1, 4096, 12288),)),
        "swiglu": (swiglu, (rn(1, 4096, 2 * 6144),)),
        # Wan2.2-5B at 704p/121f: 27,280 tokens, 24 heads of 128; fp32 cos/sin per token
        "wan_rope": (wan_rope, (rn(1, 27280, 24, 128), rn(1, 27280, 1, 128, dtype=f32),
                                rn(1, 27280, 1, 128, dtype=f32))),
        "wan_fp32_residual": (wan_residual, (rn(1, 27280, 3072), rn(1, 27280, 3072), rn(1, 1, 3072, dtype=f32))),
        # SANA-1.6B at 1024², batch 2: 1024 tokens, 70 heads of 32
        "sana_query_relu": (functools.partial(sana_query_relu, heads=70), (rn(2, 1024, 2240),)),
        "sana_key_relu": (functools.partial(sana_key_relu, heads=70), (rn(2, 1024, 2240),)),
        "sana_value_float": (functools.partial(sana_value_float, heads=70), (rn(2, 1024, 2240),)),
        "sana_value_pad": (functools.partial(sana_value_pad, heads=70), (rn(2, 1024, 2240),)),
        # Qwen-Image at 1024²: 4096 image tokens, 24 heads of 128, a 256-token prompt; complex64 RoPE tables
        "qwen_rope_cat": (qwen_rope_cat, (rn(1, 256, 24, 128), rn(1, 4096, 24, 128),
                                          rope_freqs(256, 64, device, g), rope_freqs(4096, 64, device, g))),
        # a write into a slice, functionalized as slice + copy + slice_scatter: 256 text and 4096 image tokens
        "rope_into_slice": (rope_into_slice, (rn(1, 4352, 24, 64), cos[:4096, :, :64], sin[:4096, :, :64])),
        # SD3.5-large at 1024², batch 2: the joint attention's value cat, 4096 image and 333 text tokens, 38 heads of 64
        "sd35_value_cat": (functools.partial(joint_value_cat, heads=38), (rn(2, 4096, 2432), rn(2, 333, 2432))),
        # the same shapes' QK norms (diffusers' RMSNorm, its variance summed in the tail's kernel), then the cat
        "sd35_qk_norm_cat": (functools.partial(joint_qk_norm, heads=38), (rn(2, 4096, 2432), rn(2, 333, 2432),
                                                                          rn(64), rn(64))),
        # Qwen-Image's QK norms over its heads of 128, then its RoPE and the cat
        "qwen_qk_norm_rope_cat": (qwen_qk_norm_rope_cat, (rn(1, 256, 24, 128), rn(1, 4096, 24, 128), rn(128), rn(128),
                                                          rope_freqs(256, 64, device, g),
                                                          rope_freqs(4096, 64, device, g))),
        # Lumina-Image-2.0 at 1024²: 4352 tokens, 24 heads of 96, a complex128 RoPE table
        "lumina_rope": (lumina_rope, (rn(1, 4352, 24, 96), rope_freqs(4352, 48, device, g, torch.complex128)[None])),
        # its key: 8 heads of 96, repeated 3 times for the 24 query heads
        "lumina_key_gqa": (functools.partial(lumina_key_gqa, n_rep=3),
                           (rn(1, 4352, 8, 96), rope_freqs(4352, 48, device, g, torch.complex128)[None])),
        # LTX-2's split RoPE at 6144 video tokens, 32 heads of 128: fp32 tables per head and token
        "split_rope": (split_rope, (rn(1, 6144, 4096), rn(1, 32, 6144, 64, dtype=f32), rn(1, 32, 6144, 64, dtype=f32))),
        "sana_attn_out": (sana_attn_out, (rn(2, 70, 33, 1024, dtype=f32),)),
        "sana_bias_add": (bias_add, (rn(2, 1024, 2240), rn(2240))),
        # GLUMBConv (mlp ratio 2.5: 2 x 5600 channels), its convs' biases added in the kernel
        "sana_conv_silu": (conv_silu, (tokens_as_image(rn(2, 1024, 2240), 32), rn(11200, 2240, 1, 1) * 0.02,
                                       rn(11200))),
        "sana_conv_glu": (conv_glu, (tokens_as_image(rn(2, 1024, 11200), 32), rn(11200, 1, 3, 3) * 0.3,
                                     rn(11200))),
    }[name]
