"""rollout.samples_per_prompt: G responses per prompt, each sample index from its own seeded sampler stream."""
import random

import pyarrow.parquet as pq
import pytest
from conftest import REVIEW_PROMPTS, tiny_review_policy

from pipeline.core import store
from pipeline.core.seeding import round_seed
from pipeline.model.policy import load_policy
from pipeline.model.sampling import sample_responses
from pipeline.steps.rollout import encode_query, response_limits, rollout, sample_seeds

PROMPTS = REVIEW_PROMPTS


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    return tiny_review_policy(tmp_path_factory)


def run(policy_dir, **kw):
    args = {"policy_dir": policy_dir, "policy_name": "base", "run_id": "t", "round_": 1, "seed": 0,
            "batch_size": 12, "max_new_tokens": 9, "generation_batch_size": 4}
    return rollout(PROMPTS, **{**args, **kw})


def test_sample_index_zero_keeps_the_round_sampler_seed_and_the_others_differ():
    seeds = sample_seeds(round_seed(0, 1, 2), 4)
    assert seeds[0] == round_seed(0, 1, 2) and len(set(seeds)) == 4
    assert sample_seeds(123, 1) == [123]


def test_groups_are_consecutive_rows_of_one_prompt_with_their_indices(policy_dir):
    rows = run(policy_dir, samples_per_prompt=3, min_new_tokens=4)
    assert len(rows) == 12
    assert [r["group_index"] for r in rows] == [i // 3 for i in range(12)]
    assert [r["sample_index"] for r in rows] == [i % 3 for i in range(12)]
    assert [r["rollout_id"] for r in rows] == [f"r0001-{i:05d}" for i in range(12)]
    seeds = sample_seeds(round_seed(0, 1, 2), 3)
    for g in range(4):
        group = rows[3 * g : 3 * g + 3]
        assert len({r["prompt_id"] for r in group}) == 1 and len({tuple(r["query_ids"]) for r in group}) == 1
        assert [r["seed"] for r in group] == seeds
    assert len({r["prompt_id"] for r in rows}) == 4  # four distinct prompts picked
    assert len({tuple(r["response_ids"]) for r in rows}) > 6  # the samples of a group differ
    assert run(policy_dir, samples_per_prompt=3, min_new_tokens=4) == rows  # deterministic


def test_a_batch_that_is_not_whole_groups_is_refused(policy_dir):
    with pytest.raises(ValueError, match="rollout.batch_size = 12 is not a whole number of groups of "
                                         "rollout.samples_per_prompt = 5"):
        run(policy_dir, samples_per_prompt=5)


def test_one_sample_per_prompt_writes_the_plain_schema_and_groups_add_two_columns(policy_dir, tmp_path):
    plain = run(policy_dir)
    store.write_table(plain, "rollouts", tmp_path / "plain")
    assert pq.read_schema(tmp_path / "plain" / "part-0.parquet").names == store.SCHEMAS["rollouts"].names
    grouped = run(policy_dir, samples_per_prompt=2)
    store.write_table(grouped, "rollouts", tmp_path / "grouped")
    names = pq.read_schema(tmp_path / "grouped" / "part-0.parquet").names
    assert names == store.SCHEMAS["rollouts"].names + ["group_index", "sample_index"]
    with pytest.raises(store.StoreError, match="missing"):
        store.write_table(grouped[:1] + plain[:1], "rollouts", tmp_path / "mixed")


def test_duckdb_reads_plain_and_grouped_rounds_together(policy_dir, tmp_path):
    store.write_table(run(policy_dir), "rollouts", store.partition_dir(tmp_path, "rollouts", 1))
    store.write_table(run(policy_dir, round_=2, samples_per_prompt=2), "rollouts",
                      store.partition_dir(tmp_path, "rollouts", 2))
    counts = store.connect(tmp_path).execute(
        "SELECT round, count(*), count(group_index), max(sample_index) FROM rollouts GROUP BY round ORDER BY round"
    ).fetchall()
    assert counts == [(1, 12, 0, None), (2, 12, 12, 1)]


def test_one_sample_per_prompt_samples_as_drlc_did_before_group_sampling(policy_dir, tmp_path):
    """G = 1 (the default, or set) is the sampler call drlc made before groups existed: the round's prompts picked
    with round_seed(seed, r, 1), one sample_responses call seeded round_seed(seed, r, 2), each response cut at its
    limit from round_seed(seed, r, 3). Both paths run here, on this CPU: no digest recorded on another machine."""
    policy, tokenizer = load_policy(policy_dir)
    train = [row for row in PROMPTS if row["split"] == "train"]
    for lengths in ({}, {"min_new_tokens": 4}):
        chosen = random.Random(round_seed(0, 1, 1)).sample(train, 12)
        queries = [encode_query(tokenizer, row["text"]) for row in chosen]
        before = sample_responses(policy, queries=queries, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
                                  max_new_tokens=9, seed=round_seed(0, 1, 2), batch_size=4, progress=False)
        limits = response_limits(12, min_new_tokens=lengths.get("min_new_tokens"), max_new_tokens=9,
                                 seed=round_seed(0, 1, 3))
        tables = []
        for group in ({}, {"samples_per_prompt": 1}):
            rows = run(policy_dir, **lengths, **group)
            assert [r["prompt_id"] for r in rows] == [r["prompt_id"] for r in chosen]
            assert [r["response_ids"] for r in rows] == [s["response_ids"][:n] for s, n in zip(before, limits)]
            assert [r["behaviour_logprobs"] for r in rows] == [s["behaviour_logprobs"][:n] for s, n in zip(before, limits)]
            assert {r["seed"] for r in rows} == {round_seed(0, 1, 2)}
            written = store.write_table(rows, "rollouts", tmp_path / str(len(lengths)) / str(len(group)))
            tables.append(written.read_bytes())
        assert tables[0] == tables[1]  # the default and an explicit G = 1 write the same bytes
