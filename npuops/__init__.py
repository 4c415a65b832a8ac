"""npuops: operations toolkit for LLM inference on Huawei Ascend NPU servers."""

__version__ = "0.1.0"
