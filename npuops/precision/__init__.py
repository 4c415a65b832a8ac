"""Numerical precision: of the kernels on this node (operators) and of the model a service returns (served)."""
