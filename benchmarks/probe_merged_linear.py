"""Probe: are linears that read the same input bitwise equal when run as one GEMM over their stacked weights?

For each shape (the q/k/v (+ MLP) projections of FLUX, FLUX.2, Wan, Qwen-Image, SD3.5, SANA at real sizes) this
runs ``F.linear`` per weight, as eager does, and once over ``cat(weights)`` / ``cat(biases)``, and reports:
the number of elements of each slice of the merged output that differ from the separate output (bitwise), the
median time of the separate calls and of the merged call (CUDA events), and the cuBLAS kernels each ran.
Also checks that SDPA gives the same bits when ``v`` is a strided slice of the merged output instead of a
contiguous tensor (FLUX's value path).

    python benchmarks/probe_merged_linear.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F

# name: (batch, tokens, in features, [out features of each linear])
SHAPES = {
    "flux_single_qkv_mlp": (1, 4608, 3072, [3072, 3072, 3072, 12288]),
    "flux_single_qkv": (1, 4608, 3072, [3072, 3072, 3072]),
    "flux_single_qkv_b2": (2, 4608, 3072, [3072, 3072, 3072]),
    "flux_double_img_qkv": (1, 4096, 3072, [3072, 3072, 3072]),
    "flux_double_txt_qkv": (1, 512, 3072, [3072, 3072, 3072]),
    "flux2_double_img_qkv": (1, 4096, 6144, [6144, 6144, 6144]),
    "wan21_14b_self_qkv": (1, 32760, 5120, [5120, 5120, 5120]),
    "wan21_14b_cross_kv": (1, 512, 5120, [5120, 5120]),
    "wan22_5b_self_qkv": (1, 27280, 3072, [3072, 3072, 3072]),
    "qwen_image_img_qkv": (1, 4096, 3072, [3072, 3072, 3072]),
    "sd35_img_qkv": (1, 4096, 2432, [2432, 2432, 2432]),
    "sana_qkv": (2, 1024, 2240, [2240, 2240, 2240]),
}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


def _median_ms(fn, reps: int = 25) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def _kernels(fn) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name[:90] for e in prof.events() if e.device_type.name == "CUDA"]


def probe(name, batch, tokens, k, ns, dtype, bias=True):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(batch, tokens, k, device="cuda", dtype=dtype, generator=g)
    ws = [torch.randn(n, k, device="cuda", dtype=dtype, generator=g) * 0.02 for n in ns]
    bs = [torch.randn(n, device="cuda", dtype=dtype, generator=g) * 0.02 if bias else None for n in ns]
    w = torch.cat(ws)
    b = torch.cat(bs) if bias else None

    def separate():
        return [F.linear(x, wi, bi) for wi, bi in zip(ws, bs)]

    def merged():
        return F.linear(x, w, b)

    ref = separate()
    out = merged()
    diffs, off = [], 0
    for n, r in zip(ns, ref):
        diffs.append(int((_bits(out[..., off:off + n]) != _bits(r)).sum()))
        off += n
    rec = {"name": name, "batch": batch, "tokens": tokens, "k": k, "ns": ns, "dtype": str(dtype), "bias": bias,
           "differing": diffs, "separate_ms": _median_ms(separate), "merged_ms": _median_ms(merged),
           "separate_kernels": _kernels(separate), "merged_kernels": _kernels(merged)}
    rec["speedup"] = rec["separate_ms"] / rec["merged_ms"]
    return rec


def probe_sdpa(dtype):
    """FLUX single block: v as a strided slice of the merged q/k/v/mlp output vs a contiguous v."""
    g = torch.Generator(device="cuda").manual_seed(1)
    s, h, d = 4608, 24, 128
    q = torch.randn(1, h, s, d, device="cuda", dtype=dtype, generator=g)
    kk = torch.randn(1, h, s, d, device="cuda", dtype=dtype, generator=g)
    merged = torch.randn(1, s, 21504, device="cuda", dtype=dtype, generator=g)
    v_strided = merged[..., 6144:9216].view(1, s, h, d).transpose(1, 2)
    v_contig = v_strided.transpose(1, 2).contiguous().transpose(1, 2)
    a = F.scaled_dot_product_attention(q, kk, v_strided)
    c = F.scaled_dot_product_attention(q, kk, v_contig)
    return {"name": "sdpa_v_strided_vs_contiguous", "differing": int((_bits(a) != _bits(c)).sum()),
            "strided_kernels": _kernels(lambda: F.scaled_dot_product_attention(q, kk, v_strided)),
            "contiguous_kernels": _kernels(lambda: F.scaled_dot_product_attention(q, kk, v_contig))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    args = ap.parse_args()
    recs = []
    for name in args.shapes.split(","):
        batch, tokens, k, ns = SHAPES[name]
        for dtype in (torch.bfloat16,):
            rec = probe(name, batch, tokens, k, ns, dtype)
            recs.append(rec)
            print(f"{name:24s} {str(dtype):15s} differing {rec['differing']} separate {rec['separate_ms']:.3f} ms "
                  f"merged {rec['merged_ms']:.3f} ms  x{rec['speedup']:.2f}", flush=True)
            print("   separate:", sorted(set(rec["separate_kernels"])))
            print("   merged:  ", sorted(set(rec["merged_kernels"])))
    rec = probe(*(("flux_single_qkv_fp16",) + SHAPES["flux_single_qkv"]), torch.float16)
    recs.append(rec)
    print(f"flux_single_qkv fp16 differing {rec['differing']} x{rec['speedup']:.2f}")
    rec = probe(*(("flux_single_qkv_nobias",) + SHAPES["flux_single_qkv"]), torch.bfloat16, bias=False)
    recs.append(rec)
    print(f"flux_single_qkv no bias differing {rec['differing']} x{rec['speedup']:.2f}")
    s = probe_sdpa(torch.bfloat16)
    recs.append(s)
    print(s)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "records": recs}, f,
                      indent=1)


if __name__ == "__main__":
    main()
