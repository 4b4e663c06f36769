"""Per-round curves from hand-built tables: every column checked against hand arithmetic."""
import pyarrow as pa
import pytest

from pipeline.evaluate.curves import CURVE_COLUMNS, round_curves
from pipeline.store import SCHEMAS, partition_dir, write_table


def _row(table: str, **values) -> dict:
    """A row of `table` with every column: the given values, else a zero/empty default."""
    defaults = {pa.string(): "", pa.int32(): 0, pa.int64(): 0, pa.float64(): 0.0, pa.bool_(): False}
    row = {f.name: defaults.get(f.type, []) for f in SCHEMAS[table]}
    row.update(run_id="t", **values)
    return row


@pytest.fixture
def data(tmp_path):
    # round 1: rewards -1, 0.5; both critiqued, one cached; token rewards [-0.5, 0.5, -0.5] and [0.5]; cost 0.1 + 0.2
    # round 2: rewards 1, 1; one critiqued, not cached; token rewards [] and [0.5, 0.5]; cost 0.4
    spec = {1: [(-1.0, True, True, [-0.5, 0.5, -0.5], 0.1), (0.5, True, False, [0.5], 0.2)],
            2: [(1.0, False, False, [], 0.0), (1.0, True, False, [0.5, 0.5], 0.4)]}
    for r, items in spec.items():
        write_table([_row("scores", round=r, rollout_id=f"{r}-{i}", env_reward=e) for i, (e, *_) in enumerate(items)],
                    "scores", partition_dir(tmp_path, "scores", r))
        write_table([_row("annotations", round=r, rollout_id=f"{r}-{i}", critiqued=c, cache_hit=h, token_rewards=t,
                          cost_usd=cost) for i, (_, c, h, t, cost) in enumerate(items)],
                    "annotations", partition_dir(tmp_path, "annotations", r))
        write_table([_row("ppo_steps", round=r, step=s, kl=kl, kl_coef=0.2) for s, kl in enumerate((0.1 * r, 0.3 * r))],
                    "ppo_steps", partition_dir(tmp_path, "ppo_steps", r))
    return tmp_path


def test_round_curves_by_hand(data):
    first, second = round_curves(data)
    assert set(first) == {"round", *CURVE_COLUMNS}
    assert first == pytest.approx({"round": 1, "env_reward_mean": -0.25, "intrinsic_reward_sum": (-0.5 + 0.5) / 2,
                                   "kl": 0.2, "kl_coef": 0.2, "critic_calls": 2, "cache_hits": 1,
                                   "cache_hit_rate": 0.5, "cost_usd": 0.3, "cost_usd_total": 0.3})
    assert second == pytest.approx({"round": 2, "env_reward_mean": 1.0, "intrinsic_reward_sum": (0.0 + 1.0) / 2,
                                    "kl": 0.4, "kl_coef": 0.2, "critic_calls": 1, "cache_hits": 0,
                                    "cache_hit_rate": 0.0, "cost_usd": 0.4, "cost_usd_total": 0.7})
