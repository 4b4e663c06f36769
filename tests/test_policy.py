"""pipeline.model.policy, pipeline.model.sampling and pipeline.model.logprobs on a real tiny GPT-2 (built from a config, never downloaded)."""
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

import pipeline.model.policy
from pipeline.core.errors import ConfigError
from pipeline.model.logprobs import response_logprobs, token_logprobs
from pipeline.model.policy import PolicyWithValueHead, _fresh_value_head, load_policy, load_reference, save_policy
from pipeline.model.sampling import sample_responses
from pipeline.train.ppo import entropy_from_logits

torch.set_num_threads(1)
VOCAB = 64
EOS, PAD = 1, 0


def tiny_policy(seed=0, n_layer=1):
    torch.manual_seed(seed)
    config = GPT2Config(n_layer=n_layer, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=64,
                        bos_token_id=EOS, eos_token_id=EOS, pad_token_id=PAD)
    return PolicyWithValueHead(GPT2LMHeadModel(config), _fresh_value_head(32, seed)).eval()


def tiny_tokenizer(with_pad=True):
    vocab = {"<pad>": PAD, "<eos>": EOS, **{f"w{i}": i for i in range(2, VOCAB)}}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>",
                                   pad_token="<pad>" if with_pad else None)


def padded_batch(rows, width, left):
    ids = [([PAD] * (width - len(r)) + r) if left else (r + [PAD] * (width - len(r))) for r in rows]
    mask = [([0] * (width - len(r)) + [1] * len(r)) if left else ([1] * len(r) + [0] * (width - len(r))) for r in rows]
    return torch.tensor(ids), torch.tensor(mask)


def test_left_and_right_padding_give_same_logits_and_values():
    policy = tiny_policy()
    rows = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]  # B = 3, T = 7 with extra padding
    with torch.no_grad():
        right = policy(**dict(zip(("input_ids", "attention_mask"), padded_batch(rows, 7, left=False))))
        left = policy(**dict(zip(("input_ids", "attention_mask"), padded_batch(rows, 7, left=True))))
    for b, row in enumerate(rows):
        n = len(row)
        torch.testing.assert_close(right[0][b, :n], left[0][b, 7 - n:], atol=1e-5, rtol=0)
        torch.testing.assert_close(right[1][b, :n], left[1][b, 7 - n:], atol=1e-5, rtol=0)
    assert right[1].dtype == torch.float32 and right[1].shape == (3, 7)


def test_response_logprobs_matches_unpadded_single_rows():
    policy = tiny_policy()
    queries, responses = [[5, 6, 7], [8]], [[20, 21], [22, 23, 24, 25]]
    with torch.no_grad():
        out = response_logprobs(policy, query_ids=queries, response_ids=responses, pad_id=PAD, keep_logits=True)
        logprobs, values, mask, logits = out.logprobs, out.values, out.mask, out.logits
        assert logprobs.shape == values.shape == mask.shape == (2, 4) and logits.shape == (2, 4, VOCAB)
        for b, (q, r) in enumerate(zip(queries, responses)):
            ids = torch.tensor([q + r])
            full_logits, full_values = policy(input_ids=ids, attention_mask=torch.ones_like(ids))
            log_p = torch.log_softmax(full_logits[0], -1)
            for j, token in enumerate(r):
                pos = len(q) + j - 1  # state before response token j
                assert logprobs[b, j].item() == pytest.approx(log_p[pos, token].item(), abs=1e-5)
                assert values[b, j].item() == pytest.approx(full_values[0, pos].item(), abs=1e-5)
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]


def test_sampled_logprobs_equal_response_logprobs():
    """The negative-KL guard: behaviour log-probs are the policy's own log-probs."""
    policy = tiny_policy()
    queries = [[5, 6, 7], [8], [9, 10, 11, 12, 13], [14, 15]]
    out = sample_responses(policy, queries=queries, eos_id=EOS, pad_id=PAD, max_new_tokens=12, seed=3,
                           batch_size=3, progress=False)
    responses = [o["response_ids"] for o in out]
    with torch.no_grad():
        logprobs = response_logprobs(policy, query_ids=queries, response_ids=responses, pad_id=PAD).logprobs
    for b, o in enumerate(out):
        assert len(o["behaviour_logprobs"]) == len(o["response_ids"])
        recomputed = logprobs[b, : len(o["response_ids"])].tolist()
        assert recomputed == pytest.approx(o["behaviour_logprobs"], abs=1e-5)


def test_sampling_is_deterministic_and_seed_dependent():
    policy = tiny_policy()
    queries = [[5, 6], [7, 8, 9]] * 3
    kwargs = dict(queries=queries, eos_id=EOS, pad_id=PAD, max_new_tokens=10, batch_size=4, progress=False)
    first = sample_responses(policy, seed=1, **kwargs)
    assert first == sample_responses(policy, seed=1, **kwargs)
    assert first != sample_responses(policy, seed=2, **kwargs)


def constant_policy(eos_logit: float):
    """A policy whose next-token logits are 0 everywhere except `eos_logit` for EOS."""
    policy = tiny_policy()
    with torch.no_grad():
        policy.lm.lm_head.weight.zero_()  # tied to the token embeddings
        policy.lm.transformer.ln_f.weight.zero_()
        policy.lm.transformer.ln_f.bias.fill_(1.0)  # final hidden state = all ones
        policy.lm.transformer.wte.weight[EOS] = eos_logit / policy.lm.config.n_embd
    return policy


def test_eos_is_kept_and_stops_the_row_and_max_length_cuts():
    out = sample_responses(constant_policy(2.0), queries=[[5, 6, 7]] * 40, eos_id=EOS, pad_id=PAD,
                           max_new_tokens=6, seed=0, batch_size=40, progress=False)
    lengths = [len(o["response_ids"]) for o in out]
    assert max(lengths) == 6 and min(lengths) < 6  # both stop reasons occur
    for o in out:
        ids = o["response_ids"]
        assert EOS not in ids[:-1]  # nothing is generated after EOS
        assert len(ids) == 6 or ids[-1] == EOS
        assert len(o["behaviour_logprobs"]) == len(ids)
    forced = sample_responses(constant_policy(100.0), queries=[[5], [6, 7]], eos_id=EOS, pad_id=PAD,
                              max_new_tokens=6, seed=0, batch_size=2, progress=False)
    assert [o["response_ids"] for o in forced] == [[EOS], [EOS]]
    assert forced[0]["behaviour_logprobs"][0] == pytest.approx(0.0, abs=1e-5)


def test_save_load_round_trip(tmp_path):
    policy, tokenizer = tiny_policy(seed=4), tiny_tokenizer()
    save_policy(policy, tokenizer, tmp_path / "p")
    loaded, loaded_tok = load_policy(tmp_path / "p", seed=99)  # seed unused: the head is on disk
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        a = policy(input_ids=ids, attention_mask=torch.ones_like(ids))
        b = loaded(input_ids=ids, attention_mask=torch.ones_like(ids))
    torch.testing.assert_close(a[0], b[0])
    torch.testing.assert_close(a[1], b[1])
    assert loaded_tok.pad_token_id == PAD and not loaded.training
    ref = load_reference(tmp_path / "p")
    assert not ref.training and not any(p.requires_grad for p in ref.parameters())


def test_fresh_value_head_is_seeded(tmp_path):
    policy, tokenizer = tiny_policy(), tiny_tokenizer()
    policy.lm.save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    first, _ = load_policy(tmp_path / "base", seed=1)
    again, _ = load_policy(tmp_path / "base", seed=1)
    other, _ = load_policy(tmp_path / "base", seed=2)
    assert torch.equal(first.v_head.weight, again.v_head.weight)
    assert not torch.equal(first.v_head.weight, other.v_head.weight)


def test_missing_pad_token_raises_config_error(tmp_path):
    policy = tiny_policy()
    policy.lm.save_pretrained(tmp_path / "m")
    tiny_tokenizer(with_pad=False).save_pretrained(tmp_path / "m")
    with pytest.raises(ConfigError, match="no pad token"):
        load_policy(tmp_path / "m")
    with pytest.raises(ConfigError, match="does not exist"):
        load_policy(tmp_path / "absent")


QUERIES, RESPONSES = [[5, 6, 7], [8], [9, 10]], [[20, 21], [22, 23, 24, 25], [26]]  # B = 3, T = 4


def test_head_on_response_positions_matches_full_logits_path(monkeypatch):
    """The LM head on the T response positions only gives what the full (B, L, V) path gives."""
    policy = tiny_policy(n_layer=2)
    assert policy.plain_head
    with torch.no_grad():
        fast = response_logprobs(policy, query_ids=QUERIES, response_ids=RESPONSES, pad_id=PAD, keep_logits=True,
                                  with_entropy=True)
        monkeypatch.setattr(pipeline.model.policy, "PLAIN_HEAD_MODEL_TYPES", frozenset())
        assert not policy.plain_head
        full = response_logprobs(policy, query_ids=QUERIES, response_ids=RESPONSES, pad_id=PAD, keep_logits=True,
                                  with_entropy=True)
    for name in ("logprobs", "values", "mask", "logits", "entropy"):
        torch.testing.assert_close(getattr(fast, name), getattr(full, name), atol=1e-5, rtol=0)
    # entropy = −Σ p log p, checked against the independent softmax/logsumexp formula
    torch.testing.assert_close(fast.entropy, entropy_from_logits(fast.logits), atol=1e-5, rtol=0)


def test_bf16_logprobs_are_fp32_and_close_to_fp32():
    policy = tiny_policy(n_layer=2)
    kwargs = dict(query_ids=QUERIES, response_ids=RESPONSES, pad_id=PAD, keep_logits=True, with_entropy=True)
    with torch.no_grad():
        fp32 = response_logprobs(policy, **kwargs)
        bf16 = response_logprobs(policy, mixed_precision="bf16", **kwargs)
    for name in ("logprobs", "values", "logits", "entropy"):
        assert getattr(bf16, name).dtype == torch.float32
        # bf16 rounds matmul inputs/outputs to 8 significant bits; these tiny-model numbers are O(1)
        torch.testing.assert_close(getattr(bf16, name), getattr(fp32, name), atol=3e-2, rtol=0)
    assert not torch.equal(bf16.logprobs, fp32.logprobs)  # autocast really ran
    assert (bf16.logprobs * (1 - bf16.mask)).abs().sum() == 0


def test_bf16_gradients_reach_every_trainable_parameter_in_fp32():
    policy = tiny_policy()
    out = response_logprobs(policy, query_ids=QUERIES, response_ids=RESPONSES, pad_id=PAD, mixed_precision="bf16")
    (out.logprobs.sum() + out.values.sum()).backward()
    for name, param in policy.named_parameters():
        assert param.grad is not None and param.grad.dtype == torch.float32, name
        assert torch.isfinite(param.grad).all(), name


def test_unknown_mixed_precision_raises_config_error():
    with pytest.raises(ConfigError, match="fp16"):
        response_logprobs(tiny_policy(), query_ids=QUERIES, response_ids=RESPONSES, pad_id=PAD, mixed_precision="fp16")


def test_token_logprobs_gradient_equals_autograd_log_softmax_gather():
    """The hand-written backward against torch's own log_softmax + gather, in float64."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 4, 7, dtype=torch.float64, generator=generator, requires_grad=True)  # B≠T≠V
    tokens = torch.randint(0, 7, (3, 4), generator=generator)
    weights = torch.randn(3, 4, dtype=torch.float64, generator=generator)
    logprobs, entropy = token_logprobs(logits=logits, tokens=tokens, with_entropy=True)
    expected = torch.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0]
    torch.testing.assert_close(logprobs, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(entropy, entropy_from_logits(logits.detach()).double(), atol=1e-6, rtol=0)
    ours, = torch.autograd.grad((logprobs * weights).sum(), logits)
    theirs, = torch.autograd.grad((expected * weights).sum(), logits)
    torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=0)
    assert torch.autograd.gradcheck(lambda z: token_logprobs(logits=z, tokens=tokens)[0], (logits,))


def test_token_logprobs_of_very_unlikely_tokens_stay_finite_and_exact_in_fp32():
    """log p_token = z_token − (max z − log max p): no underflow where softmax(z)[token] is 0 in fp32."""
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 50, dtype=torch.float64, generator=generator) * 3
    logits[..., 0] += 200.0  # token 0 dominates: every other token has p < e^-150, below fp32's range
    tokens = torch.randint(1, 50, (2, 3), generator=generator)
    expected = torch.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0]  # float64 reference
    assert (expected < -150).all()
    fp32 = logits.float().requires_grad_()
    for logprobs, entropy in (token_logprobs(logits=fp32, tokens=tokens, with_entropy=True),
                              token_logprobs(logits=fp32.detach(), tokens=tokens, with_entropy=True),
                              (token_logprobs(logits=fp32.detach(), tokens=tokens)[0], None)):
        assert torch.isfinite(logprobs).all()
        torch.testing.assert_close(logprobs.double(), expected, atol=1e-4, rtol=1e-6)
        if entropy is not None:
            torch.testing.assert_close(entropy.double(), entropy_from_logits(logits).double(), atol=1e-4, rtol=0)


def test_the_prompt_pass_builds_last_position_logits_only_with_the_same_samples(monkeypatch):
    """logits_to_keep=1 (as generate sets it) for GPT-2 and through a LoRA wrapper; samples unchanged."""
    from peft import LoraConfig, get_peft_model

    import pipeline.model.sampling

    policy = tiny_policy(n_layer=2)
    assert pipeline.model.sampling._last_logits_only(policy.lm) == {"logits_to_keep": 1}
    lora = get_peft_model(tiny_policy().lm, LoraConfig(r=2, target_modules=["c_attn"], fan_in_fan_out=True))
    assert pipeline.model.sampling._last_logits_only(lora) == {"logits_to_keep": 1}
    queries = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]  # left padding in the prompt pass
    kwargs = dict(queries=queries, eos_id=EOS, pad_id=PAD, max_new_tokens=6, seed=3, batch_size=3, progress=False)
    last_only = sample_responses(policy, **kwargs)
    monkeypatch.setattr(pipeline.model.sampling, "_last_logits_only", lambda lm: {})
    assert sample_responses(policy, **kwargs) == last_only


def test_the_sampler_runs_one_forward_pass_per_sampled_token(monkeypatch):
    """The prompt pass gives token 1's logits and each decode pass the next one's: R tokens, R passes."""
    policy = tiny_policy()
    calls = []
    forward = policy.lm.forward
    monkeypatch.setattr(policy.lm, "forward", lambda *a, **k: calls.append(1) or forward(*a, **k))
    rows = sample_responses(policy, queries=[[5, 6], [7, 8]], eos_id=-1, pad_id=PAD, max_new_tokens=5, seed=0,
                            batch_size=2, progress=False)
    assert [len(r["response_ids"]) for r in rows] == [5, 5] and len(calls) == 5
