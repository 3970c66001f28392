"""The live ``loadshed demo``: real servers on loopback, the real load generator, tiny scale."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from loadshed.demo.live import LiveConfig, LiveStep, run_live

pytestmark = pytest.mark.timeout(90)


def descendants() -> set[int]:
    """Pids of every process below this one (servers and their worker processes)."""
    return {p.pid for p in psutil.Process().children(recursive=True)}


def assert_all_gone(pids: set[int]) -> None:
    alive = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            if process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
        except psutil.NoSuchProcess:
            pass
    _gone, still = psutil.wait_procs(alive, timeout=5)
    assert not still, f"left running: {still}"


def test_protected_goodput_holds_where_the_bare_service_collapses() -> None:
    """E1 at 1/10 time (50 ms of work, 200 ms client timeout, capacity 20/s) at 1 and 8
    clients: at 8 the bare service serves almost nothing in time, the default limit holds."""
    config = LiveConfig(
        protect=("none", "little"), clients=(1, 8), scale=0.1, duration_s=2.0, warmup_s=0.5
    )
    seen: set[int] = set()
    before = descendants()
    alive_at_start: dict[str, set[int]] = {}

    def on_start(protect: str, clients: int) -> None:
        now = descendants() - before
        seen.update(now)
        alive_at_start.setdefault(protect, now)

    steps = run_live(config, on_start=on_start)
    # The unprotected server (and the backlog its worker would still be computing)
    # is stopped before the protected one is measured.
    bare_only = alive_at_start["none"] - alive_at_start["little"]
    assert len(bare_only) >= 2, alive_at_start
    # a server process and its hashburn worker, for each protection
    assert len(seen) >= 2 * len(config.protect)
    assert_all_gone(seen)

    by_key: dict[tuple[str, int], LiveStep] = {(s.protect, s.clients): s for s in steps}
    assert sorted(by_key) == [("little", 1), ("little", 8), ("none", 1), ("none", 8)]
    capacity = config.capacity_rps
    bare, protected = by_key["none", 8].summary(capacity), by_key["little", 8].summary(capacity)
    assert protected["goodput_rps"] >= bare["goodput_rps"]
    assert bare["goodput_ratio"] < 0.5 and bare["timeouts"] > 0  # the paradox, live
    assert protected["goodput_ratio"] > 0.6  # generous: the machine is shared
    assert protected["rejected"] > 0  # the cure is shedding the excess
    # Little's law over the step: 8 clients at X responses per second wait 8 / X.
    assert protected["closed_loop_mean_s"] == pytest.approx(8 / protected["throughput_rps"])
    one = by_key["none", 1].summary(capacity)
    assert one["goodput_ratio"] > 0.6 and one["timeouts"] == 0


def run_demo(
    *args: str, timeout: float = 60, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loadshed.cli", "demo", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=cwd,
        env=env,
    )


# The smallest live run: one protection, one client count, about a second of load.
TINY = ("--scale", "0.1", "--clients", "2", "--duration", "1s", "--warmup", "0.3s")
TINY += ("--protect", "little")


def test_cli_end_to_end_json_table_and_chart(tmp_path: Path) -> None:
    args = ("--scale", "0.1", "--clients", "2", "--duration", "1s", "--warmup", "0.3s")
    result = run_demo(*args, "--protect", "little", "--json", "--chart", str(tmp_path))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["service_time_s"] == pytest.approx(0.05)
    assert data["timeout_s"] == pytest.approx(0.2)
    assert data["capacity_rps"] == pytest.approx(20.0)
    [step] = data["steps"]
    assert step["protect"] == "little" and step["clients"] == 2
    assert step["goodput_rps"] > 0 and step["timeouts"] == 0
    assert (tmp_path / "demo.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "demo-little.png").read_bytes()[:4] == b"\x89PNG"
    assert "<svg" in (tmp_path / "demo-little.html").read_text()
    assert json.loads((tmp_path / "results.json").read_text()) == data


def test_writes_charts_and_results_to_loadshed_demo_by_default(tmp_path: Path) -> None:
    result = run_demo(*TINY, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "loadshed-demo"
    assert (out / "demo.png").read_bytes()[:4] == b"\x89PNG"
    page = (out / "demo.html").read_text()
    assert "src='data:image/png;base64,iVBORw0KGgo" in page  # the PNG, inline
    assert "<td>little</td>" in page and "<th>good/s</th>" in page  # the table
    data = json.loads((out / "results.json").read_text())
    assert [step["protect"] for step in data["steps"]] == ["little"]
    assert "wrote loadshed-demo/demo.png, loadshed-demo/demo.html" in result.stderr
    assert "loadshed-demo/results.json" in result.stderr


def test_no_chart_writes_only_results_json(tmp_path: Path) -> None:
    result = run_demo(*TINY, "--no-chart", "--out", "elsewhere", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["elsewhere", "results.json"]
    assert json.loads((tmp_path / "elsewhere" / "results.json").read_text())["steps"]
    assert "wrote elsewhere/results.json" in result.stderr


def test_without_matplotlib_says_so_and_writes_results_json(tmp_path: Path) -> None:
    """matplotlib is the optional ``charts`` extra: hide it behind a package that fails."""
    shadow = tmp_path / "shadow" / "matplotlib"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(shadow.parent), env.get("PYTHONPATH")]))
    work = tmp_path / "work"
    work.mkdir()
    result = run_demo(*TINY, cwd=work, env=env)
    assert result.returncode == 0, result.stderr
    assert [p.name for p in (work / "loadshed-demo").iterdir()] == ["results.json"]
    assert "charts skipped: matplotlib is not installed" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--protect", "none,bogus"], "--protect"),
        (["--protect", "little,little"], "--protect"),
        (["--clients", "0"], "--clients"),
        (["--clients", "a,b"], "--clients"),
        (["--scale", "0"], "--scale"),
        (["--duration", "soon"], "--duration"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(args: list[str], flag: str) -> None:
    result = run_demo(*args, timeout=20)
    assert result.returncode == 2, result.stderr
    [error] = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert flag in error
    assert "Traceback" not in result.stderr


def test_servers_are_stopped_when_interrupted() -> None:
    """Ctrl-C (KeyboardInterrupt) while the servers run: every process is gone afterwards."""
    config = LiveConfig(protect=("none", "little"), clients=(1,), scale=0.1)
    seen: set[int] = set()
    before = descendants()

    def interrupt(protect: str, clients: int) -> None:
        seen.update(descendants() - before)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_live(config, on_start=interrupt)
    assert len(seen) >= 2 * len(config.protect)
    assert_all_gone(seen)


def test_sim_flag_runs_the_simulated_demo() -> None:
    result = run_demo("--sim", "--json", timeout=30)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert set(data) == {"none", "little"}
