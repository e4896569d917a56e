"""Multi-process runs: joining a cluster engine's job (`initialize`) and kdist's one-machine launcher."""
