"""Reproducible measurements, one script each, writing JSON to benchmarks/results/.

A script imports the installed `pipeline` package (`pip install -e .`) and no other file of this
checkout, so `python benchmarks/<name>.py` runs it from anywhere. Two build a project with
tests/e2e.py and so run as modules from the checkout root: `python -m benchmarks.distill_check`,
`python -m benchmarks.replay_speed`. gpu_check.py runs each step in a child process whose PYTHONPATH
is the checkout, where the steps reuse ppo_update and gpu_memory. Tests import the scripts as
`benchmarks.<name>` (pyproject's pytest `pythonpath`).
"""
