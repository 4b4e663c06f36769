"""Environment rewards: one module per scorer, each scoring whole responses."""
