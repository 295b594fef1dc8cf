"""Helpers for tests, examples and benchmarks: tiny random-weight diffusers models (``tiny_models``), the diffusers
zoo the census runs (``zoo``), DiTs in plain PyTorch (``plain_dit``, ``user_dits``), an FP8 static linear (``fp8``),
the pointwise pass on small functions (``pointwise``) and processes running a transformer under diffusers' context
parallelism (``context_parallel``)."""
