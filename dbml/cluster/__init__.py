"""Ray: where jobs run on a cluster (placement), its hub, workers, row shipping and DDP."""
