"""Running launched instances: the supervisor, the start gate, the service manager, status."""
