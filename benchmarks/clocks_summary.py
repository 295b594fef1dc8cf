"""Per benchmark step: the GPU's SM clock, power, temperature and throttle reasons while it ran.

    python benchmarks/clocks_summary.py gpu_clocks.csv summary.txt             # per run_gpu.sh step
    python benchmarks/clocks_summary.py gpu_clocks.csv --phases bench_e2e.json  # per timing phase of bench_e2e.py

``gpu_clocks.csv`` is ``nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,
clocks_throttle_reasons.active --format=csv -lms 100`` (benchmarks/run_gpu.sh starts it); ``summary.txt`` has a
line per step ending ``(<seconds> s, HH:MM:SS-HH:MM:SS)``; bench_e2e.py's JSON has ``phases`` per model: [name,
start, end] in seconds since the epoch (the machine's local time, as nvidia-smi stamps its samples). Lines that do not parse (the header, a driver that
does not know a field) are skipped. Read-only: nothing here sets a clock.
"""

from __future__ import annotations

import re
import statistics
import sys
from datetime import datetime

from tabulate import tabulate

# nvidia-smi's clocks_throttle_reasons bits (nvml.h, nvmlClocksEventReasons)
REASONS = {0x1: "idle", 0x2: "app clocks", 0x4: "SW power cap", 0x8: "HW slowdown", 0x10: "sync boost",
           0x20: "SW thermal", 0x40: "HW thermal", 0x80: "HW power brake", 0x100: "display clocks"}
STEP = re.compile(r"^(\S+) rc=(\d+) \((\d+) s, (\d\d:\d\d:\d\d)-(\d\d:\d\d:\d\d)\)")


def _number(field: str) -> float:
    return float(field.strip().split()[0])


def parse_samples(lines) -> list[dict]:
    """(time of day in s, sm MHz, mem MHz, W, °C, reason bits) per parsable CSV line."""
    out = []
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 6:
            continue
        try:
            t = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f")
            out.append({"t": t.hour * 3600 + t.minute * 60 + t.second + t.microsecond / 1e6,
                        "sm": _number(parts[1]), "mem": _number(parts[2]), "power": _number(parts[3]),
                        "temp": _number(parts[4]), "reasons": int(parts[5], 16)})
        except ValueError:
            continue
    return out


def parse_steps(lines) -> list[tuple[str, float, float]]:
    """(step, start, end) in seconds of the day, from summary.txt's step lines (whole seconds: ``summarize``
    pads each end by one)."""
    def secs(hms: str) -> float:
        h, m, s = (int(v) for v in hms.split(":"))
        return h * 3600 + m * 60 + s

    steps = []
    for line in lines:
        m = STEP.match(line.strip())
        if m:
            start, end = secs(m.group(4)), secs(m.group(5))
            steps.append((m.group(1), start, end if end >= start else end + 86400))
    return steps


def parse_phases(records: list[dict]) -> list[tuple[str, float, float]]:
    """(model: phase, start, end) in seconds of the day, from bench_e2e.py's records."""
    def day(t: float) -> float:
        d = datetime.fromtimestamp(t)
        return d.hour * 3600 + d.minute * 60 + d.second + d.microsecond / 1e6

    return [(f"{rec['model']}: {name}", day(t0), day(t1)) for rec in records for name, t0, t1 in rec.get("phases", [])]


def summarize(samples: list[dict], steps, pad: float = 1.0) -> list[list]:
    """One row per step name (its intervals pooled, in first-seen order); ``pad`` seconds added to each end."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for name, start, end in steps:
        spans.setdefault(name, []).append((start, end))
    rows = []
    for name, ivs in spans.items():
        sel = [s for s in samples if any(a <= s["t"] <= b + pad for a, b in ivs)]
        if not sel:
            continue
        busy = [s for s in sel if not s["reasons"] & 0x1] or sel  # idle samples say nothing about load clocks
        reasons = {}
        for s in busy:
            for bit, label in REASONS.items():
                if s["reasons"] & bit and bit != 0x1:
                    reasons[label] = reasons.get(label, 0) + 1
        rows.append([name, len(sel), f"{statistics.median(s['sm'] for s in busy):.0f}",
                     f"{min(s['sm'] for s in busy):.0f}", f"{statistics.median(s['power'] for s in busy):.0f}",
                     f"{max(s['power'] for s in busy):.0f}", f"{max(s['temp'] for s in sel):.0f}",
                     ", ".join(f"{k} {100 * v / len(busy):.0f}%" for k, v in sorted(reasons.items())) or "-"])
    return rows


def main(argv: list[str]) -> None:
    with open(argv[0]) as f:
        samples = parse_samples(f)
    if argv[1] == "--phases":
        import json

        with open(argv[2]) as f:
            steps, pad, what = parse_phases(json.load(f)["records"]), 0.0, "timing phase"
    else:
        with open(argv[1]) as f:
            steps, pad, what = parse_steps(f), 1.0, "step"
    rows = summarize(samples, steps, pad)
    print(f"GPU clocks per {what} ({len(samples)} samples; medians and extremes over the non-idle ones)")
    print(tabulate(rows, headers=["step", "samples", "SM MHz median", "SM MHz min", "W median", "W max", "°C max",
                                  "throttle reasons (share of samples)"]))


if __name__ == "__main__":
    main(sys.argv[1:])
