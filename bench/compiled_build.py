"""Benchmark variants that run loadshed's compiled build (``make compiled``).

A variant named ``<app>+compiled`` (``fixed+compiled``, ``little+compiled``) serves
the same app from ``bench/middleware_targets.py`` with ``build/compiled`` first on
``PYTHONPATH``, so the server imports the mypyc-built modules instead of ``src/``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

DEFAULT_DIR = Path(__file__).resolve().parent.parent / "build" / "compiled"
SUFFIX = "+compiled"


def app_name(variant: str) -> str:
    """The app in middleware_targets that a variant serves."""
    return variant.removesuffix(SUFFIX)


def environment(variant: str, compiled_dir: Path) -> dict[str, str]:
    """The server's environment: the compiled build first on the path when asked."""
    env = dict(os.environ)
    if variant.endswith(SUFFIX):
        env["PYTHONPATH"] = os.pathsep.join(
            part for part in (str(compiled_dir), env.get("PYTHONPATH", "")) if part
        )
    return env


def check(compiled_dir: Path) -> None:
    """Exit with a clear message unless compiled_dir really holds the compiled build."""
    probe = "import loadshed.asgi; print(loadshed.asgi.__file__)"
    env = environment(SUFFIX, compiled_dir)
    found = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=False
    ).stdout.strip()
    if not found.endswith((".so", ".pyd")):
        sys.exit(f"error: no compiled build in {compiled_dir} (run `make compiled` first)")
