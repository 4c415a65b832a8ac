"""Where things are: the repository, its fixture directories, the tools of the venv running the tests."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
ASCEND_FIXTURES = FIXTURES / "ascend"
MODEL_FIXTURES = FIXTURES / "models"

# The fleet tests' recorded ansible-runner events, their playbooks and loopback-only inventories.
FLEET_RECORDINGS = REPO / "tests" / "fleet" / "fixtures"
FLEET_PLAYBOOKS = REPO / "tests" / "fleet" / "playbooks"
FLEET_INVENTORIES = REPO / "tests" / "fleet" / "inventories"

# The npuops and ansible-playbook of the interpreter running the tests (the project venv).
VENV_BIN = Path(sys.executable).parent
NPUOPS = str(VENV_BIN / "npuops")
