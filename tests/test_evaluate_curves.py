"""Per-round curves from hand-built tables: every column checked against hand arithmetic."""
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.core.errors import DataError
from pipeline.core.round_metrics import intrinsic_reward_sum
from pipeline.core.store import SCHEMAS, partition_dir, write_table
from pipeline.evaluate.curves import CURVE_COLUMNS, round_curves

# annotations gain `attempts` (HTTP attempts sent for the row in this run, 0 for a cache hit)
ANNOTATIONS = SCHEMAS["annotations"]
if "attempts" not in ANNOTATIONS.names:
    ANNOTATIONS = ANNOTATIONS.append(pa.field("attempts", pa.int64()))


def _row(schema: pa.Schema, **values) -> dict:
    """A row with every column of `schema`: the given values, else a zero/empty default."""
    defaults = {pa.string(): "", pa.int32(): 0, pa.int64(): 0, pa.float64(): 0.0, pa.bool_(): False}
    row = {f.name: defaults.get(f.type, []) for f in schema}
    row.update(run_id="t", **values)
    return row


def write_annotations(rows: list[dict], schema: pa.Schema, out_dir) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), out_dir / "part-0.parquet")


def build(root, schema=ANNOTATIONS):
    # round 1: rewards -1, 0.5; both critiqued, one cached (0 attempts), the other sent twice (a retry);
    #          token rewards [-0.5, 0.5, -0.5] and [0.5]; cost 0.1 + 0.2
    # round 2: rewards 1, 1; one critiqued, not cached, one attempt; token rewards [] and [0.5, 0.5]; cost 0.4
    spec = {1: [(-1.0, True, True, 0, [-0.5, 0.5, -0.5], 0.1), (0.5, True, False, 2, [0.5], 0.2)],
            2: [(1.0, False, False, 0, [], 0.0), (1.0, True, False, 1, [0.5, 0.5], 0.4)]}
    for r, items in spec.items():
        write_table([_row(SCHEMAS["scores"], round=r, rollout_id=f"{r}-{i}", env_reward=e, env_reward_shaped=10 * e)
                     for i, (e, *_) in enumerate(items)], "scores", partition_dir(root, "scores", r))
        rows = [_row(schema, round=r, rollout_id=f"{r}-{i}", critiqued=c, cache_hit=h, token_rewards=t, cost_usd=cost,
                     prompt_tokens=10 * (i + 1), completion_tokens=3,  # counted as critic_tokens when sent
                     **({"attempts": n} if "attempts" in schema.names else {}))
                for i, (_, c, h, n, t, cost) in enumerate(items)]
        write_annotations(rows, schema, partition_dir(root, "annotations", r))
        intrinsic = intrinsic_reward_sum([t for *_, t, _ in items])  # as the trainer logs it
        write_table([_row(SCHEMAS["ppo_steps"], round=r, step=s, kl=kl, kl_coef=0.2, intrinsic_reward_sum=intrinsic)
                     for s, kl in enumerate((0.1 * r, 0.3 * r))], "ppo_steps", partition_dir(root, "ppo_steps", r))
    return root


def test_round_curves_by_hand(tmp_path):
    first, second = round_curves(build(tmp_path))
    assert set(first) == {"round", *CURVE_COLUMNS}
    assert first == pytest.approx({"round": 1, "env_reward_mean": -0.25, "env_reward_shaped_mean": -2.5,
                                   "intrinsic_reward_sum": (-0.5 + 0.5) / 2,
                                   "kl": 0.2, "kl_coef": 0.2, "critiqued": 2, "critic_requests": 2, "cache_hits": 1,
                                   "cache_hit_rate": 0.5, "critic_tokens": 23, "critic_cost_usd": 0.3, "critic_cost_usd_total": 0.3})
    assert second == pytest.approx({"round": 2, "env_reward_mean": 1.0, "env_reward_shaped_mean": 10.0,
                                    "intrinsic_reward_sum": (0.0 + 1.0) / 2,
                                    "kl": 0.4, "kl_coef": 0.2, "critiqued": 1, "critic_requests": 1, "cache_hits": 0,
                                    "cache_hit_rate": 0.0, "critic_tokens": 23, "critic_cost_usd": 0.4, "critic_cost_usd_total": 0.7})


def test_annotations_without_attempts_are_an_error_not_zero_requests(tmp_path):
    without = pa.schema([f for f in ANNOTATIONS if f.name != "attempts"])
    with pytest.raises(DataError, match="no 'attempts' column.*critique"):
        round_curves(build(tmp_path, without))


def test_a_round_written_before_attempts_existed_is_named(tmp_path):
    build(tmp_path)
    old = pa.schema([f for f in ANNOTATIONS if f.name != "attempts"])
    write_annotations([_row(old, round=2, rollout_id="2-0")], old, partition_dir(tmp_path, "annotations", 2))
    with pytest.raises(DataError, match=r"rounds \[2\] have no 'attempts'"):
        round_curves(tmp_path)


@pytest.mark.parametrize("per_stage, every, expected", [(1, 1, [0, 1, 2, 3, 4]), (1, 3, [0, 3, 4]),
                                                        (2, 1, [0, 2, 4]), (4, 1, [0, 4])])
def test_the_eval_curve_visits_only_rounds_that_leave_a_policy(tmp_path, per_stage, every, expected):
    """A chunk of K rounds writes models/round=<its last> only, though params.rounds lists every round of it."""
    from e2e import dump_params, tiny_params

    from pipeline.commands.rounds import chunk_chain
    from pipeline.core.config import load_params
    from pipeline.steps.evaluate import curve_rounds

    raw = tiny_params(n_rounds=4)
    raw["evaluate"]["every"] = every
    if per_stage > 1:
        raw["run"]["rounds_per_stage"], raw["chunks"], raw["rounds"] = per_stage, chunk_chain(4, per_stage), {}
    (tmp_path / "params.yaml").write_text(dump_params(raw))
    params = load_params(tmp_path / "params.yaml")
    assert len(params.rounds) == 4  # every round, also when chunked
    assert curve_rounds(params.evaluate, params.rounds, params.chunks, params.switch) == expected
