"""Room `nodes`: list, reboot, replace, health-check and scale the cluster's nodes; its events and operations."""
