"""The rollout sampler protocol (pipeline/model/sampler.py): drlc's HF sampler and an engine sample through it."""
import pytest
from conftest import REVIEW_PROMPTS, tiny_review_policy

from pipeline.core import store
from pipeline.core.seeding import round_seed
from pipeline.model.policy import load_policy
from pipeline.model.sampler import HFSampler, RolloutSampler, as_sampler
from pipeline.model.sampling import sample_responses
from pipeline.model.vllm_engine import VLLMEngine
from pipeline.parallel.shard import batch_seed
from pipeline.steps.rollout import encode_query, response_limits, sample_rollouts, sample_seeds

CHOSEN = REVIEW_PROMPTS[:3]
ROUND, SEED, MAX_NEW, MIN_NEW = 2, 5, 9, 3


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return load_policy(tiny_review_policy(tmp_path_factory))


def rollouts(sampler, tokenizer, group, **kw):
    return sample_rollouts(sampler, tokenizer, CHOSEN, policy_name="p", run_id="t", round_=ROUND, seed=SEED,
                           max_new_tokens=MAX_NEW, generation_batch_size=2, min_new_tokens=MIN_NEW, progress=False,
                           samples_per_prompt=group, **kw)


class FakeEngine:
    """A deterministic engine implementing RolloutSampler: row i's tokens count up from its request seed."""

    def __init__(self, vocab: int):
        self.vocab = vocab

    def sample_rows(self, queries, *, seeds, limits, eos_id, pad_id):
        group = len(seeds)
        rows = []
        for i, limit in enumerate(limits):
            seed = seeds[i % group] * 1000 + i // group
            ids = [(seed + len(queries[i // group]) + j) % self.vocab for j in range(limit)]
            logprobs = [-0.25 * (j + 1) for j in range(limit)]
            rows.append({"response_ids": ids, "behaviour_logprobs": logprobs, "engine_logprobs": logprobs,
                         "seed": seed})
        return rows

    def sampler_info(self):
        return {"device": "fake:0", "engine": "fake", "processes": 1}


@pytest.mark.parametrize("group", [1, 2])
def test_hf_rows_are_sample_responses_per_stream_cut_to_each_limit(policy, group):
    policy, tokenizer = policy
    queries = [encode_query(tokenizer, row["text"]) for row in CHOSEN]
    seeds = sample_seeds(round_seed(SEED, ROUND, 2), group)
    limits = response_limits(len(CHOSEN) * group, min_new_tokens=MIN_NEW, max_new_tokens=MAX_NEW,
                             seed=round_seed(SEED, ROUND, 3))
    by_stream = [sample_responses(policy, queries=queries, eos_id=tokenizer.eos_token_id,
                                  pad_id=tokenizer.pad_token_id, max_new_tokens=MAX_NEW, seed=s, batch_size=2,
                                  progress=False) for s in seeds]
    expected = [(by_stream[i % group][i // group]["response_ids"][:limit],
                 by_stream[i % group][i // group]["behaviour_logprobs"][:limit], seeds[i % group])
                for i, limit in enumerate(limits)]
    assert len(set(limits)) > 1 and max(limits) < MAX_NEW  # rows are cut, and the adapter samples to max(limits)

    adapter = HFSampler(policy, batch_size=2, progress=False)
    assert isinstance(adapter, RolloutSampler)
    direct = adapter.sample_rows(queries, seeds=seeds, limits=limits, eos_id=tokenizer.eos_token_id,
                                 pad_id=tokenizer.pad_token_id)
    assert [(s["response_ids"], s["behaviour_logprobs"], s["seed"]) for s in direct] == expected

    for given in (policy, adapter):  # a bare torch policy is wrapped the same way
        rows, metrics = rollouts(given, tokenizer, group)
        assert [(r["response_ids"], r["behaviour_logprobs"], r["seed"]) for r in rows] == expected
        assert [r["max_new_tokens"] for r in rows] == limits
        assert all("engine_logprobs" not in r for r in rows)
        assert (metrics["device"], metrics["processes"], "engine" in metrics) == ("cpu", 1, False)


def test_an_engine_implementing_the_protocol_writes_its_engine_logprobs(policy, tmp_path):
    _, tokenizer = policy
    engine = FakeEngine(len(tokenizer))
    assert as_sampler(engine, generation_batch_size=2) is engine
    rows, metrics = rollouts(engine, tokenizer, 2)
    seeds = sample_seeds(round_seed(SEED, ROUND, 2), 2)
    expected = engine.sample_rows([encode_query(tokenizer, r["text"]) for r in CHOSEN], seeds=seeds,
                                  limits=[r["max_new_tokens"] for r in rows], eos_id=None, pad_id=None)
    assert [r["engine_logprobs"] for r in rows] == [s["engine_logprobs"] for s in expected]
    assert [r["seed"] for r in rows] == [s["seed"] for s in expected]
    assert [r["response"] for r in rows] == [tokenizer.decode(s["response_ids"], skip_special_tokens=True)
                                             for s in expected]
    assert (metrics["device"], metrics["engine"], metrics["rows"]) == ("fake:0", "fake", 6)
    store.write_table(rows, "rollouts", tmp_path)  # the declared optional column, float32 lists
    read = store.read_table(tmp_path, "rollouts")
    assert [r["engine_logprobs"] for r in read] == [r["engine_logprobs"] for r in rows]


class ScriptedVLLM(VLLMEngine):
    """VLLMEngine's own sample_rows / sampler_info over a scripted `sample` (vLLM is not installed here)."""

    def __init__(self):
        self.requests = []

    @property
    def device(self):
        return "cpu"

    def sample(self, queries, *, limits, seeds, eos_id):
        self.requests.append((queries, limits, seeds, eos_id))
        return [{"response_ids": [seed % 7] * limit, "engine_logprobs": [-1.5] * limit}
                for seed, limit in zip(seeds, limits)]


def test_vllm_engine_sends_one_request_per_row_seeded_per_prompt(policy):
    _, tokenizer = policy
    engine = ScriptedVLLM()
    assert isinstance(engine, RolloutSampler)
    rows, metrics = rollouts(engine, tokenizer, 2)
    seeds = sample_seeds(round_seed(SEED, ROUND, 2), 2)
    (queries, limits, request_seeds, eos_id), = engine.requests
    assert request_seeds == [batch_seed(seeds[i % 2], i // 2) for i in range(6)]
    assert queries == [encode_query(tokenizer, CHOSEN[i // 2]["text"]) for i in range(6)]
    assert (limits, eos_id) == ([r["max_new_tokens"] for r in rows], tokenizer.eos_token_id)
    assert [r["seed"] for r in rows] == request_seeds
    assert all(r["behaviour_logprobs"] == r["engine_logprobs"] == [-1.5] * r["max_new_tokens"] for r in rows)
    assert {k: metrics[k] for k in ("device", "engine", "processes")} == {"device": "cpu", "engine": "vllm",
                                                                           "processes": 1}


@pytest.mark.parametrize("given", [object(), "models/base"])
def test_neither_a_policy_nor_a_sampler_is_a_type_error_naming_both(policy, given):
    with pytest.raises(TypeError, match=rf"got a builtins\.{type(given).__name__}: expected a torch policy "
                                        r"\(torch\.nn\.Module\) or a rollout sampler .*RolloutSampler"):
        rollouts(given, policy[1], 1)


def test_a_sampler_returning_the_wrong_row_count_stops(policy):
    class Short(FakeEngine):
        def sample_rows(self, queries, **kw):
            return super().sample_rows(queries, **kw)[:-1]

    with pytest.raises(ValueError, match="returned 5 samples for 6 rows"):
        rollouts(Short(10), policy[1], 2)
