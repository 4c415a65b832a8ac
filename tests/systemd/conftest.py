"""Fixtures of the tests that run npuops' units under real systemd (tests/support/systemd.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.engine import engine_python_or_skip, make_model
from tests.support.paths import REPO
from tests.support.systemd import RealSystemd, ServingNode, prepare_serving_node, unavailable_reason

REQUIRE_ENV = "NPUOPS_REQUIRE_SYSTEMD"


def _hidden(path: Path) -> bool:
    return any(part in ("tmp", "home", "root") for part in Path(os.path.realpath(path)).parts[1:2])


@pytest.fixture(scope="session")
def serving_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServingNode]:
    """One real systemd for the session, prepared as a serving node; powered off and unmounted at the end."""
    reason = unavailable_reason()
    if reason is not None:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    engine_python = engine_python_or_skip()
    if _hidden(engine_python) or _hidden(engine_python.resolve()):
        pytest.fail(f"the engine venv ({engine_python}, {engine_python.resolve()}) lies where the units' sandbox "
                    "hides it from their user: build it under /opt from the system python (`scripts/engine-venv.sh` "
                    "does so as root: /opt/npuops-engine/venv)", pytrace=False)
    model = make_model(engine_python, tmp_path_factory.mktemp("systemd-model") / "tiny-llama")
    systemd = RealSystemd(Path(tmp_path_factory.mktemp("systemd")))
    systemd.boot()
    try:
        yield prepare_serving_node(systemd, engine_python, REPO, model)
    finally:
        systemd.shutdown()
