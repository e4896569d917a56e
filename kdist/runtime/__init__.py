"""What runs with the model: resharding, sweeps, checkpoints, backups, input pipelines, clusters and the launcher."""
