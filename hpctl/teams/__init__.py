"""Room `teams`: the cluster's users and teams, and the node-hours and cost each used."""
