"""What checks read: the probe, the settings, the options of this run, and facts computed once."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npuops.datafiles import load_data_toml
from npuops.envfile import parse_env_file
from npuops.errors import BadInputError
from npuops.hardware.node import Chip, Node, discover_node
from npuops.hardware.parsing import ParseError
from npuops.hardware.probe import Probe
from npuops.settings import Settings


@dataclass(frozen=True)
class DoctorOptions:
    expect_chips: int | None = None
    # The environment file a launch rendered (systemd EnvironmentFile=); None checks npuops' own environment.
    env_file: Path | None = None
    # A model directory whose disk the checks should look at.
    model_dir: Path | None = None
    # Device ids a launch will use; None means all chips.
    devices: tuple[int, ...] | None = None
    gpu_memory_utilization: float = 0.9
    # Whether the service runs with graph mode (not --enforce-eager).
    graph_mode: bool = True
    # Served-model precision: the endpoint, its model name, the reference (a golden file or a model directory for
    # a transformers reference), the API key, and the serving dtype (which picks the bounds).
    endpoint: str | None = None
    served_model: str | None = None
    golden: Path | None = None
    reference_model: Path | None = None
    api_key: str | None = None
    served_dtype: str | None = None


class CheckContext:
    """Shared by all checks of one doctor run; expensive facts are computed once, thread-safely."""

    def __init__(self, probe: Probe, options: DoctorOptions | None = None) -> None:
        self.probe = probe
        self.options = options or DoctorOptions()
        self._lock = threading.Lock()
        self._node: Node | None = None
        self._service_env: dict[str, str] | None = None
        self._thresholds: dict[str, Any] | None = None

    @property
    def settings(self) -> Settings:
        return self.probe.settings

    @property
    def node(self) -> Node:
        with self._lock:
            if self._node is None:
                self._node = discover_node(self.probe)
            return self._node

    def service_env(self) -> Mapping[str, str]:
        """The environment the service will run with: the env file when given, else npuops' own."""
        with self._lock:
            if self._service_env is None:
                env_file = self.options.env_file
                if env_file is None:
                    self._service_env = dict(self.settings.environ)
                else:
                    try:
                        text = env_file.read_text(encoding="utf-8")
                    except OSError as exc:
                        raise BadInputError(f"cannot read environment file {env_file}: {exc.strerror}",
                                            "pass the env file a launch rendered (e.g. /etc/npuops/NAME/env)") from None
                    try:
                        self._service_env = parse_env_file(text, str(env_file))
                    except ParseError as exc:
                        raise BadInputError(str(exc), "fix the line, or re-render it with `npuops launch`") from None
            return self._service_env

    @property
    def env_source(self) -> str:
        return str(self.options.env_file) if self.options.env_file else "the current environment"

    def threshold(self, name: str) -> Any:
        """A value from npuops/data/doctor_thresholds.toml (thresholds are data, not code)."""
        with self._lock:
            if self._thresholds is None:
                self._thresholds = load_data_toml("doctor_thresholds.toml")
        return self._thresholds[name]

    def selected_chips(self) -> list[Chip]:
        """The chips this run is about: all, or those a launch will use (--devices)."""
        chips = list(self.node.chips)
        if self.options.devices is None:
            return chips
        wanted = set(self.options.devices)
        return [c for c in chips if c.device_id in wanted]
