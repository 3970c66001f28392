"""``loadshed demo``: the throughput paradox and its cure, measured live.

The throughput paradox (docs/design.md), for real and scaled in time: hashburn (one worker,
0.5 s of CPU per request) runs as ``loadshed serve-demo`` subprocesses on 127.0.0.1, once bare
and once behind ``LoadShedMiddleware`` (``--protect`` variants; ``none,little`` by default).
Each is driven in turn by loadshed's own closed-loop load generator at a few client counts,
with the client timeout at 4 service times (the paradox's 2 s for 0.5 s), and the results are
printed side by side.

``--scale`` multiplies every time (service time, client timeout, deadline target) so the shape
holds while the demo shrinks: the default 0.2 serves 0.1 s requests to clients that give up
after 0.4 s, capacity 10 requests/s. Between steps an unprotected server is given time to work
off the requests abandoned by the previous step (it computes them all, which is the paradox),
so each step starts from an idle server.

:func:`run_live` is the programmatic form, used by ``bench/e1_live.py`` as well.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import html
import json
import math
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import click

from loadshed.demo.serve import DEFAULT_DEADLINE_TARGET, validate_protect
from loadshed.errors import ConfigError, LoadshedError
from loadshed.limits import LIMIT_SPECS
from loadshed.loadgen.options import BenchOptions, check_retry_jitter
from loadshed.loadgen.results import RunResult

__all__ = [
    "DemoServer",
    "LiveConfig",
    "LiveError",
    "LiveStep",
    "demo",
    "render_table",
    "run_live",
    "start_server",
]

E1_SERVICE_TIME = 0.5
"""The throughput paradox's work per request, seconds."""
E1_TIMEOUT = 2.0
"""The throughput paradox's client timeout, seconds."""
DEFAULT_SCALE = 0.2
DEFAULT_CLIENTS = (1, 2, 4, 8, 16)
DEFAULT_PROTECT = ("none", "little")
_STARTUP_TIMEOUT = 20.0
_DRAIN_BUDGET = 30.0


class LiveError(LoadshedError):
    """A demo server did not start or answer as it should."""


@dataclasses.dataclass(frozen=True)
class LiveConfig:
    """One live throughput-paradox run: which protections, which client counts, how long,
    at what scale."""

    protect: tuple[str, ...] = DEFAULT_PROTECT
    clients: tuple[int, ...] = DEFAULT_CLIENTS
    scale: float = DEFAULT_SCALE
    duration_s: float = 4.0
    warmup_s: float = 1.0
    workers: int = 1
    honor_retry_after: bool = False
    """Clients wait out a 503's Retry-After (the paradox's clients, like
    bombardier, do not)."""
    retry_jitter: float = 0.0
    """With ``honor_retry_after``: waits drawn from Retry-After x [1 - j, 1 + j]."""

    def __post_init__(self) -> None:
        if not self.protect:
            raise ConfigError("--protect", "give at least one variant")
        for name in self.protect:
            validate_protect(name)
        if not self.clients or any(c < 1 for c in self.clients):
            raise ConfigError("--clients", f"must be integers >= 1, got {list(self.clients)}")
        if not 0 < self.scale <= 10:
            raise ConfigError("--scale", f"must be in (0, 10], got {self.scale}")
        if not self.duration_s > 0:
            raise ConfigError("--duration", f"must be > 0 seconds, got {self.duration_s}")
        if self.warmup_s < 0:
            raise ConfigError("--warmup", f"must be >= 0 seconds, got {self.warmup_s}")
        if self.workers < 1:
            raise ConfigError("--workers", f"must be >= 1, got {self.workers}")
        check_retry_jitter(self.retry_jitter, self.honor_retry_after)

    @property
    def service_time_s(self) -> float:
        """hashburn's work per request: the paradox's 0.5 s times the scale."""
        return E1_SERVICE_TIME * self.scale

    @property
    def timeout_s(self) -> float:
        """The clients' timeout: the paradox's 2 s (4 service times) times the
        scale."""
        return E1_TIMEOUT * self.scale

    @property
    def deadline_target_s(self) -> float:
        """``--protect deadline``'s response-time target: the paradox's 1.8 s times the
        scale."""
        return DEFAULT_DEADLINE_TARGET * self.scale

    @property
    def capacity_rps(self) -> float:
        """What the service can serve: workers / service time."""
        return self.workers / self.service_time_s


@dataclasses.dataclass
class LiveStep:
    """One protection at one client count: the load generator's result."""

    protect: str
    clients: int
    result: RunResult
    drain_s: float = 0.0

    def summary(self, capacity_rps: float) -> dict[str, Any]:
        """The figures of the throughput paradox's table, as a JSON-ready dict (times in
        seconds)."""
        result = self.result
        success = result.latency("success")
        rejected = result.latency("rejected")
        return {
            "protect": self.protect,
            "clients": self.clients,
            "throughput_rps": result.throughput_rps,
            # Little's law, R = N / X: the mean response time that N clients retrying
            # at once must see at this throughput, however fast each answer is made.
            "closed_loop_mean_s": (
                self.clients / result.throughput_rps if result.throughput_rps > 0 else None
            ),
            "goodput_rps": result.goodput_rps,
            "goodput_ratio": result.goodput_rps / capacity_rps,
            "successes": result.successes,
            "p50_success_s": float(success["p50"]) if result.successes else None,
            "p99_success_s": float(success["p99"]) if result.successes else None,
            "rejected": result.rejections,
            "p50_rejected_s": float(rejected["p50"]) if result.rejections else None,
            "p99_rejected_s": float(rejected["p99"]) if result.rejections else None,
            "timeouts": result.errors.get("timeout", 0),
            "other_errors": sum(n for k, n in result.errors.items() if k != "timeout"),
            "drain_before_s": self.drain_s,
        }


# ------------------------------------------------------------------------ servers


class DemoServer:
    """A ``loadshed serve-demo`` subprocess in its own process group on 127.0.0.1."""

    def __init__(self, process: subprocess.Popen[bytes], url: str, stderr: IO[bytes]) -> None:
        self.process = process
        self.url = url
        self._stderr = stderr
        self._stopped = False

    @property
    def pid(self) -> int:
        """The server's process id (also its process group id)."""
        return self.process.pid

    def health(self, timeout: float) -> dict[str, Any]:
        """``GET /health`` as a dict; raises ``OSError`` on failure."""
        with urllib.request.urlopen(f"{self.url}/health", timeout=timeout) as response:
            data = json.loads(response.read())
        assert isinstance(data, dict)
        return data

    def stop(self, grace_s: float = 3.0) -> None:
        """Stop the server and everything it started (its worker processes): SIGTERM to the
        server (it stops its workers), SIGKILL to its process group after ``grace_s``.
        Stopping a stopped server does nothing."""
        if self._stopped:
            return
        self._stopped = True
        process = self.process
        if process.poll() is None:
            process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)
        # The group may outlive its leader (forked workers): make sure it is gone.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)
        if process.stdout is not None:
            process.stdout.close()
        self._stderr.close()

    def stderr_text(self) -> str:
        """What the server wrote to stderr so far (for error messages)."""
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace").strip()


_URL_RE = re.compile(rb"http://127\.0\.0\.1:(\d+)")


def start_server(
    protect: str,
    service_time_s: float,
    *,
    workers: int = 1,
    deadline_target_s: float = DEFAULT_DEADLINE_TARGET,
) -> DemoServer:
    """Start hashburn under ``serve-demo --protect protect`` on 127.0.0.1, a free port; wait
    until it answers ``/health``. Raises :class:`LiveError` if it does not."""
    command = [
        sys.executable, "-m", "loadshed.cli", "serve-demo",
        "--model", "hashburn",
        "--protect", protect,
        "--service-time", repr(service_time_s),
        "--workers", str(workers),
        "--deadline-target", repr(deadline_target_s),
        "--host", "127.0.0.1",
        "--port", "0",
    ]  # fmt: skip
    stderr = tempfile.TemporaryFile()  # noqa: SIM115 - the server owns it, closed in stop()
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=stderr, start_new_session=True
    )
    server = DemoServer(process, "", stderr)
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + _STARTUP_TIMEOUT
        ready, _, _ = select.select([process.stdout], [], [], _STARTUP_TIMEOUT)
        line = process.stdout.readline() if ready else b""
        match = _URL_RE.search(line)
        if match is None:
            raise LiveError(
                f"serve-demo --protect {protect} did not start: "
                f"{server.stderr_text() or line.decode(errors='replace') or 'no output'}"
            )
        server.url = f"http://127.0.0.1:{int(match.group(1))}"
        while True:
            try:
                server.health(timeout=1.0)
                break
            except OSError as error:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise LiveError(
                        f"serve-demo --protect {protect} does not answer /health: "
                        f"{server.stderr_text() or error}"
                    ) from None
                time.sleep(0.05)
    except BaseException:
        server.stop()
        raise
    return server


@contextlib.contextmanager
def demo_servers(config: LiveConfig) -> Iterator[dict[str, DemoServer]]:
    """Start one server per protection (they are idle until driven); stop them all on exit,
    whatever happens (errors, Ctrl-C)."""
    servers: dict[str, DemoServer] = {}
    try:
        for protect in config.protect:
            servers[protect] = start_server(
                protect,
                config.service_time_s,
                workers=config.workers,
                deadline_target_s=config.deadline_target_s,
            )
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def wait_idle(server: DemoServer, budget_s: float = _DRAIN_BUDGET) -> float:
    """Wait until the server has no job running or waiting (the work abandoned by the last
    step's clients is done); return the seconds waited (at most ``budget_s``)."""
    started = time.monotonic()
    while time.monotonic() - started < budget_s:
        try:
            state = server.health(timeout=max(0.1, budget_s))
        except OSError:
            state = {}
        if state.get("busy") == 0 and state.get("waiting") == 0:
            break
        time.sleep(0.05)
    return time.monotonic() - started


# ------------------------------------------------------------------------ runs


def run_live(
    config: LiveConfig,
    *,
    on_step: Callable[[LiveStep], None] | None = None,
    on_start: Callable[[str, int], None] | None = None,
) -> list[LiveStep]:
    """Run the throughput paradox live as ``config`` says and return every step,
    protections in order.

    Servers run one at a time under load (the machine's cores are shared), each driven at
    every client count in increasing order and stopped after its last step (so no
    abandoned work burns CPU under the next); all are stopped when this returns or raises.
    """
    from loadshed.loadgen.runner import run_bench

    steps: list[LiveStep] = []
    with demo_servers(config) as servers:
        for protect in config.protect:
            server = servers[protect]
            for index, clients in enumerate(config.clients):
                drain_s = wait_idle(server) if index else 0.0
                if on_start is not None:
                    on_start(protect, clients)
                options = BenchOptions(
                    url=f"{server.url}/calculate?input=loadshed",
                    clients=clients,
                    duration_s=config.duration_s,
                    warmup_s=config.warmup_s,
                    timeout_s=config.timeout_s,
                    honor_retry_after=config.honor_retry_after,
                    retry_jitter=config.retry_jitter,
                )
                step = LiveStep(protect, clients, run_bench(options), drain_s)
                steps.append(step)
                if on_step is not None:
                    on_step(step)
            # Done with this protection: stop it now. Left running, an unprotected
            # server keeps computing the backlog its clients abandoned (minutes of CPU
            # after 32 clients) and skews the next protection's latencies.
            server.stop()
    return steps


def results_json(config: LiveConfig, steps: Sequence[LiveStep]) -> dict[str, Any]:
    """The run as a JSON-ready dict."""
    return {
        "experiment": "throughput paradox, live",
        "scale": config.scale,
        "service_time_s": config.service_time_s,
        "timeout_s": config.timeout_s,
        "workers": config.workers,
        "capacity_rps": config.capacity_rps,
        "duration_s": config.duration_s,
        "warmup_s": config.warmup_s,
        "honor_retry_after": config.honor_retry_after,
        "retry_jitter": config.retry_jitter,
        "steps": [step.summary(config.capacity_rps) for step in steps],
    }


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


TABLE_COLUMNS: tuple[str, ...] = (
    "clients", "protect", "good/s", "of cap", "p50 ok", "p99 ok", "503s", "p99 503", "timeouts",
)  # fmt: skip
"""The columns of the demo's table (times in ms)."""


def table_rows(
    config: LiveConfig, steps: Sequence[LiveStep]
) -> list[tuple[list[str], float, bool]]:
    """The demo's table as text: per row, the cells (:data:`TABLE_COLUMNS`), the share of
    capacity served and whether the row ends a client count's group. One row per client
    count and protection, protections in ``config.protect`` order."""
    rows: list[tuple[list[str], float, bool]] = []
    order = {name: i for i, name in enumerate(config.protect)}
    for clients in sorted({s.clients for s in steps}):
        row_steps = sorted(
            (s for s in steps if s.clients == clients), key=lambda s: order[s.protect]
        )
        for position, step in enumerate(row_steps):
            figures = step.summary(config.capacity_rps)
            ratio = figures["goodput_ratio"]
            cells = [
                str(clients) if position == 0 else "",
                step.protect,
                f"{figures['goodput_rps']:.2f}",
                f"{ratio:.0%}",
                _ms(figures["p50_success_s"]),
                _ms(figures["p99_success_s"]),
                str(figures["rejected"]),
                _ms(figures["p99_rejected_s"]),
                str(figures["timeouts"]),
            ]
            rows.append((cells, ratio, position == len(row_steps) - 1))
    return rows


def table_title(config: LiveConfig) -> str:
    """The demo's table title: the scale, the service and its capacity."""
    return (
        f"Throughput paradox, live at {config.scale:g}x time: {config.workers} worker, "
        f"{config.service_time_s * 1e3:g} ms per request, client timeout "
        f"{config.timeout_s * 1e3:g} ms, capacity {config.capacity_rps:g} req/s; times in ms"
    )


def render_table(config: LiveConfig, steps: Sequence[LiveStep]) -> Any:
    """A rich table: one row per client count and protection, protections side by side."""
    from rich.table import Table

    table = Table(title=table_title(config))
    for name in TABLE_COLUMNS:
        table.add_column(name, justify="left" if name == "protect" else "right")
    for cells, ratio, last in table_rows(config, steps):
        style = "green" if ratio >= 0.9 else "red" if ratio < 0.5 else "yellow"
        cells[3] = f"[{style}]{cells[3]}[/{style}]"
        table.add_row(*cells, end_section=last)
    return table


def write_comparison_chart(config: LiveConfig, steps: Sequence[LiveStep], path: Path) -> Path:
    """Goodput of every protection against clients, on one PNG, with the capacity line and
    the p99 of successes. (The load generator's per-protection charts plot throughput with
    the 503s counted, thousands per second when shedding, on the same axis as goodput.)"""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4.5), dpi=100)
    rates = figure.add_subplot()
    latency = rates.twinx()
    for protect in config.protect:
        mine = [s for s in steps if s.protect == protect]
        loads = [s.clients for s in mine]
        (line,) = rates.plot(
            loads, [s.result.goodput_rps for s in mine], "o-", label=f"{protect}: goodput"
        )
        p99 = [
            float(s.result.latency("success")["p99"]) * 1e3 if s.result.successes else None
            for s in mine
        ]
        latency.plot(
            loads, [math.nan if v is None else v for v in p99], "v:", color=line.get_color(),
            label=f"{protect}: p99 of successes",
        )  # fmt: skip
    rates.axhline(config.capacity_rps, color="grey", linestyle="--", label="capacity")
    latency.axhline(config.timeout_s * 1e3, color="tab:red", linestyle=":", alpha=0.5,
                    label="client timeout")  # fmt: skip
    rates.set_xlabel("closed-loop clients")
    rates.set_ylabel("goodput (2xx within the timeout per s)")
    rates.set_ylim(bottom=0, top=config.capacity_rps * 1.25)
    latency.set_ylabel("latency (ms)")
    latency.set_ylim(bottom=0, top=config.timeout_s * 1e3 * 1.25)
    rates.grid(True, alpha=0.3)
    handles = rates.get_legend_handles_labels()[0] + latency.get_legend_handles_labels()[0]
    labels = rates.get_legend_handles_labels()[1] + latency.get_legend_handles_labels()[1]
    rates.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3,
                 fontsize="small")  # fmt: skip
    figure.suptitle(
        f"Throughput paradox, live: {config.service_time_s * 1e3:g} ms per request, "
        f"timeout {config.timeout_s * 1e3:g} ms, capacity {config.capacity_rps:g} req/s",
        fontsize="medium",
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", bbox_inches="tight")
    return path


def write_step_charts(config: LiveConfig, steps: Sequence[LiveStep], out_dir: Path) -> list[Path]:
    """One PNG and HTML chart per protection (the load generator's sweep chart)."""
    from loadshed.loadgen.chart import write_charts
    from loadshed.loadgen.sweep import SweepStep

    written: list[Path] = []
    for protect in config.protect:
        sweep = [SweepStep(load=s.clients, result=s.result) for s in steps if s.protect == protect]
        title = (
            f"Throughput paradox live, --protect {protect}: "
            f"{config.service_time_s * 1e3:g} ms per request, timeout "
            f"{config.timeout_s * 1e3:g} ms, capacity {config.capacity_rps:g} req/s"
        )
        safe = protect.replace(":", "-")
        written.extend(write_charts(sweep, "clients", out_dir / f"demo-{safe}.png", title))
    return written


def write_demo_html(
    config: LiveConfig, steps: Sequence[LiveStep], png_path: Path, html_path: Path
) -> Path:
    """A self-contained HTML page: the PNG at ``png_path`` inline (base64) above the demo's
    table. Needs nothing beyond the standard library."""
    image = base64.b64encode(png_path.read_bytes()).decode("ascii")
    header = "".join(f"<th>{html.escape(name)}</th>" for name in TABLE_COLUMNS)
    body = []
    for cells, _ratio, last in table_rows(config, steps):
        row = "".join(f"<td>{html.escape(cell)}</td>" for cell in cells)
        body.append(f"<tr class='end'>{row}</tr>" if last else f"<tr>{row}</tr>")
    title = html.escape(table_title(config))
    html_path.parent.mkdir(parents=True, exist_ok=True)
    html_path.write_text(
        "<!doctype html>\n<html><head><meta charset='utf-8'><title>loadshed demo</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
        "td:nth-child(2){text-align:left}tr.end td{border-bottom:2px solid #888}</style>"
        f"</head><body>\n<h1>loadshed demo</h1>\n<p>{title}</p>\n"
        f"<img alt='goodput against clients' src='data:image/png;base64,{image}'>\n"
        f"<table><thead><tr>{header}</tr></thead><tbody>\n" + "\n".join(body) + "\n"
        "</tbody></table>\n</body></html>\n"
    )
    return html_path


def _have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


NO_MATPLOTLIB = "charts skipped: matplotlib is not installed (pip install 'loadshed[charts]')"
"""What the demo says when it cannot draw its charts (results.json is still written)."""
DEFAULT_OUT = Path("loadshed-demo")
"""Where ``loadshed demo`` writes its charts and results unless told (``--out``)."""


def write_outputs(
    config: LiveConfig, steps: Sequence[LiveStep], out_dir: Path, *, charts: bool = True
) -> tuple[list[Path], str | None]:
    """Write the run to ``out_dir``: ``results.json`` always; with ``charts`` (and
    matplotlib installed) also ``demo.png`` (goodput side by side), ``demo.html`` (that
    picture and the table, self-contained) and ``demo-<protect>.png``/``.html`` (the load
    generator's chart per protection). Return the paths written and why charts were
    skipped when they were asked for but could not be drawn (``None`` otherwise)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results_path = out_dir / "results.json"
    results_path.write_text(json.dumps(results_json(config, steps), indent=2) + "\n")
    if not charts:
        return [results_path], None
    if not _have_matplotlib():
        return [results_path], NO_MATPLOTLIB
    png = write_comparison_chart(config, steps, out_dir / "demo.png")
    written = [png, write_demo_html(config, steps, png, out_dir / "demo.html"), results_path]
    written += write_step_charts(config, steps, out_dir)
    return written, None


# ------------------------------------------------------------------------ command


def _parse_protect(text: str) -> tuple[str, ...]:
    names = tuple(p.strip().lower() for p in text.split(",") if p.strip())
    if not names:
        raise ConfigError("--protect", "give at least one variant, e.g. none,little")
    if len(set(names)) != len(names):
        raise ConfigError("--protect", f"variants must be distinct, got {text!r}")
    return tuple(validate_protect(name) for name in names)


@click.command()
@click.option(
    "--scale",
    type=float,
    default=DEFAULT_SCALE,
    show_default=True,
    help="Time scale: service time 0.5 s x scale, client timeout 2 s x scale.",
)
@click.option(
    "--clients",
    default=",".join(map(str, DEFAULT_CLIENTS)),
    show_default=True,
    help="Closed-loop client counts, e.g. 1,2,4,8,16 or 1:16:3.",
)
@click.option(
    "--protect",
    default=",".join(DEFAULT_PROTECT),
    show_default=True,
    help=f"Variants to compare: none|queue|deadline|{LIMIT_SPECS}.",
)
@click.option("--duration", default="4s", show_default=True, help="Measured time per step.")
@click.option("--warmup", default="1s", show_default=True, help="Unmeasured lead-in per step.")
@click.option(
    "--out",
    "--chart",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_OUT,
    show_default=True,
    help=(
        "Write demo.png (goodput side by side), demo.html (that chart and the table), "
        "demo-<protect>.png/.html and results.json here (--chart: the same)."
    ),
)
@click.option("--no-chart", "no_chart", is_flag=True, help="Write results.json only, no charts.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option("--sim", is_flag=True, help="Run the virtual-time simulation instead (instant).")
@click.pass_context
def demo(
    ctx: click.Context,
    scale: float,
    clients: str,
    protect: str,
    duration: str,
    warmup: str,
    out_dir: Path,
    no_chart: bool,
    as_json: bool,
    sim: bool,
) -> None:
    """The throughput paradox and its cure, measured live in about a minute.

    Starts hashburn (one worker) on 127.0.0.1 bare and behind loadshed's default adaptive
    limit, drives each with closed-loop clients whose timeout is 4 service times, and prints
    goodput, latency of successes, 503s and timeouts side by side. Writes the charts
    (demo.png, demo.html) and results.json to ./loadshed-demo, or to --out DIR.
    """
    if sim:
        from loadshed.sim.cli import demo as sim_demo

        ctx.invoke(sim_demo, seed=1, as_json=as_json)
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from loadshed.units import parse_duration, parse_int_list

    try:
        config = LiveConfig(
            protect=_parse_protect(protect),
            clients=tuple(parse_int_list(clients, "--clients")),
            scale=scale,
            duration_s=parse_duration(duration, "--duration"),
            warmup_s=parse_duration(warmup, "--warmup"),
        )
    except ConfigError as error:
        raise click.UsageError(str(error)) from None

    err = Console(stderr=True)
    total = len(config.protect) * len(config.clients)
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} steps"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    )
    task = progress.add_task("starting servers", total=total)

    def on_start(name: str, count: int) -> None:
        progress.update(task, description=f"--protect {name}: {count} clients")

    def on_step(step: LiveStep) -> None:
        progress.advance(task)

    try:
        with progress:
            steps = run_live(config, on_step=on_step, on_start=on_start)
    except KeyboardInterrupt:
        err.print("interrupted: every demo server was stopped")
        ctx.exit(130)
    except LiveError as error:
        raise click.ClickException(str(error)) from None

    if as_json:
        click.echo(json.dumps(results_json(config, steps), indent=2))
    else:
        # Off a terminal (CI logs, pipes) rich would cut the table at 80 columns.
        Console(width=None if sys.stdout.isatty() else 120).print(render_table(config, steps))
    written, skipped = write_outputs(config, steps, out_dir, charts=not no_chart)
    if skipped is not None:
        click.echo(skipped, err=True)
    click.echo(f"wrote {', '.join(str(path) for path in written)}", err=True)
