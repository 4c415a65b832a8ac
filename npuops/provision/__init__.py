"""Provisioning: the packages, the playbook run and its report."""
