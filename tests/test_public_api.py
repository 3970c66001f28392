"""``loadshed``'s public names: exactly these, each the object from its home module.

Adding or removing a name from ``loadshed.__all__`` is an API change: update this list on
purpose, with the README and the CHANGELOG.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import loadshed

PUBLIC = {
    "AdaptiveClient": "loadshed.client",
    "Admission": "loadshed.admission",
    "AdmissionConfig": "loadshed.config",
    "Clock": "loadshed.clock",
    "ConfigError": "loadshed.errors",
    "Discipline": "loadshed.config",
    "LimitUnit": "loadshed.config",
    "Limiter": "loadshed.limiter",
    "LimiterSnapshot": "loadshed.admission",
    "LoadShedMiddleware": "loadshed.asgi",
    "LoadshedError": "loadshed.errors",
    "LoadshedMetrics": "loadshed.metrics",
    "ModelRunner": "loadshed.runner",
    "MonotonicClock": "loadshed.clock",
    "Outcome": "loadshed.errors",
    "Priority": "loadshed.errors",
    "RejectReason": "loadshed.errors",
    "Rejected": "loadshed.errors",
    "Ticket": "loadshed.admission",
    "Token": "loadshed.admission",
    "VirtualClock": "loadshed.clock",
    "bounded_map": "loadshed.bounded",
    "make_limit": "loadshed.limits",
}
"""Every public name and the module it is defined or documented in."""


def test_all_is_exactly_the_public_names_sorted() -> None:
    assert loadshed.__all__ == sorted(PUBLIC)


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_each_name_is_the_object_from_its_home_module(name: str) -> None:
    home = importlib.import_module(PUBLIC[name])
    assert getattr(loadshed, name) is getattr(home, name)


def test_star_import_gives_every_public_name() -> None:
    namespace: dict[str, object] = {}
    exec("from loadshed import *", namespace)
    assert set(PUBLIC) <= set(namespace)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Middleware'"):
        loadshed.Middleware  # type: ignore[attr-defined]  # noqa: B018


def test_version_is_the_packages() -> None:
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    version = re.search(r'^version = "([^"]+)"$', pyproject, re.MULTILINE)
    assert version is not None and loadshed.__version__ == version.group(1)
