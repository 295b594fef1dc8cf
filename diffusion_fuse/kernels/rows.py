"""Rows of a tensor as the norm kernels walk them: leading dims merged where every tensor steps through them evenly."""

from __future__ import annotations


def row_layout(shape, *strides) -> tuple[tuple[int, int, int], list[tuple[int, int, int]]] | None:
    """The rows of ``shape`` (its leading dims) as at most 3 dims with one stride each per tensor.

    ``strides``: each tensor's strides, expanded to ``shape``. Adjacent leading dims merge when
    every tensor steps through them evenly; size-1 dims drop. None if more than 3 remain.
    """
    dims = [i for i in range(len(shape) - 1) if shape[i] != 1]
    sizes = [shape[i] for i in dims]
    per = [[st[i] for i in dims] for st in strides]
    j = 0
    while j < len(sizes) - 1:
        if all(st[j] == st[j + 1] * sizes[j + 1] for st in per):
            sizes[j:j + 2] = [sizes[j] * sizes[j + 1]]
            for st in per:
                st[j:j + 2] = [st[j + 1]]
        else:
            j += 1
    if len(sizes) > 3:
        return None
    pad = 3 - len(sizes)
    return tuple([1] * pad + sizes), [tuple([0] * pad + st) for st in per]
