"""Finding the checks: every Check subclass in the modules of npuops.checks (the top-level checks/ folder).

The checks are plugins of the doctor: they import npuops.doctor, never the reverse, so the package is loaded here by
name at run time (as entry points would be), not imported.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

from npuops.doctor.model import TAG_INSTANCE, TAGS, Check
from npuops.errors import BadInputError

CHECKS_PACKAGE = "npuops.checks"
# Tags whose checks only run when asked for (--only, --tag, the start gate), as ansible-lint's `opt-in` rules: an
# instance's checks have nothing to look at in a plain doctor run, whose report would carry their skips forever.
OPT_IN_TAGS = frozenset({TAG_INSTANCE})


def discover_checks() -> list[type[Check]]:
    """All checks, in module order then definition order; ids are unique and validated."""
    found: list[type[Check]] = []
    seen: dict[str, str] = {}
    package = importlib.import_module(CHECKS_PACKAGE)
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{CHECKS_PACKAGE}.{info.name}")
        members = [m for _, m in inspect.getmembers(module, inspect.isclass)
                   if issubclass(m, Check) and m is not Check and m.__module__ == module.__name__
                   and not inspect.isabstract(m)]
        members.sort(key=lambda m: inspect.getsourcelines(m)[1])
        for cls in members:
            cls.validate()
            if cls.id in seen:
                raise ValueError(f"check id {cls.id!r} defined in both {seen[cls.id]} and {module.__name__}")
            seen[cls.id] = module.__name__
            found.append(cls)
    return found


def checks_tagged(checks: list[type[Check]], *tags: str) -> list[type[Check]]:
    """The checks carrying any of these tags, in discovery order."""
    unknown = [t for t in tags if t not in TAGS]
    if unknown:
        raise BadInputError(f"no check tag {unknown[0]!r}",
                            f"use one of {', '.join(TAGS)} (`npuops doctor --list` shows each check's tags)")
    return [c for c in checks if set(c.tags) & set(tags)]


def select_checks(
    checks: list[type[Check]], level: int, only: list[str] | None, skip: list[str] | None,
    tags: list[str] | None = None,
) -> list[type[Check]]:
    known = {c.id for c in checks}
    for wanted in (only or []) + (skip or []):
        if wanted not in known:
            close = sorted(k for k in known if wanted.split("-")[0] in k)[:5]
            hint = f" (e.g. {', '.join(close)})" if close else ""
            raise BadInputError(f"no check with id {wanted!r}", f"use an id from `npuops doctor --list`{hint}")
    tagged = checks_tagged(checks, *tags) if tags else []
    if only or tags:
        # --only and --tag name checks explicitly: run them whatever their level or opt-in tag.
        selected = [c for c in checks if c.id in (only or []) or c in tagged]
    else:
        selected = [c for c in checks if c.level <= level and not OPT_IN_TAGS & set(c.tags)]
    return [c for c in selected if c.id not in (skip or [])]
