"""Doctor checks: one module per family of checks (see npuops.doctor for the model)."""
