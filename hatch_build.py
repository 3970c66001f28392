"""Optional compiled build of loadshed's per-request hot path, with mypyc.

    make compiled        # LOADSHED_MYPYC=1 uv build --wheel --no-build-isolation

Without ``LOADSHED_MYPYC=1`` (every normal and editable install) this hook does
nothing and loadshed is pure Python. With it, the modules in :data:`HOT_PATH` (the
admission core, the limiter, the ASGI middleware, the estimators and the limit
algorithms: the code every request runs) are compiled to C extensions by mypyc, the
compiler that ships with mypy (black and mypy build their own wheels this way), and
the wheel becomes platform-specific. The sources stay in the wheel; Python imports
the extension first. Behaviour is the same: ``make test`` runs the core, limiter,
middleware and limit tests again against the compiled build.

Needs mypy, setuptools and hatchling from the dev environment (the locked versions,
hence ``--no-build-isolation``) and a C compiler.
"""

from __future__ import annotations

import importlib.machinery
import os
import shutil
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

HOT_PATH = (
    "admission.py",
    "limiter.py",
    "asgi.py",
    "watch.py",
    "estimate.py",
    "limits/base.py",
    "limits/fixed.py",
    "limits/little.py",
    "limits/aimd.py",
    "limits/vegas.py",
    "limits/gradient.py",
    "limits/gradient2.py",
    "limits/workers.py",
)
"""Modules compiled, relative to src/loadshed (everything else stays pure Python)."""

SWITCH = "LOADSHED_MYPYC"


class CompiledHotPath(BuildHookInterface):  # type: ignore[type-arg]
    """Compiles :data:`HOT_PATH` into the wheel when ``LOADSHED_MYPYC=1``."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        switch = os.environ.get(SWITCH, "")
        if switch not in ("", "0", "1"):
            raise ValueError(f"{SWITCH} must be 0 or 1, got {switch!r}")
        if self.target_name != "wheel" or version == "editable" or switch != "1":
            return
        try:
            from mypyc.build import mypycify
            from setuptools import Distribution
        except ImportError as error:
            raise RuntimeError(
                f"{SWITCH}=1 needs mypy and setuptools where the wheel is built ({error}): "
                "build from the dev environment without isolation (make compiled)"
            ) from error

        root = Path(self.root)
        work = root / "build" / "mypyc"
        shutil.rmtree(work, ignore_errors=True)
        sources = [str(root / "src" / "loadshed" / module) for module in HOT_PATH]
        extensions = mypycify(sources, opt_level="3", target_dir=str(work / "c"))
        distribution = Distribution({"name": "loadshed", "ext_modules": extensions})
        build_ext: Any = distribution.get_command_obj("build_ext")
        build_ext.build_lib = str(work / "lib")
        build_ext.build_temp = str(work / "temp")
        build_ext.ensure_finalized()
        build_ext.run()
        suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
        lib = work / "lib"
        built = [path for path in lib.rglob("*") if path.name.endswith(suffixes)]
        if len(built) <= len(HOT_PATH):  # one per module, plus mypyc's shared runtime
            raise RuntimeError(f"mypyc built {len(built)} extensions for {len(HOT_PATH)} modules")
        for path in built:
            build_data["force_include"][str(path)] = str(path.relative_to(lib))
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
