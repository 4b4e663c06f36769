"""Evaluation: metrics over sampled continuations and the run-level curves."""
