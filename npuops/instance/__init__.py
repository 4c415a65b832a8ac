"""Instances: what `npuops launch` puts on a node, below both the launch that writes it and the service that runs it.

The record and its file names, the supervisor's state, the service manager, the endpoint client, the Ray cluster
probe and the status an operator reads. Nothing here imports launch, service, fleet or the CLI.
"""
