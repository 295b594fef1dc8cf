"""Helpers for tests, examples and benchmarks: tiny random-weight diffusers models."""
