"""What every room of hpctl shares: errors, the project's settings, the AWS session and the deployed stack, its
cluster and its nodes' SSM sessions, prices, a run folder's progress, and the command registry. It imports no room."""
