"""The ground floor: params, errors, the Parquet store, checkpoints, seeds and devices. Imports nothing above it."""
