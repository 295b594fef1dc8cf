"""Triton kernels and their launchers; each module states its numerics contract."""
