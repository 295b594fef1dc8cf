"""lowering/precompile.py on CUDA: the verifier's dry run finds the kernels its checks launch, the pool compiles them
into Triton's cache, and the first call's output and verdicts are those of a first call without the pool."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

import diffusion_fuse  # noqa: E402
from diffusion_fuse.lowering import precompile  # noqa: E402
from diffusion_fuse.testing.tiny_models import build  # noqa: E402


def _first_call(monkeypatch, tmp_path, workers: int):
    precompile._close_pool()  # workers started under another cache directory
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("DIFFUSION_FUSE_CACHE_DIR", str(tmp_path / "df"))
    monkeypatch.setenv(precompile.WORKERS_ENV, str(workers))
    done, entries = [], []
    wait = precompile.Ahead.wait

    def recorded(self):
        done.append(wait(self))
        entries.append(set(os.listdir(tmp_path / "triton")) if (tmp_path / "triton").exists() else set())
        return done[-1]

    monkeypatch.setattr(precompile.Ahead, "wait", recorded)
    torch._dynamo.reset()
    model, kwargs = build("sana", torch.bfloat16, "cuda")
    report = diffusion_fuse.Report()
    compiled = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend(None, report), fullgraph=True)
    with torch.no_grad():
        ref, out = model(**kwargs)[0], compiled(**kwargs)[0]
    after = set(os.listdir(tmp_path / "triton")) if (tmp_path / "triton").exists() else set()
    precompile._close_pool()
    return ref, out, report, done, entries, after


def test_kernels_compiled_ahead_are_found_by_the_checks(monkeypatch, tmp_path):
    ref, out, report, done, entries, after = _first_call(monkeypatch, tmp_path, 4)
    assert torch.equal(ref.view(torch.int16), out.view(torch.int16))
    assert report.count(status="kept") == len(report.sites()) > 0, report.table()
    (d,) = done
    assert d["jobs"] >= 3 and d["compiled"] == d["jobs"], d
    assert [v["compiled_ahead"] for g in report.graphs for v in g.verifications] == [d]  # in the report too
    assert 0 <= d["collected"] <= d["seconds"] and 0 <= d["waited"] <= d["seconds"], d
    # compiled in this process after the pool: probes (mean_square's order search) and launches the dry run
    # could not foresee; the checks' kernels are found in the cache
    late = after - entries[0]
    names = sorted(f for e in late for f in os.listdir(tmp_path / "triton" / e) if not f.startswith("__grp__"))
    print(f"\ncompiled ahead: {d}; "
          f"compiled at launch afterwards: {len(late)}: {names}")
    assert len(late) < d["jobs"], (d, len(late))


def test_without_the_pool_the_first_call_is_the_same(monkeypatch, tmp_path):
    ref, out, report, done, _, _ = _first_call(monkeypatch, tmp_path, 0)
    assert done == []  # no pool: no dry run
    assert torch.equal(ref.view(torch.int16), out.view(torch.int16))
    assert report.count(status="kept") == len(report.sites()) > 0, report.table()


def test_the_lane_epilogue_is_chosen_after_the_dry_run(monkeypatch, tmp_path):
    """rms_norm's lane epilogue checks its build on first use; in the dry run the build is deferred to the pool, so
    the choice waits for the real call instead of falling back to the row epilogue."""
    from diffusion_fuse.kernels import rms_norm as rk

    precompile._close_pool()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("DIFFUSION_FUSE_CACHE_DIR", str(tmp_path / "df"))
    monkeypatch.setenv(precompile.WORKERS_ENV, "2")
    chosen = []
    choose = rk._LaneOrRows._choose

    def recorded(self, args):
        c = choose(self, args)
        chosen.append(None if c is None else "lane" if c is self.lane else "rows")
        return c

    monkeypatch.setattr(rk._LaneOrRows, "_choose", recorded)
    torch._dynamo.reset()
    norm = torch.nn.RMSNorm(128, eps=1e-6).to("cuda", torch.bfloat16)  # a QK norm over 128-wide heads
    x = torch.randn(2, 512, 8, 128, device="cuda", dtype=torch.bfloat16)
    rejected = len(rk.LANE_EPILOGUE_REJECTED)
    report = diffusion_fuse.Report()
    compiled = torch.compile(norm, backend=diffusion_fuse.DiffusionFuseBackend(None, report), fullgraph=True)
    with torch.no_grad():
        ref, out = norm(x), compiled(x)
    precompile._close_pool()
    assert torch.equal(ref.view(torch.int16), out.view(torch.int16))
    assert report.count(status="kept") == len(report.sites()) > 0, report.table()
    assert rk.LANE_EPILOGUE_REJECTED[rejected:] == []
    assert None in chosen and "lane" in chosen and "rows" not in chosen, chosen  # deferred, then the lanes
