"""Environment rewards: one module per scorer, each scoring whole responses.

Every reward class declares ``RANGE = (low, high)``: the bounds of its score before ``scale``,
None where unbounded (a logit, a reward model); a task's ``reward_range`` scales them.
"""


def scaled_range(bounds: tuple[float | None, float | None], scale: float) -> tuple[float | None, float | None]:
    """A reward class's RANGE times its (positive) scale; None stays None (unbounded)."""
    return tuple(None if bound is None else scale * bound for bound in bounds)
