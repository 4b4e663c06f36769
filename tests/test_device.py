"""run.device: resolved once, one-line errors before compute, and the device reaching every model and tensor.

The placement tests run on every device this machine has (the CPU here; also cuda:0 where torch
sees a GPU). Forward pre-hooks record the device of every tensor a model is called with, so a
tensor left behind on the CPU fails the CUDA run.
"""
import json
from pathlib import Path

import pytest
import torch
import yaml
from conftest import save_tiny_gpt2, train_bpe
from e2e import tiny_params
from inprocess import stage
from test_critic_hf_backend import MESSAGES, post_json, save_checkpoint
from test_metric_names import documented
from transformers import (
    DistilBertConfig,
    DistilBertForSequenceClassification,
    GPT2Config,
    GPT2ForSequenceClassification,
)

from pipeline.core.config import CriticParams, ScoreParams
from pipeline.core.device import resolve_device, stage_devices
from pipeline.core.errors import ConfigError
from pipeline.critic.offline.server import serve_in_background
from pipeline.evaluate.decode import sample_continuations
from pipeline.evaluate.metrics import conditional_perplexities
from pipeline.model.policy import load_policy
from pipeline.model.sampling import sample_responses
from pipeline.rewards.reward_model import RewardModel
from pipeline.steps.critique import critic_endpoint
from pipeline.steps.rollout import rollout_round
from pipeline.steps.score import score_round

ROOT = Path(__file__).resolve().parents[1]
DEVICES = ["cpu", pytest.param("cuda:0", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                   reason="no CUDA device"))]
TEXTS = ["a good film", "a bad film", "the film was good and long"]


# ---- resolving run.device ----

def test_cpu_and_auto_without_cuda_resolve_to_the_cpu(monkeypatch):
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert resolve_device("auto") == torch.device("cpu")  # each rank of a CPU launch: the CPU


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without CUDA")
@pytest.mark.parametrize("setting", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_a_cuda_device_is_a_config_error_naming_the_fix(setting):
    with pytest.raises(ConfigError, match=rf"run.device is '{setting}'.*no CUDA device.*run.device: cpu") as err:
        resolve_device(setting)
    assert "\n" not in str(err.value)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_index_beyond_the_device_count_is_a_config_error(monkeypatch):
    count = torch.cuda.device_count()
    with pytest.raises(ConfigError, match=rf"CUDA device {count}.*has {count}.*cuda:0"):
        resolve_device(f"cuda:{count}")
    assert resolve_device("cuda") == torch.device("cuda", 0)
    monkeypatch.setenv("WORLD_SIZE", str(count + 1))
    monkeypatch.setenv("LOCAL_RANK", str(count))
    with pytest.raises(ConfigError, match="LOCAL_RANK"):
        resolve_device("auto")


@pytest.mark.parametrize("script, paths", [
    ("base", ["--corpus", "corpus", "--out", "models/base", "--metrics", "m.json"]),
    ("rollout", ["--round", "0001", "--prompts", "p", "--policy", "models/base", "--out", "out", "--metrics", "m.json"]),
    ("score", ["--round", "0001", "--rollouts", "r", "--out", "out", "--metrics", "m.json"]),
    ("critique", ["--round", "0001", "--rollouts", "r", "--scores", "s", "--tokenizer", "t", "--out", "out",
                  "--metrics", "m.json"]),
    ("ppo", ["--round", "0001", "--policy", "models/base", "--reference", "models/base", "--rollouts", "r",
             "--scores", "s", "--annotations", "a", "--out", "out", "--steps", "st", "--kl-rewards", "kl", "--metrics", "m.json"]),
    ("evaluate", ["--prompts", "p", "--base", "models/base", "--policy", "models/round=0001", "--data", "data",
                  "--metrics", "m.json", "--curves", "c.json", "--out", "out", "--samples", "smp"]),
])
def test_a_stage_with_run_device_cuda_stops_with_one_line_before_any_compute(tmp_path, monkeypatch, script, paths):
    params = tiny_params(n_rounds=1)
    params["run"]["device"] = "cuda"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (tmp_path / "models" / "base").mkdir(parents=True)  # the stage's inputs are empty: no model is ever read
    paths = [p if p.startswith("--") or p == "0001" else str(tmp_path / p) for p in paths]
    monkeypatch.setenv("TQDM_DISABLE", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a machine without CUDA, on any machine
    # in-process (tests/inprocess.py); cwd = the project, whose prompts/ and configs the params' preflight
    # reads; every path is in tmp_path
    result = stage(script, ["--params", tmp_path / "params.yaml", *paths], ROOT)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "run.device is 'cuda'" in lines[0] and "run.device: cpu" in lines[0], lines
    assert not (tmp_path / "out").exists() and not (tmp_path / "m.json").exists()


# ---- where the models and tensors are ----

def record_input_devices(module: torch.nn.Module) -> set[str]:
    """The devices of every tensor `module` is called with, filled in as it runs."""
    seen: set[str] = set()

    def hook(_module, args, kwargs):
        seen.update(str(t.device) for t in [*args, *kwargs.values()] if isinstance(t, torch.Tensor))

    module.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


def spy_generator_devices(monkeypatch) -> list[tuple[str, str]]:
    """(probabilities' device, generator's device) of every torch.multinomial call; the real draw runs."""
    calls, real = [], torch.multinomial

    def multinomial(probs, n, *args, generator=None, **kwargs):
        calls.append((str(probs.device), str(generator.device)))
        return real(probs, n, *args, generator=generator, **kwargs)

    monkeypatch.setattr(torch, "multinomial", multinomial)
    return calls


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    torch.set_num_threads(1)
    tokenizer = train_bpe(TEXTS * 10, vocab_size=300)
    tokenizer.pad_token = tokenizer.eos_token
    return save_tiny_gpt2(tmp_path_factory.mktemp("lm"), tokenizer)


@pytest.mark.parametrize("device", DEVICES)
def test_the_sampler_runs_its_inputs_and_generator_on_the_policy_device(tiny_lm, monkeypatch, device):
    policy, tokenizer = load_policy(tiny_lm)
    policy.to(device)
    inputs = record_input_devices(policy.lm)
    draws = spy_generator_devices(monkeypatch)
    queries = [tokenizer.encode(t) for t in TEXTS]
    out = sample_responses(policy, queries=queries, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
                           max_new_tokens=4, seed=1, batch_size=2, progress=False)
    assert len(out) == 3 and inputs == {device}
    assert draws and set(draws) == {(device, device)}


@pytest.mark.parametrize("device", DEVICES)
def test_rollout_records_the_device_its_policy_ran_on(tiny_lm, monkeypatch, device):
    draws = spy_generator_devices(monkeypatch)
    prompts = [{"prompt_id": i, "split": "train", "text": t} for i, t in enumerate(TEXTS)]
    rows, metrics = rollout_round(prompts, policy_dir=tiny_lm, policy_name="base", run_id="t", round_=1, seed=0,
                                  batch_size=3, max_new_tokens=4, generation_batch_size=2, device=device)
    assert metrics["device"] == device and metrics["rows"] == len(rows) == 3
    assert metrics["response_tokens"] == sum(len(r["response_ids"]) for r in rows) > 0
    assert set(metrics) <= documented()["stage json"]
    assert set(draws) == {(device, device)}


@pytest.mark.parametrize("device", DEVICES)
def test_evaluation_decoding_and_perplexity_run_on_the_model_device(tiny_lm, device):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    lm, tokenizer = AutoModelForCausalLM.from_pretrained(tiny_lm).to(device), AutoTokenizer.from_pretrained(tiny_lm)
    inputs = record_input_devices(lm)
    queries = [tokenizer.encode(t) for t in TEXTS]
    continuations = sample_continuations(lm, tokenizer, queries, max_new_tokens=3, top_p=0.9, seed=0, batch_size=2)
    perplexities = conditional_perplexities(lm, query_ids=queries, response_ids=[[5, 6]] * 3, batch_size=2)
    assert len(continuations) == 3 and all(p > 1 for p in perplexities)
    assert inputs == {device}


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("clf")
    tokenizer = train_bpe(TEXTS * 10, vocab_size=300)
    tokenizer.pad_token = tokenizer.eos_token
    tokenizer.save_pretrained(out)
    torch.manual_seed(0)
    config = DistilBertConfig(vocab_size=len(tokenizer), dim=16, hidden_dim=32, n_layers=1, n_heads=2,
                              max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
                              id2label={0: "NEGATIVE", 1: "POSITIVE"}, label2id={"NEGATIVE": 0, "POSITIVE": 1})
    DistilBertForSequenceClassification(config).save_pretrained(out)
    return str(out)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("task", ["sentiment", "toxicity"])
def test_score_runs_the_hf_classifier_on_the_device_and_records_it(classifier_dir, task, device):
    rollouts = [{"rollout_id": f"r{i}", "prompt_id": i, "query": "", "response": t} for i, t in enumerate(TEXTS)]
    params = ScoreParams(scorer="hf_classifier", model=classifier_dir, label="POSITIVE", batch_size=2)
    on_cpu, _ = score_round(rollouts, None, task=task, run_id="t", round_=1, params=params, device="cpu")
    rows, metrics = score_round(rollouts, None, task=task, run_id="t", round_=1, params=params, device=device)
    assert metrics["device"] == device and metrics["rows"] == 3
    assert [r["env_reward"] for r in rows] == pytest.approx([r["env_reward"] for r in on_cpu], abs=1e-4)


def test_a_scorer_without_a_model_records_no_device():
    rollouts = [{"rollout_id": "r0", "prompt_id": 0, "query": "", "response": "a good film"}]
    _, metrics = score_round(rollouts, None, task="sentiment", run_id="t", round_=1, params=ScoreParams(),
                             device="cpu")
    assert metrics["device"] is None and metrics["scorer"] == "vader"


@pytest.mark.parametrize("device", DEVICES)
def test_the_reward_model_runs_its_inputs_on_the_device(tmp_path, device):
    tokenizer = train_bpe(TEXTS * 10, vocab_size=300)
    tokenizer.pad_token = tokenizer.eos_token
    torch.manual_seed(3)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_embd=32, n_layer=1, n_head=2, num_labels=1,
                        pad_token_id=tokenizer.pad_token_id)
    GPT2ForSequenceClassification(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    model = RewardModel(tmp_path, batch_size=2)
    expected = model.score_texts(TEXTS)
    model.to(device)
    inputs = record_input_devices(model.model)
    assert model.device == device and inputs == set()
    assert model.score_texts(TEXTS) == pytest.approx(expected, abs=1e-4) and inputs == {device}


@pytest.mark.parametrize("device", DEVICES)
def test_the_hf_critic_server_runs_on_the_device_and_reports_it(tmp_path, device):
    folder = save_checkpoint(tmp_path / "critic", crafted=True)
    with serve_in_background(backend="hf", model_dir=folder, device=device) as (base_url, stats):
        status, reply = post_json(base_url, {"model": "m", "messages": MESSAGES, "max_tokens": 4})
        assert status == 200 and reply["choices"][0]["message"]["content"] == "Positive: none Negative: bad"
        assert stats()["device"] == device
    # the critique stage's start path: critic_endpoint passes run.device to the server it starts
    critic = CriticParams(backend="hf", model_dir=folder)
    with critic_endpoint(critic, None, device) as (_, stats):
        assert stats()["device"] == device
    with critic_endpoint(CriticParams(), None, device) as (_, stats):
        assert stats()["device"] is None  # the lexicon critic has no model


# ---- the devices a run recorded ----

def test_stage_devices_lists_every_round_file_and_top_level_stage_file(tmp_path):
    files = {"rollout/round=0001.json": {"device": "cuda:0", "rows": 3}, "score/round=0001.json": {"device": None},
             "critique/round=0001.json": {"critiqued": 1}, "base.json": {"device": "cpu"},
             "evaluate.json": {"device": "cuda:0"}, "eval.json": {"base": {}}, "rounds.json": {"rounds": []}}
    for name, data in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(json.dumps(data))
    assert stage_devices(tmp_path) == {"rollout@0001": "cuda:0", "score@0001": None, "critique@0001": None,
                                       "base": "cpu", "evaluate": "cuda:0"}
