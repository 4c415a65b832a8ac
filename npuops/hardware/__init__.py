"""The hardware boundary: running vendor tools, reading vendor files, and pure parsers of their output."""
