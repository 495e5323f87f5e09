"""Room `observe`: what the cluster and its runs are doing (status, lifecycle and step logs, metrics, dashboards)."""
