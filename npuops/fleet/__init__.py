"""Ansible machinery: run shipped playbooks on a fleet through ansible-runner and read back typed results.

`runner.run_playbook` is the one way npuops runs Ansible (provision, fleet doctor, node facts);
`facts.collect_node_models` reads every host's node model. Neither imports ansible_runner until
a playbook actually runs.
"""
