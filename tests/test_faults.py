"""The fault suite's fast probes (bench/faults/probes.py) as tests: upstream faults,
smuggling, request forms, hop-by-hop headers, oversized and malformed input, bad
configuration for every command, a worker crash storm and graceful shutdown. Each
probe's rows must all hold; a failure shows the probe's table. The soak and the
slowloris at the descriptor limit are bench scripts (bench/faults/run.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "faults"))

import probes

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("name", sorted(probes.FAST))
def test_probe_holds(name: str) -> None:
    rows = probes.FAST[name]()
    assert rows, f"{name} returned no rows"
    broken = [row for row in rows if not row.holds]
    assert not broken, "\n" + probes.render(rows)
