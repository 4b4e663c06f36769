"""pipeline.train.trainer.train_round on a real tiny GPT-2 (1 layer, 32 wide, vocab 64)."""
import dataclasses
import importlib
import re
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from pipeline.core.config import PPOParams
from pipeline.core.errors import DataError, PPOInputError
from pipeline.model.logprobs import response_logprobs
from pipeline.model.policy import PolicyWithValueHead, _fresh_value_head, frozen_copy
from pipeline.model.sampling import sample_responses
from pipeline.parallel.single import clip_grad_norm
from pipeline.train.ppo import AdaptiveKLController, FixedKLController, RunningMoments
from pipeline.train.trainer import RolloutBatch, load_trainer_state, make_optimizer, save_trainer_state, train_round

torch.set_num_threads(1)
EOS, PAD = 1, 0
GOOD = range(2, 18)  # the toy task rewards tokens 2..17 (a quarter of the vocabulary)
QUERIES = [[2 + i % 5, 3] for i in range(32)]
STEP_KEYS = {
    "policy_loss", "value_loss", "approx_kl", "policy_kl", "clipfrac", "vf_clipfrac",
    "entropy", "ratio_mean", "skipped", "grad_norm", "lr", "epoch", "tokens_per_s",
    "kl", "kl_coef", "env_reward_shaped_mean", "intrinsic_reward_sum",
    "behaviour_logprob_gap",
}


def tiny_policy(seed=0):
    torch.manual_seed(seed)
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=64,
                        bos_token_id=EOS, eos_token_id=EOS, pad_token_id=PAD)
    return PolicyWithValueHead(GPT2LMHeadModel(config), _fresh_value_head(32, seed)).eval()


def toy_params(**overrides):
    return PPOParams(**{"learning_rate": 3e-3, "mini_batch_size": 8, "init_kl_coef": 0.01, **overrides})


def rollout(policy, seed, intrinsic_fn=None):
    out = sample_responses(policy, queries=QUERIES, eos_id=EOS, pad_id=PAD, max_new_tokens=8, seed=seed,
                           batch_size=32, progress=False)
    responses = [o["response_ids"] for o in out]
    intrinsic_fn = intrinsic_fn or (lambda ids: [0.0] * len(ids))
    return RolloutBatch(
        query_ids=QUERIES, response_ids=responses, behaviour_logprobs=[o["behaviour_logprobs"] for o in out],
        env_rewards=[sum(t in GOOD for t in r) / len(r) for r in responses],
        intrinsic_rewards=[intrinsic_fn(r) for r in responses],
    )


def run_round(policy, ref, optimizer, batch, params, seed=0, kl_controller=None, moments=None):
    kl_controller = kl_controller or AdaptiveKLController(params.init_kl_coef, params.target, params.horizon)
    return train_round(policy=policy, ref_model=ref, optimizer=optimizer, batch=batch, params=params,
                       kl_controller=kl_controller, score_moments=moments or RunningMoments(), seed=seed,
                       progress=False)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_rounds_raise_the_reward_on_a_toy_task(precision):
    policy = tiny_policy()
    ref, params = frozen_copy(policy), toy_params(mixed_precision=precision)
    optimizer, controller, moments = make_optimizer(policy, params.learning_rate), None, RunningMoments()
    controller = AdaptiveKLController(params.init_kl_coef, params.target, params.horizon)
    means = []
    for r in range(8):
        batch = rollout(policy, seed=r)
        means.append(sum(batch.env_rewards) / len(batch.env_rewards))
        steps = run_round(policy, ref, optimizer, batch, params, seed=r, kl_controller=controller, moments=moments)
        assert len(steps) == params.ppo_epochs * 32 // params.mini_batch_size
    final = rollout(policy, seed=100)
    assert sum(final.env_rewards) / 32 > means[0] + 0.15, means


def test_first_minibatch_ratio_is_one_and_stats_keys_present():
    policy = tiny_policy()
    batch = rollout(policy, seed=0)
    steps = run_round(policy, frozen_copy(policy), make_optimizer(policy, 3e-3), batch, toy_params())
    assert set(steps[0]) == STEP_KEYS
    assert steps[0]["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert steps[0]["policy_kl"] == pytest.approx(0.0, abs=1e-5)
    assert steps[0]["behaviour_logprob_gap"] < 1e-5
    assert steps[0]["kl"] == pytest.approx(0.0, abs=1e-4)  # policy == reference
    assert [s["epoch"] for s in steps] == [e for e in range(4) for _ in range(4)]
    assert steps[-1]["approx_kl"] > 0


def mean_logprob_of_good_tokens(policy, batch):
    with torch.no_grad():
        out = response_logprobs(policy, query_ids=batch.query_ids, response_ids=batch.response_ids, pad_id=PAD)
    logprobs, mask = out.logprobs, out.mask
    ids = torch.tensor([r + [PAD] * (logprobs.shape[1] - len(r)) for r in batch.response_ids])
    good = ((ids >= 2) & (ids < 18)).float() * mask
    return (logprobs * good).sum().item() / good.sum().item()


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_intrinsic_reward_on_tokens_moves_their_probability(sign):
    """With zero env score and no KL, only the critic's token rewards drive the update."""
    policy = tiny_policy()
    batch = rollout(policy, seed=0, intrinsic_fn=lambda ids: [sign if t in GOOD else 0.0 for t in ids])
    batch = dataclasses.replace(batch, env_rewards=[0.0] * 32)
    before = mean_logprob_of_good_tokens(policy, batch)
    steps = run_round(policy, frozen_copy(policy), make_optimizer(policy, 3e-3), batch,
                      toy_params(init_kl_coef=0.0))
    after = mean_logprob_of_good_tokens(policy, batch)
    assert sign * (after - before) > 0.05
    expected_sum = sum(sum(row) for row in batch.intrinsic_rewards) / 32
    assert steps[0]["intrinsic_reward_sum"] == pytest.approx(expected_sum, abs=1e-5)
    assert steps[0]["env_reward_shaped_mean"] == 0.0


def test_same_seed_gives_identical_stats_and_weights():
    results = []
    for _ in range(2):
        policy = tiny_policy()
        batch = rollout(policy, seed=5)
        steps = run_round(policy, frozen_copy(policy), make_optimizer(policy, 3e-3), batch, toy_params(), seed=7)
        results.append(([{k: v for k, v in s.items() if k != "tokens_per_s"} for s in steps], policy))
    assert results[0][0] == results[1][0]
    for a, b in zip(results[0][1].parameters(), results[1][1].parameters()):
        assert torch.equal(a, b)


def test_ratio_threshold_skips_minibatches_without_updating():
    policy = tiny_policy()
    before = [p.detach().clone() for p in policy.parameters()]
    steps = run_round(policy, frozen_copy(policy), make_optimizer(policy, 3e-3), rollout(policy, 0),
                      toy_params(ratio_threshold=1e-3))
    assert all(s["skipped"] == 1 and s["grad_norm"] == 0.0 for s in steps)
    assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters()))


def test_gradient_accumulation_early_stop_and_full_kl():
    policy = tiny_policy()
    params = toy_params(mini_batch_size=4, gradient_accumulation_steps=2, kl_penalty="full", max_grad_norm=0.5)
    steps = run_round(policy, frozen_copy(policy), make_optimizer(policy, 3e-3), rollout(policy, 0), params)
    assert len(steps) == 4 * 32 // 8
    stopped = run_round(policy, frozen_copy(policy), make_optimizer(policy, 3e-1), rollout(policy, 1),
                        toy_params(early_stopping=True, target_kl=1e-6))
    assert len(stopped) < 16 and stopped[-1]["policy_kl"] > 1.5e-6


def test_kl_controller_updated_with_mean_summed_kl():
    policy = tiny_policy()
    ref = frozen_copy(tiny_policy(seed=1))  # a different reference: KL clearly non-zero
    params = toy_params(horizon=100.0)
    controller = AdaptiveKLController(params.init_kl_coef, params.target, params.horizon)
    steps = run_round(policy, ref, make_optimizer(policy, 3e-3), rollout(policy, 0), params, kl_controller=controller)
    kl = steps[0]["kl"]
    error = min(max(kl / params.target - 1, -0.2), 0.2)
    assert controller.value == pytest.approx(params.init_kl_coef * (1 + error * 32 / 100.0))
    assert steps[0]["kl_coef"] == params.init_kl_coef


def test_behaviour_logprob_gap_reports_corrupted_logprobs():
    policy = tiny_policy()
    batch = rollout(policy, 0)
    corrupted = [list(row) for row in batch.behaviour_logprobs]
    corrupted[3][0] -= 0.5
    steps = run_round(policy, frozen_copy(policy), make_optimizer(policy, 3e-3),
                      dataclasses.replace(batch, behaviour_logprobs=corrupted), toy_params())
    assert steps[0]["behaviour_logprob_gap"] == pytest.approx(0.5, abs=1e-4)


BAD_BATCHES = {
    "intrinsic_rewards has 1 values": lambda b: dataclasses.replace(
        b, intrinsic_rewards=[[0.0]] + b.intrinsic_rewards[1:]),
    "behaviour_logprobs has 1 values": lambda b: dataclasses.replace(
        b, behaviour_logprobs=[[-1.0]] + b.behaviour_logprobs[1:]),
    "env reward nan": lambda b: dataclasses.replace(b, env_rewards=[float("nan")] + b.env_rewards[1:]),
    "intrinsic_rewards contains NaN or inf": lambda b: dataclasses.replace(
        b, intrinsic_rewards=b.intrinsic_rewards[:-1] + [[float("inf")] * len(b.response_ids[-1])]),
    "empty": lambda b: RolloutBatch([], [], [], [], []),
    "not divisible": lambda b: RolloutBatch(*(None if getattr(b, f.name) is None else getattr(b, f.name)[:30]
                                              for f in dataclasses.fields(b))),  # None: engine_logprobs unset
    "env_rewards has 31 rows": lambda b: dataclasses.replace(b, env_rewards=b.env_rewards[:31]),
    "empty query or response": lambda b: dataclasses.replace(
        b, response_ids=[[]] + b.response_ids[1:], behaviour_logprobs=[[]] + b.behaviour_logprobs[1:],
        intrinsic_rewards=[[]] + b.intrinsic_rewards[1:]),
}


@pytest.mark.parametrize("message", list(BAD_BATCHES))
def test_malformed_batches_raise_before_touching_the_model(message):
    batch = BAD_BATCHES[message](rollout(tiny_policy(), 0))
    with pytest.raises(PPOInputError) as err:
        train_round(policy=None, ref_model=None, optimizer=None, batch=batch, params=toy_params(),
                    kl_controller=FixedKLController(0.1), score_moments=RunningMoments(), seed=0, progress=False)
    fragments = {"not divisible": "not divisible", "empty": "empty", "env reward nan": "not finite"}
    fragment = fragments.get(message, message)
    assert fragment in str(err.value)
    if message.startswith(("intrinsic_rewards has", "behaviour")):
        assert "Row 0" in str(err.value)


def test_trainer_state_round_trip(tmp_path):
    policy = tiny_policy()
    optimizer = make_optimizer(policy, 3e-3)
    controller, moments = AdaptiveKLController(0.2, 6.0, 100.0), RunningMoments()
    run_round(policy, frozen_copy(policy), optimizer, rollout(policy, 0), toy_params(use_score_scaling=True),
              kl_controller=controller, moments=moments)
    save_trainer_state(tmp_path, optimizer, controller, moments)
    optimizer2 = make_optimizer(policy, 3e-3)
    controller2, moments2 = AdaptiveKLController(1.0, 1.0, 1.0), RunningMoments()
    load_trainer_state(tmp_path, optimizer2, controller2, moments2)
    assert controller2.state_dict() == controller.state_dict()
    assert moments2.state_dict() == moments.state_dict() and moments.count == 32
    state, state2 = optimizer.state_dict()["state"], optimizer2.state_dict()["state"]
    assert all(torch.equal(state[k]["exp_avg"], state2[k]["exp_avg"]) for k in state)
    with pytest.raises(DataError, match="missing"):
        load_trainer_state(tmp_path / "nowhere", optimizer2, controller2, moments2)


def test_bf16_first_minibatch_ratio_is_one_within_bf16_rounding():
    """bf16 keeps 8 significant bits (unit roundoff u = 2⁻⁹ ≈ 2e-3). The toy logits are below 1 in
    magnitude, so a bf16 logit is off by ≲ 2u and log p = z − logsumexp(z) by ≲ 4u ≈ 8e-3 per token
    against the fp32 behaviour log-probs. policy_kl and ratio_mean − 1 are means of such errors,
    so |·| < 5e-3 holds with room (measured ≈ 1e-4); a wrong alignment or a stale old log-prob
    would be off by O(1). The gap must be > 0: it proves the pass really ran in bf16."""
    policy = tiny_policy()
    steps = run_round(policy, frozen_copy(policy), make_optimizer(policy, 3e-3), rollout(policy, seed=0),
                      toy_params(mixed_precision="bf16"))
    assert 0 < steps[0]["behaviour_logprob_gap"] < 1e-2
    assert steps[0]["policy_kl"] == pytest.approx(0.0, abs=5e-3)
    assert steps[0]["ratio_mean"] == pytest.approx(1.0, abs=5e-3)
    assert all(isinstance(v, (int, float)) and v == v for s in steps for v in s.values())  # finite, no NaN


DOCS = Path(__file__).resolve().parents[1] / "docs" / "ppo.md"
METRICS_DOC = DOCS.with_name("metrics.md")  # the logged names themselves: tests/test_metric_names.py


def test_every_function_named_in_docs_exists():
    names = set(re.findall(r"`(pipeline(?:\.\w+)+)`", DOCS.read_text() + METRICS_DOC.read_text()))
    assert len(names) >= 15, names
    for name in sorted(names):
        parts = name.split(".")
        for split in range(len(parts), 0, -1):  # longest importable module prefix, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:split]))
                break
            except ModuleNotFoundError:
                continue
        for attr in parts[split:]:
            assert hasattr(obj, attr), f"docs/ppo.md names {name}, but {attr} does not exist"
            obj = getattr(obj, attr)


@pytest.mark.parametrize("max_norm", [float("inf"), 1e9, 0.05])
def test_clip_grad_norm_equals_torch_clip_grad_norm_bit_for_bit(max_norm):
    """Same norm and same gradients as torch.nn.utils.clip_grad_norm_, clipping or not."""
    generator = torch.Generator().manual_seed(0)
    ours = [torch.zeros(5, 3, requires_grad=True), torch.zeros(7, requires_grad=True)]
    theirs = [torch.zeros_like(p, requires_grad=True) for p in ours]
    for p, q in zip(ours, theirs):
        p.grad = torch.randn(p.shape, generator=generator)
        q.grad = p.grad.clone()
    before = [p.grad.clone() for p in ours]
    norm = clip_grad_norm(ours, max_norm)
    assert norm == torch.nn.utils.clip_grad_norm_(theirs, max_norm).item()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(ours, theirs))
    clipped = not all(torch.equal(p.grad, b) for p, b in zip(ours, before))
    assert clipped == (norm > max_norm)
    assert clipped == (max_norm == 0.05)


def _adam_by_hand(params, grads_per_step, lr, betas=(0.9, 0.999), eps=1e-8):
    """Kingma & Ba's Adam with bias correction, one parameter tensor at a time, in float64."""
    params = [p.detach().double().clone() for p in params]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for t, grads in enumerate(grads_per_step, start=1):
        for i, g in enumerate(grads):
            g = g.double()
            m[i] = betas[0] * m[i] + (1 - betas[0]) * g
            v[i] = betas[1] * v[i] + (1 - betas[1]) * g * g
            m_hat, v_hat = m[i] / (1 - betas[0] ** t), v[i] / (1 - betas[1] ** t)
            params[i] -= lr * m_hat / (v_hat.sqrt() + eps)
    return params


def test_make_optimizer_is_adam_by_hand_and_stays_fused_after_loading_an_unfused_checkpoint(tmp_path):
    policy = tiny_policy()
    optimizer = make_optimizer(policy, 3e-3)
    assert optimizer.defaults["fused"]
    trainable = [p for p in policy.parameters() if p.requires_grad]
    start = [p.detach().clone() for p in trainable]
    generator = torch.Generator().manual_seed(0)
    grads_per_step = [[torch.randn(p.shape, generator=generator) for p in trainable] for _ in range(3)]
    for grads in grads_per_step:
        for p, g in zip(trainable, grads):
            p.grad = g.clone()
        optimizer.step()
    expected = _adam_by_hand(start, grads_per_step, 3e-3)
    for p, e in zip(trainable, expected):
        torch.testing.assert_close(p.detach().double(), e, atol=1e-7, rtol=1e-6)
    # a checkpoint written by torch's default (per-parameter loop) Adam, as drlc wrote them before
    unfused = torch.optim.Adam(trainable, lr=3e-3)
    unfused.load_state_dict(optimizer.state_dict())
    unfused.param_groups[0].update(fused=None)
    save_trainer_state(tmp_path, unfused, FixedKLController(0.1), RunningMoments())
    reloaded = make_optimizer(policy, 3e-3)
    load_trainer_state(tmp_path, reloaded, FixedKLController(0.1), RunningMoments())
    assert reloaded.param_groups[0]["fused"] is True
    assert int(reloaded.state_dict()["state"][0]["step"]) == 3
