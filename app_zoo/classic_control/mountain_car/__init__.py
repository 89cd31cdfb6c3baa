"""MountainCarContinuous-v0: configs only (the env is gymnasium's, through env_type gym)."""
