"""Check ids and tags: the model holds tags to its vocabulary, and every check id npuops names anywhere (a remediation's
`npuops doctor --only ...`, an `--explain ID`, a "gate:<id>" diagnosis, a docs path, a playbook's argv, the README,
the pages of docs/ and the examples) is the id of a check that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from npuops.doctor.context import CheckContext
from npuops.doctor.model import TAG_VERIFY, TAGS, Check, Result, Severity
from npuops.doctor.registry import OPT_IN_TAGS, checks_tagged, discover_checks, select_checks
from npuops.errors import BadInputError
from tests.support.paths import REPO

_ID = r"[a-z0-9]+(?:-[a-z0-9]+)*"
_IDS = rf"{_ID}(?:,{_ID})*"
# Between a flag and its value: spaces or a line break, `=`, or the quotes that join two strings (Python's implicit
# concatenation across lines, a YAML or JSON argv list: "--only", "a,b").
_SEP = r"""(?:[\s=]|"\s*,?\s*"|'\s*,?\s*')+"""
_END = r"(?![A-Za-z0-9_{<-])"
# A flag is a command's when `doctor` comes before it on its line or it opens a code span: prose about `--only`
# ("--only and --tag name checks") is not a command.
NAMED_ID_PATTERNS = (
    re.compile(rf"(?:\bdoctor\b[^`\n]*?|`)--(?:only|skip|explain){_SEP}({_IDS}){_END}"),
    re.compile(rf"\bgate:({_ID}){_END}"),
    re.compile(rf"\bchecks/docs/({_ID})\.md\b"),
)
# What npuops ships or runs, and what documents it: its code, its data, the check pages, the templates and playbooks,
# scripts, the README, docs/ and examples/.
SCANNED = ("npuops", "checks", "templates", "playbooks", "scripts", "docs", "examples")
SCANNED_SUFFIXES = {".py", ".toml", ".md", ".yml", ".yaml", ".j2", ".sh", ".json", ".cfg", ".service"}


def named_ids(text: str) -> list[tuple[int, str]]:
    """(line, id) for every check id the text names in one of the recognised forms. Pure."""
    found = []
    for pattern in NAMED_ID_PATTERNS:
        for match in pattern.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found += [(line, check_id) for check_id in match.group(1).split(",")]
    return sorted(found)


def scanned_files(root: Path) -> list[Path]:
    files = [root / "README.md"]
    for tree in SCANNED:
        files += [p for p in sorted((root / tree).rglob("*")) if p.is_file() and p.suffix in SCANNED_SUFFIXES
                  and "__pycache__" not in p.parts]
    return files


def test_the_scan_recognises_each_form_and_not_prose() -> None:
    text = ("fix = \"see `npuops doctor --only stack-row,torch-npu-cann` and `npuops doctor --level 3 --only\n"
            "  op-precision`\"\n"
            "    \"(`npuops doctor --only \"\n"
            "    \"chip-ecc,chip-health-detail`)\"\n"
            "argv: [\"npuops\", \"doctor\", \"--level\", \"2\", \"--only\",\n"
            "       \"host-peer-reach,npu-peer-ping\", \"--json\"]\n"
            "`--explain ray-cluster`, `npuops doctor --skip=hbm-free`, gate:port-free, checks/docs/shm-size.md\n"
            "# --only and --tag name checks explicitly; `npuops doctor --explain ID`, `--only {check_cls.id}`, "
            "`npuops doctor --only <id>`, gate:{first.check_id}\n")
    assert named_ids(text) == [
        (1, "op-precision"), (1, "stack-row"), (1, "torch-npu-cann"), (3, "chip-ecc"), (3, "chip-health-detail"),
        (5, "host-peer-reach"), (5, "npu-peer-ping"), (7, "hbm-free"), (7, "port-free"), (7, "ray-cluster"),
        (7, "shm-size")]


def test_every_check_id_npuops_names_exists() -> None:
    known = {c.id for c in discover_checks()}
    files = scanned_files(REPO)
    named: dict[str, set[str]] = {}
    unknown = []
    for path in files:
        for line, check_id in named_ids(path.read_text(encoding="utf-8", errors="replace")):
            named.setdefault(check_id, set()).add(str(path.relative_to(REPO)))
            if check_id not in known:
                unknown.append(f"{path.relative_to(REPO)}:{line}: no check {check_id!r}")
    assert not unknown, "\n".join(unknown)
    # The scan reads what it should: the data file's remediation, the playbook's argv, a check's own text.
    assert "npuops/data/failure_signatures.toml" in named["hccn-net-health"]
    assert "playbooks/launch-group.yml" in named["host-peer-reach"]
    assert "npuops/doctor/common.py" in named["npu-smi-runs"]
    assert "docs/doctor.md" in named["hbm-free"]


def test_every_tag_selects_a_check_and_verify_exactly_one() -> None:
    checks = discover_checks()
    for tag in TAGS:
        assert checks_tagged(checks, tag), f"no check carries the tag {tag!r}"
    assert [c.id for c in checks_tagged(checks, TAG_VERIFY)] == ["served-precision"]
    assert OPT_IN_TAGS <= set(TAGS)


def _check(**attributes: object) -> type[Check]:
    def run(self: Check, ctx: CheckContext) -> Result:
        return Result.passed("ok")

    body: dict[str, object] = {"__doc__": "A check for the model's rules.", "id": "test-tags", "area": "test",
                               "severity": Severity.LOW, "run": run, **attributes}
    return type("TaggedCheck", (Check,), body)


@pytest.mark.parametrize(("tags", "problem"), [
    (("Gate",), "not kebab-case"),
    (("gate_npu",), "not kebab-case"),
    (("gaet",), "not one of"),
    (("gate", "gate"), "distinct"),
    (["gate"], "not a tuple"),
])
def test_the_model_rejects_a_bad_tag(tags: object, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        _check(tags=tags).validate()
    _check(tags=("gate", "instance")).validate()


def test_select_by_tag_and_opt_in() -> None:
    checks = discover_checks()
    default = {c.id for c in select_checks(checks, 3, None, None)}
    instance_checks = {c.id for c in checks if OPT_IN_TAGS & set(c.tags)}
    assert instance_checks == {"engine-executable", "model-directory", "port-free", "ray-cluster", "pd-kv-ports",
                               "pd-mooncake", "pd-npu-nics", "cpu-compiler"}
    # A plain run (any level) leaves the opt-in checks out; --tag and --only reach them whatever their level.
    assert not default & instance_checks
    assert {c.id for c in select_checks(checks, 1, None, None, ["instance"])} == instance_checks
    assert [c.id for c in select_checks(checks, 1, ["port-free"], None)] == ["port-free"]
    assert [c.id for c in select_checks(checks, 1, None, None, ["verify"])] == ["served-precision"]
    assert "hbm-free" not in {c.id for c in select_checks(checks, 1, None, ["hbm-free"], ["gate-npu"])}
    with pytest.raises(BadInputError, match="no check tag 'gaet'"):
        select_checks(checks, 1, None, None, ["gaet"])
