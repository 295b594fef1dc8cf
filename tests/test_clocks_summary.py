"""benchmarks/clocks_summary.py: nvidia-smi's CSV and the step / phase times line up."""

import importlib.util
from datetime import datetime
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "clocks_summary.py"
spec = importlib.util.spec_from_file_location("clocks_summary", SCRIPT)
cs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cs)

CSV = """timestamp, utilization.gpu [%], clocks.current.sm [MHz], clocks.current.memory [MHz], power.draw.instant [W], temperature.gpu, clocks_event_reasons.active
2026/11/30 19:00:00.100, 0 %, 1980 MHz, 3201 MHz, 120.50 W, 40, 0x0000000000000001
2026/11/30 19:00:01.100, 10 %, 1980 MHz, 3201 MHz, 150.00 W, 50, 0x0000000000000000
2026/11/30 19:00:02.100, 100 %, 1755 MHz, 3201 MHz, 700.10 W, 61, 0x0000000000000004
2026/11/30 19:00:05.100, 95 %, 1830 MHz, 3201 MHz, 690.00 W, 63, 0x0000000000000004
2026/11/30 19:00:05.200, 95 %, 1830 MHz, 3201 MHz
2026/12/01 00:00:00.500, 100 %, 1600 MHz, 3201 MHz, 699.00 W, 60, 0x0000000000000004
"""


def epoch(date: str, hms: str) -> float:
    h, m, s = hms.split(":")
    return datetime.strptime(date, "%Y/%m/%d").replace(hour=int(h), minute=int(m)).timestamp() + float(s)


def test_steps_count_their_busy_samples_only():
    samples = cs.parse_samples(CSV.splitlines())
    assert len(samples) == 5  # the header and the short line skipped
    e = int(epoch("2026/11/30", "19:00:03"))
    steps = cs.parse_steps(["demo rc=0 (2 s, 19:00:00-19:00:02)",  # an older line: no epochs, day of the log
                            f"bench_e2e rc=0 (3 s, 19:00:03-19:00:06, {e}-{e + 3})"], samples[0]["t"])
    rows = {r[0]: r for r in cs.summarize(samples, steps)}
    # demo: 3 samples in its seconds, one busy (the idle and the 10% one say nothing about clocks under load)
    assert rows["demo"][1:4] == [3, 1, "1755"] and rows["demo"][8] == "SW power cap 100%"
    assert rows["bench_e2e"][1:4] == [1, 1, "1830"]


def test_a_step_past_midnight_keeps_its_samples():
    samples = cs.parse_samples(CSV.splitlines())
    steps = cs.parse_steps(["late rc=0 (4 s, 23:59:58-00:00:02)"], samples[0]["t"])
    assert steps[0][2] - steps[0][1] == 5  # padded to the end second
    # the step's start is read on the log's first day (not 24 h before it)
    assert steps[0][1] == epoch("2026/11/30", "23:59:58")
    rows = cs.summarize(samples, steps)
    assert rows[0][1:4] == [1, 1, "1600"]


def test_bench_e2e_phases_pool_their_intervals():
    records = [{"model": "flux_stack", "phases": [
        ["lossless back to back", epoch("2026/11/30", "19:00:01"), epoch("2026/11/30", "19:00:02.5")],
        ["eager synced", epoch("2026/11/30", "19:00:04"), epoch("2026/11/30", "19:00:04.5")],
        ["lossless back to back", epoch("2026/11/30", "19:00:05"), epoch("2026/11/30", "19:00:05.2")]]}]
    rows = {r[0]: r for r in cs.summarize(cs.parse_samples(CSV.splitlines()), cs.parse_phases(records))}
    # the two back-to-back intervals hold 01.1 (10%: not busy), 02.1 and 05.1; the synced one nothing
    assert rows["flux_stack: lossless back to back"][1:4] == [3, 2, "1792"]
    assert rows["flux_stack: eager synced"][1:3] == [0, 0]


def test_main_reads_bench_models_json_too(tmp_path, capsys):
    import json

    (tmp_path / "clocks.csv").write_text(CSV)
    (tmp_path / "bench_models.json").write_text(json.dumps({"meta": {}, "models": [{"model": "flux1", "phases": [
        ["lossless one forward", epoch("2026/11/30", "19:00:02"), epoch("2026/11/30", "19:00:02.2")]]}]}))
    cs.main([str(tmp_path / "clocks.csv"), "--phases", str(tmp_path / "bench_models.json")])
    out = capsys.readouterr().out
    assert "flux1: lossless one forward" in out and "SW power cap 100%" in out
