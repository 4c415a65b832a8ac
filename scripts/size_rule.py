#!/usr/bin/env python3
"""The size rule of npuops' code (scripts/test.sh runs it): no function longer than 80 lines, no module longer than
600, in npuops/ and checks/. A function's length runs from its `def` to its last line (decorators, such as a
command's click options, are declarations, not logic); a module's is its line count. Long code is where a change
needs reading everything: split it by what it decides.

Usage: scripts/size_rule.py [ROOT]   (exit 1 and one line per offender when the rule is broken)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 600
TREES = ("npuops", "checks")


def offenders(root: Path) -> list[str]:
    found: list[str] = []
    for tree in TREES:
        for path in sorted((root / tree).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            where = path.relative_to(root)
            lines = len(text.splitlines())
            if lines > MAX_MODULE_LINES:
                found.append(f"{where}: module of {lines} lines (at most {MAX_MODULE_LINES})")
            for node in ast.walk(ast.parse(text, filename=str(where))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    first = node.lineno
                    length = (node.end_lineno or first) - first + 1
                    if length > MAX_FUNCTION_LINES:
                        found.append(f"{where}:{first}: function {node.name} of {length} lines "
                                     f"(at most {MAX_FUNCTION_LINES})")
    return found


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    found = offenders(root)
    for line in found:
        print(f"size rule: {line}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
