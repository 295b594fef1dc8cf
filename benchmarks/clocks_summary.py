"""Per benchmark step (or bench_e2e timing phase): the GPU's SM clock, power, temperature and throttle reasons.

    python benchmarks/clocks_summary.py gpu_clocks.csv summary.txt             # per run_gpu.sh step
    python benchmarks/clocks_summary.py gpu_clocks.csv --phases bench_e2e.json  # per timing phase of bench_e2e.py
    python benchmarks/clocks_summary.py gpu_clocks.csv --phases bench_models.json  # per variant and timing kind

``gpu_clocks.csv`` is nvidia-smi's ``--query-gpu=timestamp,utilization.gpu,clocks.sm,clocks.mem,power.draw.instant,
temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 100`` for one GPU (benchmarks/run_gpu.sh starts it;
``power.draw`` where the driver has no instant reading, which averages over about a second). Columns are found by
the header's names. ``summary.txt`` has a line per step ending ``(<s> s, HH:MM:SS-HH:MM:SS, <epoch>-<epoch>)``;
bench_e2e.py's JSON (``records``) and bench_models.py's (``models``) have ``phases`` per model: [name, start, end] in
seconds since the epoch. Only samples with the GPU
busy (utilization >= 50%) count towards the clocks and power: a step's compile time would otherwise dominate.
Lines that do not parse are skipped. Read-only: nothing here sets a clock.
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
COLUMNS = {"timestamp": "t", "utilization.gpu": "util", "clocks.current.sm": "sm", "clocks.sm": "sm",
           "clocks.current.memory": "mem", "clocks.mem": "mem", "power.draw": "power", "power.draw.instant": "power",
           "temperature.gpu": "temp", "clocks_event_reasons.active": "reasons",
           "clocks_throttle_reasons.active": "reasons"}
STEP = re.compile(r"^(\S+) rc=(\d+) \((\d+) s, (\d\d:\d\d:\d\d)-(\d\d:\d\d:\d\d)(?:, (\d+)-(\d+))?\)")
BUSY_UTIL = 50.0


def _number(field: str) -> float:
    return float(field.strip().split()[0])


def parse_samples(lines) -> list[dict]:
    """One dict per parsable CSV line (t: seconds since the epoch, local time as nvidia-smi stamps it)."""
    names: list[str | None] = []
    out = []
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if parts and parts[0] == "timestamp":  # the header: column order
            names = [COLUMNS.get(p.split(" [")[0].strip()) for p in parts]
            continue
        if not names or len(parts) != len(names):
            continue
        try:
            row = {}
            for key, field in zip(names, parts):
                if key == "t":
                    row["t"] = datetime.strptime(field, "%Y/%m/%d %H:%M:%S.%f").timestamp()
                elif key == "reasons":
                    row["reasons"] = int(field, 16)
                elif key is not None:
                    row[key] = _number(field)
            if {"t", "sm", "power", "reasons"} <= row.keys():
                out.append(row)
        except ValueError:
            continue
    return out


def parse_steps(lines, first_sample: float | None = None) -> list[tuple[str, float, float]]:
    """(step, start, end) in seconds since the epoch from summary.txt's step lines: their epoch pair, or (older
    lines) their HH:MM:SS on the day of ``first_sample``, padded to whole seconds."""
    steps = []
    for line in lines:
        m = STEP.match(line.strip())
        if not m:
            continue
        if m.group(6):
            steps.append((m.group(1), float(m.group(6)), float(m.group(7)) + 1))
        elif first_sample is not None:
            day = datetime.fromtimestamp(first_sample).replace(hour=0, minute=0, second=0, microsecond=0)

            def at(hms: str) -> float:
                h, mi, s = (int(v) for v in hms.split(":"))
                t = day.replace(hour=h, minute=mi, second=s).timestamp()
                return t + 86400 if t < first_sample - 43200 else t  # past midnight

            start, end = at(m.group(4)), at(m.group(5))
            steps.append((m.group(1), start, (end if end >= start else end + 86400) + 1))
    return steps


def parse_phases(records: list[dict]) -> list[tuple[str, float, float]]:
    """(model: phase, start, end) in seconds since the epoch, from bench_e2e.py's or bench_models.py's records."""
    return [(f"{rec['model']}: {name}", t0, t1) for rec in records for name, t0, t1 in rec.get("phases", [])]


def _busy(s: dict) -> bool:
    return s["util"] >= BUSY_UTIL if "util" in s else not s["reasons"] & 0x1


def summarize(samples: list[dict], steps) -> list[list]:
    """One row per step name (its intervals pooled, in first-seen order), over its busy samples."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for name, start, end in steps:
        spans.setdefault(name, []).append((start, end))
    rows = []
    for name, ivs in spans.items():
        sel = [s for s in samples if any(a <= s["t"] <= b for a, b in ivs)]
        busy = [s for s in sel if _busy(s)]
        if not busy:
            rows.append([name, len(sel), 0, "-", "-", "-", "-", "-", "-"])
            continue
        reasons = {}
        for s in busy:
            for bit, label in REASONS.items():
                if s["reasons"] & bit and bit != 0x1:
                    reasons[label] = reasons.get(label, 0) + 1
        sm = [s["sm"] for s in busy]
        rows.append([name, len(sel), len(busy), f"{statistics.median(sm):.0f}", f"{min(sm):.0f}-{max(sm):.0f}",
                     f"{statistics.median(s['power'] for s in busy):.0f}", f"{max(s['power'] for s in busy):.0f}",
                     f"{max(s['temp'] for s in sel):.0f}" if all("temp" in s for s in sel) else "-",
                     ", ".join(f"{k} {100 * v / len(busy):.0f}%" for k, v in sorted(reasons.items())) or "-"])
    return rows


def main(argv: list[str]) -> None:
    with open(argv[0]) as f:
        samples = parse_samples(f)
    if argv[1] == "--phases":
        import json

        with open(argv[2]) as f:
            data = json.load(f)
            steps, what = parse_phases(data.get("records") or data.get("models") or []), "timing phase"
    else:
        with open(argv[1]) as f:
            steps, what = parse_steps(f, samples[0]["t"] if samples else None), "step"
    print(f"GPU clocks per {what} ({len(samples)} samples; clocks and power over the busy ones, utilization >= "
          f"{BUSY_UTIL:.0f}%)")
    print(tabulate(summarize(samples, steps),
                   headers=["step", "samples", "busy", "SM MHz median", "SM MHz range", "W median", "W max", "°C max",
                            "throttle reasons (share of busy samples)"]))


if __name__ == "__main__":
    main(sys.argv[1:])
