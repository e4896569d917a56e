"""Sharded checkpoints, Orbax-backed backups, and restoring values into a live model."""
