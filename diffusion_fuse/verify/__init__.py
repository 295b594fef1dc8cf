"""Judging every rewrite: bitwise comparison, the verifier, the report."""

from .compare import Verdict, compare_bitwise, compare_close  # noqa: F401
from .report import Report, default_report  # noqa: F401
from .verifier import VerifiedGraph  # noqa: F401
