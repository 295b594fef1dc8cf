"""Per benchmark step: the GPU's SM clock, power, temperature and throttle reasons while it ran.

    python benchmarks/clocks_summary.py gpu_clocks.csv summary.txt

``gpu_clocks.csv`` is ``nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,
clocks_throttle_reasons.active --format=csv -lms 200`` (benchmarks/run_gpu.sh starts it); ``summary.txt`` has a
line per step ending ``(<seconds> s, HH:MM:SS-HH:MM:SS)``. Lines that do not parse (the header, a driver that
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
    """(step, start, end) in seconds of the day, from summary.txt's step lines."""
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


def summarize(samples: list[dict], steps) -> list[list]:
    rows = []
    for name, start, end in steps:
        sel = [s for s in samples if start <= s["t"] <= end + 1]
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


def main(csv_path: str, summary_path: str) -> None:
    with open(csv_path) as f:
        samples = parse_samples(f)
    with open(summary_path) as f:
        steps = parse_steps(f)
    rows = summarize(samples, steps)
    print(f"GPU clocks per step ({len(samples)} samples every 200 ms; medians and extremes over the non-idle ones)")
    print(tabulate(rows, headers=["step", "samples", "SM MHz median", "SM MHz min", "W median", "W max", "°C max",
                                  "throttle reasons (share of samples)"]))


if __name__ == "__main__":
    main(*sys.argv[1:3])
