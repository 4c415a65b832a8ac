"""Helpers shared by the tests, one module per kind of thing (conftest.py files hold only fixtures that call these).

- paths: the repository, its fixture directories, the venv's own tools
- captures: real recorded outputs (tests/fixtures/ascend) without their `# source:` line
- fake_commands: a fake command runner for Probe, and fake tools on PATH that replay a capture
- host_tree: a host's file tree under a temp root (Settings.root), and an Ascend A2 node's files in it
- nodes: Node and PythonStack objects built without running a command
- instance_records: InstanceRecord objects as launch writes them
- http_server: a real HTTP server in a thread, free ports, a stdlib HTTP client
- model_dirs: small Hugging Face model directories (config.json, real safetensors)
- playbook_runs: recorded ansible-runner events and the PlaybookRun they fold into
- npuops_cli: this checkout's npuops run as a subprocess, indexed package directories
- vendor_installers: vendor-style Ascend `.run` installers built with makeself
- ssh_hosts: real sshd test hosts in network namespaces
- engine: `vllm serve` (the CPU engine) processes and the tiny demo model
- workspace: npuops launched on the real engine in a private state directory
"""
