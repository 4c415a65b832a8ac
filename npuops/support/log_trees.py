"""CANN's and vllm-ascend's log trees as collect takes them: whose each tree is, where an instance's ascend_log_path
may lead, and which files of a tree go into a bundle.

collect runs as root; the engine's service user writes its own ~/ascend/log and wherever its engine logs. So:
- Each tree is one user's, and only the files that user owns are taken (`LogTree.owner`): root's ~/ascend/log and
  ASCEND_PROCESS_LOG_PATH (root's own environment) root's files, a service user's ~/ascend/log that user's. A file
  its user could not have written (/etc/shadow is root's) has no business in its logs.
- An instance's `ascend_log_path` (vllm-ascend's --additional-config key, default ~/ascend/log/vllm_ascend) is read
  from its vllm.yaml as YAML, then the additional config as JSON, that key only (`ascend_log_path`). npuops' launch
  never writes it (its table of vllm-ascend keys, npuops/data/additional_config.toml, lacks it, so launch refuses
  it): it is there only by an operator's hand. It is followed only below the service user's home (from the passwd
  file) or the instance's status directory, the places the engine, running as that user, can write, and only when
  the directory is that user's (`LogTree.top_owned`).
- Only log files: not empty, named *.log, *.txt, plog-*, device-* or rotated *.log.N (`is_log_name`).
- Each part of a tree (debug/plog, run/plog, each device-N, vllm_ascend, ...) is walked with its own budget and
  ranked on its own, newest first: 25,000 empty files in one part do not hide another's logs. A file dated in the
  future (beyond now + FUTURE_SLACK_S) ranks after every other: its date cannot be true. What a part leaves out
  (cut, older, another owner's, not a log, a link) is said, for the manifest.
"""

from __future__ import annotations

import fnmatch
import json
import stat
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import yaml

from npuops.safefiles import (
    ConfinedPath,
    FoundFile,
    NotRead,
    directory_entries,
    kind,
    printable,
    untrusted_absolute,
    walk_regular_files,
)

# CANN's logs: what `ascend/log` under a user's home holds (plog: the host processes' logs; device-N: the chips').
# vllm_ascend: vllm-ascend's own log files (its logger's default ~/ascend/log/vllm_ascend, from PR #10306).
ASCEND_LOG_PARTS = ("debug/plog", "run/plog", "debug/device-*", "run/device-*", "security/plog", "vllm_ascend")
LOG_NAMES = ("plog-*", "device-*", "*.log", "*.txt")  # and rotated logs, *.log.N
LOG_NAME_HELP = "*.log, *.txt, plog-*, device-*, *.log.N"
MAX_LOG_FILES = 40  # per part, newest first
# Entries one part may have looked at (its directories' together), and directories a glob part may match.
PART_WALK_ENTRIES = 20000
MAX_PART_DIRS = 64
MAX_REFUSED_LISTED = 20  # entries of a part that are not taken (links, FIFOs) named one by one, then counted
FUTURE_SLACK_S = 60.0  # clocks differ a little; a file dated later than this after now is not believed
CONFIG_READ_CAP = 2**20
ADDITIONAL_CONFIG_KEYS = ("additional-config", "additional_config")  # vLLM takes both spellings


@dataclass(frozen=True)
class LogTree:
    label: str  # ascend-logs/<label>/ in the bundle
    top: ConfinedPath
    parts: tuple[str, ...]  # the parts to take (directories, the last component may be a glob); () all of it
    origin: str  # whose logs they are, for the manifest
    owner: int  # the uid whose files are taken
    top_owned: bool = False  # the top itself must be the owner's (a directory a record's text names)


def is_log_name(name: str) -> bool:
    if any(fnmatch.fnmatchcase(name, pattern) for pattern in LOG_NAMES):
        return True
    stem, _, number = name.rpartition(".")
    return stem.endswith(".log") and number.isdigit() and len(number) <= 6


def ascend_log_path(config: bytes) -> str | None:
    """The `ascend_log_path` of vllm-ascend's additional config in an instance's vllm.yaml (None where it has
    none); ValueError says why the file cannot tell."""
    try:
        data = yaml.load(config.decode("utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506
    except UnicodeDecodeError:
        raise ValueError("its vllm.yaml is not UTF-8") from None
    except (yaml.YAMLError, RecursionError):
        raise ValueError("its vllm.yaml is not YAML") from None
    extra = next((data[k] for k in ADDITIONAL_CONFIG_KEYS if k in data), None) if isinstance(data, dict) else None
    if isinstance(extra, str):
        try:
            extra = json.loads(extra)
        except (ValueError, RecursionError):
            raise ValueError("the additional-config of its vllm.yaml is not JSON") from None
    path = extra.get("ascend_log_path") if isinstance(extra, dict) else None
    if path is not None and not isinstance(path, str):
        raise ValueError("the ascend_log_path of its vllm.yaml is not a string")
    return path


def confine_log_path(text: str, *, home: PurePosixPath | None, host_home: Path | None,
                     status_dir: ConfinedPath) -> ConfinedPath:
    """The directory an ascend_log_path names, confined below the service user's home (`home` on the host,
    `host_home` where npuops reads it) or the instance's status directory; NotRead says why not."""
    path = untrusted_absolute(text)
    status = PurePosixPath(str(status_dir))
    if path == status or status in path.parents:
        return ConfinedPath(status_dir.root, status_dir.relative / path.relative_to(status))
    if home is not None and host_home is not None and home != PurePosixPath("/") and \
            (path == home or home in path.parents):
        return ConfinedPath(host_home, path.relative_to(home))
    places = ([f"{home}, the service user's home"] if home is not None else []) + \
        [f"{status}, the instance's status directory"]
    raise NotRead(f"{printable(text)} is not under {' or '.join(places)}: the engine, running as its service user, "
                  "logs nowhere else")


@dataclass
class PartChoice:
    """The files of one part of a tree to take (relative to the tree's top) and what is said of the rest."""

    files: list[PurePosixPath] = field(default_factory=list)
    notes: list[tuple[str, str]] = field(default_factory=list)  # (what, why) for the manifest


def _part_dirs(tree: LogTree, part: str, choice: PartChoice) -> list[PurePosixPath]:
    """The directories of a part: itself, or those a glob in its last component matches (debug/device-*)."""
    head, _, last = part.rpartition("/")
    if not any(c in last for c in "*?["):
        return [PurePosixPath(part)]
    base = f"ascend-logs/{tree.label}/{head}".rstrip("/")
    try:
        entries, cut = directory_entries(tree.top / head, max_entries=PART_WALK_ENTRIES)
    except NotRead as exc:
        if not exc.missing:
            choice.notes.append((base, exc.reason))
        return []
    matched = sorted((name, mode) for name, mode in entries if fnmatch.fnmatchcase(name, last))
    for name, mode in matched:
        if stat.S_ISLNK(mode):
            choice.notes.append((f"{base}/{printable(name)}", f"{tree.top / head / name} is {kind(mode)}"))
    dirs = [PurePosixPath(head, name) for name, mode in matched if stat.S_ISDIR(mode)]
    if cut or len(dirs) > MAX_PART_DIRS:
        choice.notes.append((f"ascend-logs/{tree.label}/{part}", f"{tree.top / head} was cut: only the first "
                             f"{min(len(dirs), MAX_PART_DIRS)} directories of {len(entries)} entries were looked at"))
    return dirs[:MAX_PART_DIRS]


def _candidates(tree: LogTree, part: str, since: float, choice: PartChoice
                ) -> tuple[list[tuple[PurePosixPath, FoundFile]], list[tuple[PurePosixPath, str]], Counter[str]]:
    """The log files of a part modified since `since`, its entries that are not taken, and why others were not."""
    found: list[tuple[PurePosixPath, FoundFile]] = []
    refused: list[tuple[PurePosixPath, str]] = []
    left: Counter[str] = Counter()
    budget = PART_WALK_ENTRIES
    for directory in _part_dirs(tree, part, choice) if part else [PurePosixPath()]:
        what = "/".join((f"ascend-logs/{tree.label}", *map(printable, directory.parts)))
        if budget <= 0:
            choice.notes.append((what, f"{tree.top / directory} was not looked at: its part had "
                                       f"{PART_WALK_ENTRIES} entries before it"))
            continue
        try:
            walk = walk_regular_files(tree.top / directory, max_entries=budget)
        except NotRead as exc:
            if not exc.missing:
                choice.notes.append((what, exc.reason))
            continue
        budget -= walk.seen
        if tree.top_owned and walk.top_uid != tree.owner:
            choice.notes.append((what, f"{tree.top / directory} is owned by uid {walk.top_uid}, not by "
                                       f"{tree.origin} (uid {tree.owner}): not looked into"))
            continue
        refused += [(directory / relative, why) for relative, why in walk.refused]
        if walk.incomplete:
            choice.notes.append((what, f"{tree.top / directory} was cut: {walk.incomplete}"))
        for file in walk.files:
            reason = ("empty" if file.size == 0 else "owner" if file.uid != tree.owner else
                      "name" if not is_log_name(file.relative.name) else "old" if file.mtime < since else "")
            if reason:
                left[reason] += 1
            else:
                found.append((directory / file.relative, file))
    return found, refused, left


def choose_part(tree: LogTree, part: str, *, since: float, now: float | None = None) -> PartChoice:
    """The files of one part of a tree to take: its log files owned by the tree's user, modified since `since`, the
    newest MAX_LOG_FILES (one dated in the future last); each reason the others are not taken, counted."""
    now = time.time() if now is None else now
    choice = PartChoice()
    base = f"ascend-logs/{tree.label}" + (f"/{part}" if part else "")
    found, refused, left = _candidates(tree, part, since, choice)
    for relative, why in refused[:MAX_REFUSED_LISTED]:
        choice.notes.append((f"ascend-logs/{tree.label}/{printable(str(relative))}", f"{tree.top / relative} {why}"))
    if len(refused) > MAX_REFUSED_LISTED:
        choice.notes.append((base, f"{len(refused) - MAX_REFUSED_LISTED} more entries that are not regular files "
                                   "were left out"))
    future = now + FUTURE_SLACK_S
    found.sort(key=lambda item: (item[1].mtime > future, -item[1].mtime))
    suspect = sum(1 for _relative, file in found if file.mtime > future)
    if suspect:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(now))
        choice.notes.append((base, f"{suspect} files dated in the future (after {when}) ranked after the others: "
                                   "their dates cannot be true"))
    if len(found) > MAX_LOG_FILES:
        choice.notes.append((base, f"{len(found) - MAX_LOG_FILES} older log files left out (the newest "
                                   f"{MAX_LOG_FILES} are in)"))
    reasons = {"owner": f"not owned by {tree.origin} (uid {tree.owner}), who could not have written them",
               "name": f"not named like a log ({LOG_NAME_HELP})", "empty": "empty"}
    for reason, text in reasons.items():
        if left[reason]:
            choice.notes.append((base, f"{left[reason]} files {text} were left out"))
    choice.files = sorted(relative for relative, _file in found[:MAX_LOG_FILES])
    return choice
