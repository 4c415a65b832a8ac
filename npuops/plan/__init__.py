"""Planning a vLLM deployment for a model on Ascend (or CPU) hardware: pure functions, no I/O."""
