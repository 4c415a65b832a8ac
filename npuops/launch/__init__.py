"""Launch: render a plan into files (vLLM config, environment, systemd unit) and, later, run them."""
