"""Planning a vLLM deployment for a model on Ascend (or CPU) hardware: pure functions, no I/O.

The only file access is reading a model directory that the caller passes to `load_model`; npuops.plan.request is
where a plan meets the machine it is asked on (the node's chips or the host's CPUs).
"""
