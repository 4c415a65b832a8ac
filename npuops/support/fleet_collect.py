"""`npuops collect -i INVENTORY [--group G]`: one bundle with every host's part.

Each host runs `npuops collect` itself (playbooks/collect-bundle.yml: its own node model, doctor, journals and
logs, redacted there with its own secrets), the controller fetches the host's bundle, and the parts are put into
one bundle under hosts/<host>/ with the hosts' manifests; a host that could not be reached or failed is listed
with why and the fix. The controller's redactor passes every file once more (the keys it knows: none of a remote
host's, so the host's own redaction is what protects those).
"""

from __future__ import annotations

import json
import tarfile
import tempfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npuops.fleet.events import PlaybookEvent
from npuops.fleet.facts import FIX_UNREACHABLE, failure_fix
from npuops.fleet.inventory import read_inventory_group
from npuops.fleet.runner import run_playbook
from npuops.safefiles import printable
from npuops.support.bundle import Bundle, read_bundle
from npuops.support.redact import Redactor

COLLECT_PLAYBOOK = "collect-bundle.yml"


@dataclass(frozen=True)
class HostPart:
    host: str
    status: str  # ok, unreachable, failed
    message: str = ""
    fix: str = ""
    files: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"host": self.host, "status": self.status, "message": self.message, "fix": self.fix,
                "files": self.files}


def hosts_limit(inventory: Path, group: str | None, limit: str | None) -> str:
    """The hosts a fleet collect works on: the group's (in the inventory's order), else --limit, else all."""
    if group:
        return ",".join(h.name for h in read_inventory_group(inventory, group))
    return limit or "all"


def collect_fleet(inventory: Path, limit: str, collect_args: Sequence[str], *, artifacts_dir: Path, forks: int,
                  bundle_cap: int, on_event: Callable[[PlaybookEvent], None] | None = None
                  ) -> tuple[Bundle, list[HostPart]]:
    """Every host's bundle, fetched and put into one."""
    bundle = Bundle(Redactor(), bundle_cap=bundle_cap)
    parts: list[HostPart] = []
    with tempfile.TemporaryDirectory(prefix="npuops-collect-") as dest:
        run = run_playbook(COLLECT_PLAYBOOK, inventory=inventory, artifacts_dir=artifacts_dir, limit=limit,
                           extravars={"npuops_collect_args": list(collect_args), "npuops_collect_dest": dest},
                           forks=forks, on_event=on_event)
        for host, result in sorted(run.hosts.items()):
            fetched = Path(dest) / f"{host}.tar.gz"
            if result.status == "unreachable":
                parts.append(HostPart(host, "unreachable", result.message or "unreachable", FIX_UNREACHABLE))
            elif result.status == "failed" or not fetched.is_file():
                parts.append(HostPart(host, "failed", result.message or "no bundle came back",
                                      failure_fix(result)))
            else:
                parts.append(_merge(bundle, host, fetched))
    for part in parts:
        if part.status != "ok":
            bundle.skip(f"hosts/{part.host}", f"{part.status}: {part.message} ({part.fix})")
    bundle.meta.update({"hosts": [p.as_dict() for p in parts]})
    return bundle, parts


def _merge(bundle: Bundle, host: str, fetched: Path) -> HostPart:
    """A host's bundle into hosts/<host>/: what the host sent is read in bounded memory and its names escaped."""
    label = printable(host)
    if label in (".", "..") or "/" in label:
        return HostPart(host, "failed", f"the inventory name {label!r} cannot name a directory of the bundle",
                        "rename the host in the inventory (letters, digits, dots and dashes)")
    try:
        manifest, files = read_bundle(fetched, max_bytes=bundle.bundle_cap)
    except (OSError, EOFError, ValueError, KeyError, RecursionError, tarfile.TarError, zlib.error) as exc:
        return HostPart(host, "failed", f"its bundle is unreadable: {printable(str(exc))[:200]}",
                        "run `npuops collect` on the host to see the problem there")
    listed = manifest.get("files")
    sources = {str(f.get("path")): str(f.get("source")) for f in (listed if isinstance(listed, list) else [])
               if isinstance(f, dict)}
    added = int(bundle.add(f"hosts/{label}/manifest.json", json.dumps(manifest, indent=1) + "\n",
                           f"{label}: its bundle's manifest"))
    for path, data in sorted(files.items()):
        added += bundle.add(f"hosts/{label}/{printable(path)}", data,
                            f"{label}: {printable(sources.get(path, path))}")
    skipped_items = manifest.get("skipped")
    for skipped in skipped_items if isinstance(skipped_items, list) else []:
        if isinstance(skipped, dict):
            bundle.skip(f"hosts/{label}/{printable(str(skipped.get('what')))}", printable(str(skipped.get("why"))))
    return HostPart(host, "ok", files=added)
