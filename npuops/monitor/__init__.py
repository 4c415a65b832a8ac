"""What Prometheus needs to watch a node's instances: scrape targets from the instance records, recording and alert
rules (npuops.monitor.rules), the metric names they read and who exposes each (npuops.monitor.sources)."""
