"""Sweep report: a multirun folder turned into report.md, a printed table and PNG charts."""

from rlplace.report.collect import JobResult, collect
from rlplace.report.write import write_report

__all__ = ["JobResult", "collect", "write_report"]
