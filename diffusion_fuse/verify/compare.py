"""Equality that is right for floats: bitwise, on integer views; and the layout a caller can observe.

Identical NaN/Inf bit patterns compare equal; -0.0 and +0.0 differ. A mismatch is
described by its first differing element (flat index, multi-index, both values).
``layout_difference`` says how a tensor's dtype, shape, device, strides (of the dimensions that address more than
one element) or the alignment its storage offset gives it differ from the reference's.
"""

from __future__ import annotations

import dataclasses

import torch

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclasses.dataclass
class Verdict:
    equal: bool
    detail: str = ""
    max_abs_err: float | None = None
    # The first differing element of a bitwise mismatch, as plain data (None otherwise):
    # {"output": i or None, "index": [..], "expected": v, "got": v, "count": n, "numel": N}
    first_diff: dict | None = None

    def __bool__(self) -> bool:
        return self.equal


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous()
    if t.dtype == torch.bool:
        return t.view(torch.uint8)
    if t.is_complex():
        t = torch.view_as_real(t).contiguous()
    return t.view(_INT_VIEW[t.element_size()])


def first_difference_info(ref: torch.Tensor, got: torch.Tensor) -> dict | None:
    """The first bitwise-differing element of two same-shape tensors as plain data, or None."""
    diff = (_bits(ref) != _bits(got)).flatten()
    idx = int(diff.nonzero()[0, 0]) if diff.any() else -1
    if idx < 0:
        return None
    multi = [int(i) for i in torch.unravel_index(torch.tensor(idx), ref.shape)] if ref.dim() else []
    r, g = ref.flatten()[idx].item(), got.flatten()[idx].item()
    return {"output": None, "index": multi, "expected": r, "got": g, "count": int(diff.sum()), "numel": ref.numel()}


def describe_difference(info: dict) -> str:
    return (f"{info['count']}/{info['numel']} elements differ; first at {info['index']}: "
            f"expected {info['expected']!r}, got {info['got']!r}")


def first_difference(ref: torch.Tensor, got: torch.Tensor) -> str:
    info = first_difference_info(ref, got)
    return "" if info is None else describe_difference(info)


ALIGNMENT = 16  # bytes: the data pointer alignment compiled kernels specialise on


def _aligned(t: torch.Tensor) -> bool:
    return t.storage_offset() * t.element_size() % ALIGNMENT == 0


def layout_difference(ref: torch.Tensor, got: torch.Tensor, offset: bool = False) -> str:
    """How ``got``'s layout differs from ``ref``'s, or ''.

    Dtype, shape and device always; strides of the dimensions of size > 1 (a size-1 dimension's stride addresses
    nothing, and torch itself leaves it unspecified); with ``offset`` (what the caller receives), the storage offset
    where it changes what a consumer sees: a data pointer 16-byte aligned in the reference must stay so (Inductor and
    Triton kernels specialise on it, as ``torch._inductor.utils.tensor_is_aligned``). An offset that keeps the
    alignment (an output written into a shared buffer, as ``grouped_gemv`` and ``linear_cat`` do) is no difference
    a consumer sees. An empty tensor has no strides or offset to observe.
    """
    if ref.dtype != got.dtype or ref.shape != got.shape:
        return f"dtype and shape {got.dtype}{list(got.shape)} where the reference has {ref.dtype}{list(ref.shape)}"
    if ref.device != got.device:
        return f"device {got.device} where the reference has {ref.device}"
    if ref.numel() == 0:
        return ""
    if any(n > 1 and a != b for n, a, b in zip(ref.shape, ref.stride(), got.stride())):
        return f"strides {tuple(got.stride())} where the reference has {tuple(ref.stride())}"
    if offset and _aligned(ref) and not _aligned(got):
        return (f"storage offset {got.storage_offset()} (data pointer not {ALIGNMENT}-byte aligned) where the "
                f"reference has {ref.storage_offset()}")
    return ""


def compare_layout(ref: object, got: object, offset: bool = False) -> Verdict:
    """``layout_difference`` over tensors or (nested) lists of them; other values are not its business."""
    if isinstance(ref, torch.Tensor) and isinstance(got, torch.Tensor):
        why = layout_difference(ref, got, offset)
        return Verdict(not why, why)
    if isinstance(ref, (list, tuple)) and isinstance(got, (list, tuple)):
        for i, (r, g) in enumerate(zip(ref, got)):
            v = compare_layout(r, g, offset)
            if not v:
                return Verdict(False, f"output {i}: {v.detail}")
    return Verdict(True)


def compare_bitwise(ref: object, got: object) -> Verdict:
    if isinstance(ref, torch.Tensor) or isinstance(got, torch.Tensor):
        if not (isinstance(ref, torch.Tensor) and isinstance(got, torch.Tensor)):
            return Verdict(False, f"expected {type(ref).__name__}, got {type(got).__name__}")
        if ref.dtype != got.dtype or ref.shape != got.shape:
            return Verdict(False, f"expected {ref.dtype}{list(ref.shape)}, got {got.dtype}{list(got.shape)}")
        if ref.device != got.device:
            got = got.to(ref.device)
        if torch.equal(_bits(ref), _bits(got)):
            return Verdict(True)
        info = first_difference_info(ref, got)
        return Verdict(False, describe_difference(info), first_diff=info)
    if isinstance(ref, (list, tuple)) and isinstance(got, (list, tuple)):
        if len(ref) != len(got):
            return Verdict(False, f"expected {len(ref)} values, got {len(got)}")
        for i, (r, g) in enumerate(zip(ref, got)):
            v = compare_bitwise(r, g)
            if not v:
                info = None if v.first_diff is None else {**v.first_diff, "output": i}
                return Verdict(False, f"output {i}: {v.detail}", first_diff=info)
        return Verdict(True)
    return Verdict(ref == got, "" if ref == got else f"expected {ref!r}, got {got!r}")


def compare_close(ref: torch.Tensor, got: torch.Tensor, rtol: float, atol: float) -> Verdict:
    """Tolerance check for non-exact (tier "high") values.

    Passes when the relative L2 error ``||got - ref|| / ||ref||`` is at most ``rtol`` or the
    largest absolute error is at most ``atol``; NaN/Inf must sit where the reference has them.
    """
    if ref.dtype != got.dtype or ref.shape != got.shape:
        return Verdict(False, f"expected {ref.dtype}{list(ref.shape)}, got {got.dtype}{list(got.shape)}")
    r, g = ref.double(), got.double().to(ref.device)
    finite_r, finite_g = torch.isfinite(r), torch.isfinite(g)
    if not torch.equal(finite_r, finite_g) or not torch.equal(r[~finite_r].nan_to_num(0.0, 1.0, -1.0),
                                                                g[~finite_g].nan_to_num(0.0, 1.0, -1.0)):
        return Verdict(False, "NaN/Inf in different places")
    err = (r - g)[finite_r]
    max_err = float(err.abs().max()) if err.numel() else 0.0
    denom = float(r[finite_r].norm()) or 1.0
    rel = float(err.norm()) / denom
    ok = rel <= rtol or max_err <= atol
    detail = f"rel L2 err {rel:.3g}, max |err| {max_err:.3g}"
    return Verdict(ok, detail if not ok else "", max_err)
