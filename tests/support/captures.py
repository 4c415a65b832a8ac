"""Real recorded outputs (tests/fixtures/ascend), each file starting with its `# source:` line."""

from __future__ import annotations

from tests.support.paths import ASCEND_FIXTURES


def capture(name: str) -> str:
    """A real capture without its `# source:` line."""
    text = (ASCEND_FIXTURES / name).read_text(encoding="utf-8")
    first, _, rest = text.partition("\n")
    assert first.startswith("# source:"), f"{name} lacks its source line"
    return rest
