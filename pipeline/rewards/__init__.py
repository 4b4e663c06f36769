"""Environment rewards: one module per scorer, each scoring whole responses in the task's own units.

Every reward class declares ``RANGE = (low, high)``: the bounds of its score, None where unbounded
(a logit, a reward model). No reward scales itself: ``score.scale`` and ``score.normalize`` apply
once, afterwards, in :mod:`pipeline.rewards.shaping`.
"""
