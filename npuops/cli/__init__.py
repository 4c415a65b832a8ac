"""The click layer: parses flags, builds Settings, calls the core, prints, exits. Nothing else."""
