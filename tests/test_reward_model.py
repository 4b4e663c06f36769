"""Reward models from a folder: strict state-dict loading, scores equal to the original module's, the
reward_model scorer with per-round z-normalisation. Real tiny GPT-2 / GPT-J models built from config."""
import statistics

import pytest
import torch
from conftest import train_bpe
from torch import nn
from transformers import GPT2Config, GPT2ForSequenceClassification, GPT2Model, GPTJConfig, GPTJModel

from pipeline.core.config import ScoreParams
from pipeline.core.errors import ConfigError
from pipeline.rewards.reward_model import TRUNK_HEAD_TEXT_PREFIX, RewardModel, reward_text
from pipeline.steps.score import score
from pipeline.tasks import get_task

TEXTS = ["Anna bought two bikes in Oslo. TL;DR: Anna bought bikes", "Ben sold chairs. TL;DR: chairs",
         "On Monday it was cold and Carla repaired four lamps in Rome, a witness said. TL;DR: Carla repaired lamps"]


@pytest.fixture(scope="module")
def tokenizer():
    torch.set_num_threads(1)
    tok = train_bpe(TEXTS * 5 + ["the a of in on and to was said"], vocab_size=300)
    tok.pad_token = tok.eos_token  # as the research code did
    return tok


def _trunk_and_head(kind: str, vocab_size: int, seed: int = 0):
    """The 'original' reward model of the test: a transformers base model and a scalar Linear head."""
    torch.manual_seed(seed)
    if kind == "gptj":
        config = GPTJConfig(vocab_size=vocab_size, n_positions=128, n_embd=32, n_layer=2, n_head=4, rotary_dim=4)
        trunk = GPTJModel(config)
    else:
        config = GPT2Config(vocab_size=vocab_size, n_positions=128, n_embd=32, n_layer=2, n_head=4)
        trunk = GPT2Model(config)
    head = nn.Linear(32, 1, bias=False)
    nn.init.normal_(head.weight, std=1.0)
    return config, trunk.eval(), head


def _save_trunk_head(folder, tokenizer, config, state: dict, name: str = "pytorch_model.bin"):
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    torch.save(state, folder / name)
    return folder


def _state(trunk, head, prefix: str = "") -> dict:
    return {**{f"{prefix}transformer.{k}": v for k, v in trunk.state_dict().items()},
            f"{prefix}v_head.weight": head.weight.detach().clone()}


def _direct_scores(tokenizer, trunk, head, texts: list[str], prefix: str = TRUNK_HEAD_TEXT_PREFIX) -> list[float]:
    """One text at a time, no padding: the head's value at the last token (the independent computation)."""
    out = []
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([tokenizer(prefix + text)["input_ids"]])
            out.append(head(trunk(input_ids=ids).last_hidden_state[0, -1]).item())
    return out


@pytest.mark.parametrize("kind", ["gpt2", "gptj"])
def test_strict_load_of_a_matching_state_dict_scores_like_the_original(tmp_path, tokenizer, kind):
    config, trunk, head = _trunk_and_head(kind, len(tokenizer))
    state = _state(trunk, head)
    if kind == "gptj":  # older transformers saved GPT-J's causal-mask buffers: the class declares them ignorable
        state["transformer.h.0.attn.bias"] = torch.tril(torch.ones(1, 1, 128, 128, dtype=torch.bool))
        state["transformer.h.0.attn.masked_bias"] = torch.tensor(-1e9)
    rm = RewardModel(_save_trunk_head(tmp_path / kind, tokenizer, config, state), batch_size=2)
    assert rm.form == "trunk_head"
    expected = _direct_scores(tokenizer, trunk, head, TEXTS)
    assert len(set(round(v, 3) for v in expected)) == 3  # the texts get different rewards
    assert rm.score_texts(TEXTS) == pytest.approx(expected, abs=1e-5)
    ignored = ["transformer.h.0.attn.bias", "transformer.h.0.attn.masked_bias"] if kind == "gptj" else []
    assert rm.load_report == {"stripped_prefix": None, "ignored_keys": ignored}


def test_safetensors_file_and_document_summary_join(tmp_path, tokenizer):
    from safetensors.torch import save_file

    config, trunk, head = _trunk_and_head("gpt2", len(tokenizer), seed=1)
    folder = _save_trunk_head(tmp_path / "st", tokenizer, config, {})
    (folder / "pytorch_model.bin").unlink()
    save_file({k: v.contiguous() for k, v in _state(trunk, head).items()}, folder / "rm.safetensors")
    rm = RewardModel(folder)
    assert reward_text("Ben sold chairs. TL;DR:  ", " chairs ") == "Ben sold chairs. TL;DR: chairs"
    assert rm.score(["Ben sold chairs. TL;DR:"], ["chairs"]) == pytest.approx(
        _direct_scores(tokenizer, trunk, head, ["Ben sold chairs. TL;DR: chairs"]), abs=1e-5)


def test_a_renamed_key_raises_naming_the_file_and_both_keys(tmp_path, tokenizer):
    config, trunk, head = _trunk_and_head("gpt2", len(tokenizer))
    state = _state(trunk, head)
    state["transformer.h.1.mlp.fc.weight"] = state.pop("transformer.h.1.mlp.c_fc.weight")
    folder = _save_trunk_head(tmp_path / "bad", tokenizer, config, state)
    with pytest.raises(ConfigError) as err:
        RewardModel(folder)
    message = str(err.value)
    assert str(folder / "pytorch_model.bin") in message
    assert "1 missing keys ['transformer.h.1.mlp.c_fc.weight']" in message
    assert "1 unexpected keys ['transformer.h.1.mlp.fc.weight']" in message
    assert "No single key prefix" in message


def test_a_head_saved_under_another_name_is_missing_and_unexpected(tmp_path, tokenizer):
    config, trunk, head = _trunk_and_head("gpt2", len(tokenizer))
    state = _state(trunk, head)
    state["score.weight"] = state.pop("v_head.weight")
    with pytest.raises(ConfigError, match=r"missing keys \['v_head.weight'\].*unexpected keys \['score.weight'\]"):
        RewardModel(_save_trunk_head(tmp_path / "head", tokenizer, config, state))


def test_one_extra_prefix_on_every_key_is_stripped_only_when_unambiguous(tmp_path, tokenizer):
    config, trunk, head = _trunk_and_head("gpt2", len(tokenizer))
    rm = RewardModel(_save_trunk_head(tmp_path / "ddp", tokenizer, config, _state(trunk, head, prefix="module.")))
    assert rm.load_report["stripped_prefix"] == "module."
    assert rm.score_texts(TEXTS[:1]) == pytest.approx(_direct_scores(tokenizer, trunk, head, TEXTS[:1]), abs=1e-5)
    with pytest.raises(ConfigError, match="unexpected keys \\['module.transformer"):
        RewardModel(tmp_path / "ddp", strip_prefix=None)
    state = _state(trunk, head, prefix="module.")
    state.pop("module.transformer.ln_f.bias")  # prefix plus a missing key: no prefix explains it
    with pytest.raises(ConfigError, match="No single key prefix"):
        RewardModel(_save_trunk_head(tmp_path / "ddp2", tokenizer, config, state))


def test_a_shape_mismatch_names_the_tensor(tmp_path, tokenizer):
    config, trunk, head = _trunk_and_head("gpt2", len(tokenizer))
    state = _state(trunk, head)
    state["v_head.weight"] = torch.zeros(2, 32)
    with pytest.raises(ConfigError, match=r"v_head.weight \(2, 32\) vs \(1, 32\)"):
        RewardModel(_save_trunk_head(tmp_path / "shape", tokenizer, config, state))


def test_bad_folders_raise_config_errors(tmp_path, tokenizer):
    config, trunk, head = _trunk_and_head("gpt2", len(tokenizer))
    with pytest.raises(ConfigError, match="no config.json"):
        RewardModel(tmp_path / "nothing")
    folder = _save_trunk_head(tmp_path / "two", tokenizer, config, _state(trunk, head))
    torch.save({}, folder / "other.pt")
    with pytest.raises(ConfigError, match=r"exactly one state-dict file .* found \['other.pt', 'pytorch_model.bin'\]"):
        RewardModel(folder)
    no_pad = train_bpe(TEXTS, vocab_size=300)
    assert no_pad.pad_token is None
    with pytest.raises(ConfigError, match="has no pad token"):
        RewardModel(_save_trunk_head(tmp_path / "nopad", no_pad, config, _state(trunk, head)))


def _save_classifier(folder, tokenizer, num_labels: int = 1):
    torch.manual_seed(3)
    model = GPT2ForSequenceClassification(GPT2Config(vocab_size=len(tokenizer), n_positions=128, n_embd=32, n_layer=2,
                                                     n_head=4, num_labels=num_labels,
                                                     pad_token_id=tokenizer.pad_token_id)).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model


def test_sequence_classification_folder_scores_its_single_logit(tmp_path, tokenizer):
    model = _save_classifier(tmp_path / "cls", tokenizer)
    rm = RewardModel(tmp_path / "cls", batch_size=3)
    assert rm.form == "sequence_classification" and rm.text_prefix == ""
    with torch.no_grad():
        expected = [model(input_ids=torch.tensor([tokenizer(t)["input_ids"]])).logits[0, 0].item() for t in TEXTS]
    assert rm.score_texts(TEXTS) == pytest.approx(expected, abs=1e-5)
    _save_classifier(tmp_path / "two_labels", tokenizer, num_labels=2)
    with pytest.raises(ConfigError, match="num_labels = 2"):
        RewardModel(tmp_path / "two_labels")


@pytest.mark.parametrize("form", ["trunk_head", "sequence_classification"])
def test_scores_do_not_depend_on_padding_side_or_batch_composition(tmp_path, tokenizer, form):
    left = train_bpe(TEXTS * 5 + ["the a of in on and to was said"], vocab_size=300)
    left.pad_token, left.padding_side = left.eos_token, "left"
    folders = []
    for name, tok in (("right", tokenizer), ("left", left)):
        folder = tmp_path / name
        if form == "trunk_head":
            config, trunk, head = _trunk_and_head("gpt2", len(tokenizer))
            _save_trunk_head(folder, tok, config, _state(trunk, head))
        else:
            _save_classifier(folder, tok)
        folders.append(folder)
    alone = RewardModel(folders[0], batch_size=1).score_texts(TEXTS)
    for folder in folders:
        assert RewardModel(folder, batch_size=3).score_texts(TEXTS) == pytest.approx(alone, abs=1e-5)
        mixed = RewardModel(folder, batch_size=2).score_texts([TEXTS[2], TEXTS[0], TEXTS[1], TEXTS[2]])
        assert mixed == pytest.approx([alone[2], alone[0], alone[1], alone[2]], abs=1e-5)


def _rows(queries_and_responses):
    rollouts = [{"rollout_id": f"r{i}", "prompt_id": f"p{i}", "query": q, "response": r}
                for i, (q, r) in enumerate(queries_and_responses)]
    prompts = [{"prompt_id": f"p{i}", "reference": "ref"} for i in range(len(rollouts))]
    return rollouts, prompts


def test_reward_model_scorer_raw_and_z_normalised_per_round(tmp_path, tokenizer):
    config, trunk, head = _trunk_and_head("gpt2", len(tokenizer), seed=2)
    folder = _save_trunk_head(tmp_path / "rm", tokenizer, config, _state(trunk, head))
    pairs = [("Anna bought two bikes in Oslo. TL;DR:", "Anna bought bikes"), ("Ben sold chairs. TL;DR:", " chairs"),
             ("Carla repaired four lamps in Rome. TL;DR:", "Carla repaired lamps"), ("Ben sold chairs. TL;DR:", "x")]
    rollouts, prompts = _rows(pairs)
    kw = dict(task="summarization", run_id="t", round_=1)
    raw = score(rollouts, prompts, params=ScoreParams(scorer="reward_model", model=str(folder), scale=2.0), **kw)
    direct = _direct_scores(tokenizer, trunk, head, [f"{q} {r.strip()}" for q, r in pairs])
    assert [r["env_reward"] for r in raw] == pytest.approx(direct, abs=1e-5)  # the task's units: no scale
    assert [r["env_reward_shaped"] for r in raw] == pytest.approx([2.0 * d for d in direct], abs=1e-5)
    assert {r["scorer"] for r in raw} == {"reward_model"} and raw[0]["scorer_version"] == "local-trunk_head"
    rows = score(rollouts, prompts, params=ScoreParams(scorer="reward_model", model=str(folder), normalize=True), **kw)
    assert [r["env_reward"] for r in rows] == pytest.approx(direct, abs=1e-5)
    values = [r["env_reward_shaped"] for r in rows]
    assert statistics.fmean(values) == pytest.approx(0.0, abs=1e-9)
    assert statistics.pstdev(values) == pytest.approx(1.0, abs=1e-9)
    mean, std = statistics.fmean(direct), statistics.pstdev(direct)
    assert values == pytest.approx([(d - mean) / std for d in direct], abs=1e-4)
    assert rows[0]["scorer_version"] == "local-trunk_head"


def test_normalize_is_generic_and_a_constant_batch_becomes_zeros():
    rollouts, prompts = _rows([("q", "good movie"), ("q", "bad movie"), ("q", "ok movie")])
    rows = score(rollouts, None, task="sentiment", run_id="t", round_=1, params=ScoreParams(normalize=True))
    assert statistics.fmean(r["env_reward_shaped"] for r in rows) == pytest.approx(0.0, abs=1e-9)
    assert statistics.pstdev(r["env_reward_shaped"] for r in rows) == pytest.approx(1.0)
    assert statistics.pstdev(r["env_reward"] for r in rows) != pytest.approx(1.0)  # VADER's own compound, kept
    same, _ = _rows([("q", "a"), ("q", "a")])
    rows = score(same, None, task="sentiment", run_id="t", round_=1, params=ScoreParams(normalize=True))
    assert [r["env_reward_shaped"] for r in rows] == [0.0, 0.0]


def test_reward_model_scorer_needs_a_model_folder():
    with pytest.raises(ConfigError, match="needs 'score.model'"):
        get_task("summarization").make_reward(ScoreParams(scorer="reward_model"))
