"""The doctor: the check model, discovery of checks in npuops.checks, running them, and reporting."""
