"""Room `runs`: send a run config and submit its chain (or print it offline); compare runs, open TensorBoard."""
