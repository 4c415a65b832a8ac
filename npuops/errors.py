"""Exit codes and the expected-error hierarchy.

Exit codes are named here and nowhere else. An expected error carries the problem and the fix;
the CLI prints it as one line and exits with its code. Anything else escaping a command is a bug.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0
    CHECKS_FAILED = 1
    USAGE = 2
    BAD_INPUT = 3
    ENVIRONMENT_MISSING = 4
    # A bug in npuops itself (BSD sysexits EX_SOFTWARE): printed with a traceback.
    INTERNAL_ERROR = 70
    INTERRUPTED = 130


class NpuopsError(Exception):
    """An expected failure: bad input, a missing tool, an unreachable thing.

    `problem` says what is wrong, `fix` what to do about it.
    """

    exit_code: ExitCode = ExitCode.BAD_INPUT

    def __init__(self, problem: str, fix: str) -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem} - {fix}" if fix else problem)

    def one_line(self) -> str:
        text = f"{self.problem}; fix: {self.fix}" if self.fix else self.problem
        return " ".join(text.split())


class BadInputError(NpuopsError):
    """The user gave something npuops cannot use (a path, a flag value, a config file)."""

    exit_code = ExitCode.BAD_INPUT


class ConfigError(BadInputError):
    """A configuration file or NPUOPS_* variable is malformed."""


class EnvironmentMissingError(NpuopsError):
    """Something the command needs is not on this machine (a tool, a driver, a service manager)."""

    exit_code = ExitCode.ENVIRONMENT_MISSING


class ServiceManagerError(NpuopsError):
    """The service manager (systemctl) refused or failed an operation; its own message is in the problem."""

    exit_code = ExitCode.CHECKS_FAILED


class UsageError(NpuopsError):
    """Flags that do not go together."""

    exit_code = ExitCode.USAGE


class MeasurementError(NpuopsError):
    """A measurement ran and failed (a bench that completed no request): the thing measured is the problem."""

    exit_code = ExitCode.CHECKS_FAILED
