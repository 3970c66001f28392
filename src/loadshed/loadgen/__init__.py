"""loadshed's load generator: open and closed loop, HDR percentiles, sweeps, capacity search.

Modules, one job each: ``options`` (validated run options), ``schedule`` (arrival times),
``engine`` (the async send loops), ``runner`` (processes, usage sampling, lag refusal),
``results`` (counts, histograms, merge, JSON), ``slo`` (objectives and verdicts), ``sweep``,
``capacity``, ``chart`` (PNG and HTML), ``render`` (terminal output), ``usage`` (server CPU/RSS),
``cli`` (the click commands).
"""

from __future__ import annotations

from loadshed.loadgen.options import BenchOptions
from loadshed.loadgen.results import LatencyHistogram, RunResult, merge_results
from loadshed.loadgen.runner import GeneratorSaturated, run_bench
from loadshed.loadgen.slo import SLO, parse_slo

__all__ = [
    "SLO",
    "BenchOptions",
    "GeneratorSaturated",
    "LatencyHistogram",
    "RunResult",
    "merge_results",
    "parse_slo",
    "run_bench",
]
