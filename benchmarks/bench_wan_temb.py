"""Wan2.2-5B block at 704p/121f (27,280 tokens, per-token timesteps): what the timestep table costs.

One run, eager vs Inductor vs diffusion_fuse lossless, random weights, bf16 (fp32 modules kept as
from_pretrained keeps them), CUDA-event medians after warm-up:

- ``block``: the real ``WanTransformerBlock`` (diffusers 0.42.1) called with hidden_states [1, 27280, 3072],
  encoder_hidden_states [1, 512, 3072], the per-token temb [1, 27280, 6, 3072] and the rotary embedding:
  time, extra peak memory, and whether the output is bitwise equal to eager.
- the modulation work, measured on the block's modulation skeleton (its forward with attn1, attn2 and
  the FFN replaced by the identity, so what remains is the six chunks and their consumers: norm1 +
  modulate, the gated attention residual, norm2, norm3 + modulate, the gated FFN residual), twice:
  ``skeleton_temb`` computes ``(table.unsqueeze(0) + temb.float()).chunk(6, dim=2)`` as the block does;
  ``skeleton_slices`` takes the six [1, 27280, 3072] fp32 slices as inputs, already computed.
  modulation work = skeleton_temb - skeleton_slices, in time and in extra peak memory (the peak during
  the call above what was allocated before it): what the chunked table adds to the consumers' work.

Prints a table; writes JSON (--json, default $OUT/bench_wan_temb.json).

    python benchmarks/bench_wan_temb.py [--reps 20] [--skip-inductor]
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings

import torch
from bench_e2e import bits, timed  # benchmarks/ is the script's folder
from tabulate import tabulate

import diffusion_fuse
from diffusion_fuse.testing.tiny_models import cast_like_from_pretrained

warnings.filterwarnings("ignore")
F, H, W = 31, 44, 80  # latent frames/height/width of 704x1280, 121 frames (Wan2.2 VAE: 4x temporal, 16x spatial)
S = F * (H // 2) * (W // 2)  # 27,280 tokens after the (1, 2, 2) patch embedding
D = 3072


def wan22_5b(device="cuda"):
    from diffusers import WanTransformer3DModel

    with torch.device(device):
        m = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=24, attention_head_dim=128,
                                  in_channels=48, out_channels=48, text_dim=4096, freq_dim=256, ffn_dim=14336,
                                  num_layers=1, cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6,
                                  rope_max_seq_len=1024)
    return cast_like_from_pretrained(m.eval(), torch.bfloat16)


class Identity(torch.nn.Module):
    def forward(self, h, *args):
        return h


class Skeleton(torch.nn.Module):
    """WanTransformerBlock.forward (diffusers 0.42.1, lines 463-502) with attn1, attn2, ffn the identity.

    ``slices=True``: the six modulation slices are inputs instead of being chunked from the table.
    """

    def __init__(self, block, slices: bool) -> None:
        super().__init__()
        self.norm1, self.norm2, self.norm3 = block.norm1, block.norm2, block.norm3
        self.scale_shift_table = block.scale_shift_table
        self.attn1 = self.attn2 = self.ffn = Identity()
        self.slices = slices

    def forward(self, hidden_states, encoder_hidden_states, temb):
        if self.slices:
            shift_msa, scale_msa, gate_msa, c_shift_msa, c_scale_msa, c_gate_msa = temb
        else:
            shift_msa, scale_msa, gate_msa, c_shift_msa, c_scale_msa, c_gate_msa = (
                self.scale_shift_table.unsqueeze(0) + temb.float()
            ).chunk(6, dim=2)
            shift_msa, scale_msa, gate_msa = shift_msa.squeeze(2), scale_msa.squeeze(2), gate_msa.squeeze(2)
            c_shift_msa, c_scale_msa, c_gate_msa = c_shift_msa.squeeze(2), c_scale_msa.squeeze(2), c_gate_msa.squeeze(2)
        norm_hidden_states = (self.norm1(hidden_states.float()) * (1 + scale_msa) + shift_msa).type_as(hidden_states)
        attn_output = self.attn1(norm_hidden_states)
        hidden_states = (hidden_states.float() + attn_output * gate_msa).type_as(hidden_states)
        norm_hidden_states = self.norm2(hidden_states.float()).type_as(hidden_states)
        attn_output = self.attn2(norm_hidden_states, encoder_hidden_states)
        hidden_states = hidden_states + attn_output
        norm_hidden_states = (self.norm3(hidden_states.float()) * (1 + c_scale_msa) + c_shift_msa).type_as(
            hidden_states
        )
        ff_output = self.ffn(norm_hidden_states)
        return (hidden_states.float() + ff_output.float() * c_gate_msa).type_as(hidden_states)


def extra_peak_gib(fn) -> float:
    """Peak memory during one call above what was allocated before it (GiB)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak / 2**30


def measure(name, module, args, reps, skip_inductor, reports) -> dict:
    """{backend: {ms, peak_GiB, equal, first_call_s}} for eager / inductor / lossless on ``module(*args)``."""
    torch._dynamo.reset()
    report = diffusion_fuse.Report()
    variants = {"eager": module,
                "lossless": torch.compile(module, backend=diffusion_fuse.DiffusionFuseBackend(None, report))}
    if not skip_inductor:
        variants["inductor"] = torch.compile(module)
    rec, ref = {}, None
    with torch.no_grad():
        for k, fn in variants.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = fn(*args)
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            ref = out if k == "eager" else ref
            equal = torch.equal(bits(ref), bits(out))
            del out
            fn(*args)  # warm-up
            rec[k] = {"ms": timed(lambda: fn(*args), reps)[0], "peak_GiB": extra_peak_gib(lambda: fn(*args)),
                      "equal": equal, "first_call_s": first}
        # a second round of eager and ours, interleaved, to show the spread
        rec["eager"]["ms_2"] = timed(lambda: module(*args), reps)[0]
        lossless = variants["lossless"]
        rec["lossless"]["ms_2"] = timed(lambda: lossless(*args), reps)[0]
    reports[name] = {"table": report.table(), "counters": report.counters(),
                     "sites": [(s.id, s.status) for s in report.sites()]}
    return rec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--skip-inductor", action="store_true")
    ap.add_argument("--skip-block", action="store_true", help="only the modulation skeletons")
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "bench_wan_temb.json"))
    args = ap.parse_args()

    model = wan22_5b()
    block = model.blocks[0]
    g = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(1, S, D, device="cuda", generator=g).bfloat16()
    enc = torch.randn(1, 512, D, device="cuda", generator=g).bfloat16()
    temb = torch.randn(1, S, 6, D, device="cuda", generator=g).bfloat16()
    with torch.no_grad():
        latents = torch.randn(1, 48, F, H, W, device="cuda", generator=g).bfloat16()
        rope = model.rope(latents)
        slices = tuple(s.squeeze(2).contiguous()
                       for s in (block.scale_shift_table.unsqueeze(0) + temb.float()).chunk(6, dim=2))
        del latents

    results, reports = {}, {}
    skel_temb, skel_slices = Skeleton(block, slices=False), Skeleton(block, slices=True)
    with torch.no_grad():  # the two skeletons are the same computation
        assert torch.equal(bits(skel_temb(hidden, enc, temb)), bits(skel_slices(hidden, enc, slices)))
    results["skeleton_temb"] = measure("skeleton_temb", skel_temb, (hidden, enc, temb), args.reps,
                                       args.skip_inductor, reports)
    torch.cuda.empty_cache()
    results["skeleton_slices"] = measure("skeleton_slices", skel_slices, (hidden, enc, slices), args.reps,
                                         args.skip_inductor, reports)
    del slices
    torch.cuda.empty_cache()
    if not args.skip_block:
        results["block"] = measure("block", block, (hidden, enc, temb, rope), args.reps, args.skip_inductor,
                                   reports)

    backends = [b for b in ("eager", "inductor", "lossless") if b in results["skeleton_temb"]]
    mod = {b: {"ms": results["skeleton_temb"][b]["ms"] - results["skeleton_slices"][b]["ms"],
               "peak_GiB": results["skeleton_temb"][b]["peak_GiB"] - results["skeleton_slices"][b]["peak_GiB"]}
           for b in backends}
    rows = []
    for name, rec in results.items():
        for b in backends:
            r = rec[b]
            rows.append([name, b, f"{r['ms']:.3f}" + (f" / {r['ms_2']:.3f}" if "ms_2" in r else ""),
                         f"{r['peak_GiB']:.2f}", r["equal"], f"{r['first_call_s']:.1f}"])
    for b in backends:
        rows.append(["modulation work (temb - slices)", b, f"{mod[b]['ms']:.3f}", f"{mod[b]['peak_GiB']:.2f}", "", ""])
    for name, rep in reports.items():
        print(f"== {name}\n{rep['table']}")
    print(tabulate(rows, headers=["workload", "backend", "ms (median; 2nd round)", "extra peak GiB",
                                  "equal to eager", "1st call s"]))
    with open(args.json, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "tokens": S, "D": D,
                   "results": results, "modulation_work": mod, "reports": reports}, f, indent=2, default=str)


if __name__ == "__main__":
    main()
