"""Room `cluster`: check before a deploy, wait for the cluster, open a shell, move it to a new AMI, store secrets."""
