"""benchmarks/clocks_summary.py: nvidia-smi's CSV and the step times line up per step."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "clocks_summary.py"
spec = importlib.util.spec_from_file_location("clocks_summary", SCRIPT)
cs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cs)

CSV = """timestamp, clocks.current.sm [MHz], clocks.current.memory [MHz], power.draw [W], temperature.gpu, clocks_event_reasons.active
2026/11/30 19:00:00.100, 1980 MHz, 3201 MHz, 120.50 W, 40, 0x0000000000000001
2026/11/30 19:00:01.100, 1980 MHz, 3201 MHz, 450.00 W, 50, 0x0000000000000000
2026/11/30 19:00:02.100, 1755 MHz, 3201 MHz, 700.10 W, 61, 0x0000000000000004
2026/11/30 19:00:05.100, 1830 MHz, 3201 MHz, 690.00 W, 63, 0x0000000000000004
Field "clocks_event_reasons.active" is not a valid field
"""
SUMMARY = """test_models_gpu rc=0
demo rc=0 (2 s, 19:00:00-19:00:02)
bench_e2e rc=0 (3 s, 19:00:03-19:00:06)
"""


def test_steps_get_their_own_samples_and_throttle_reasons():
    samples = cs.parse_samples(CSV.splitlines())
    assert len(samples) == 4  # header and the error line skipped
    steps = cs.parse_steps(SUMMARY.splitlines())
    assert [s[0] for s in steps] == ["demo", "bench_e2e"]
    rows = {r[0]: r for r in cs.summarize(samples, steps)}
    # demo: 3 samples, the idle one left out of the clocks; one of the two busy ones at the power cap
    assert rows["demo"][1] == 3 and rows["demo"][3] == "1755" and rows["demo"][7] == "SW power cap 50%"
    assert rows["bench_e2e"][2] == "1830" and rows["bench_e2e"][7] == "SW power cap 100%"


def test_a_step_past_midnight_has_its_duration():
    steps = cs.parse_steps(["x rc=0 (4 s, 23:59:58-00:00:02)"])
    assert steps[0][2] - steps[0][1] == 4


def test_bench_e2e_phases_pool_their_intervals():
    from datetime import datetime

    def epoch(hms: str) -> float:
        h, m, sec = hms.split(":")
        return datetime(2026, 11, 30, int(h), int(m)).timestamp() + float(sec)

    records = [{"model": "flux_stack", "phases": [["lossless back to back", epoch("19:00:01"), epoch("19:00:01.5")],
                                                   ["eager synced", epoch("19:00:02"), epoch("19:00:02.2")],
                                                   ["lossless back to back", epoch("19:00:05"), epoch("19:00:05.2")]]}]
    phases = cs.parse_phases(records)
    assert phases[0][0] == "flux_stack: lossless back to back" and phases[0][1] == 19 * 3600 + 1
    rows = {r[0]: r for r in cs.summarize(cs.parse_samples(CSV.splitlines()), phases, pad=0.0)}
    # the two back-to-back intervals hold the 19:00:01.1 and 19:00:05.1 samples; the synced one the 02.1 sample
    assert rows["flux_stack: lossless back to back"][1] == 2 and rows["flux_stack: eager synced"][1] == 1
    assert rows["flux_stack: eager synced"][7] == "SW power cap 100%"
