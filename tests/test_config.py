"""params.yaml loading: the demo file is valid and complete; bad values fail with a useful message."""
import dataclasses
from pathlib import Path

import pytest
import yaml

from pipeline.core.config import SECTIONS, Params, load_params, params_from_dict
from pipeline.core.errors import ConfigError
from pipeline.tasks import check_params

ROOT = Path(__file__).resolve().parents[1]


def demo_raw() -> dict:
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def test_demo_params_load_and_list_every_field():
    params = load_params(ROOT / "params.yaml")
    assert isinstance(params, Params)
    raw = demo_raw()
    for name, cls in SECTIONS.items():
        assert set(raw[name]) == {f.name for f in dataclasses.fields(cls)}, name


def test_distill_lists_one_tagger_per_key_and_defaults_to_none():
    assert load_params(ROOT / "params.yaml").distill == {}
    raw = demo_raw()
    raw["distill"] = {"semeval": {"spans": "train.csv", "heldout_share": 0.2}}
    spec = params_from_dict(raw).distill["semeval"]
    assert (spec.spans, spec.seed, spec.heldout_share) == ("train.csv", 0, 0.2)


def switched(raw: dict, switch=None, **changes) -> dict:
    """raw as `drlc rounds 4 --switch-after 2` writes it, then `changes` (section: values)."""
    raw.update(rounds={}, switch={"0002": {"last": "0004"}} if switch is None else switch)
    for section, values in changes.items():
        raw[section].update(values)
    return raw


def test_a_switch_over_expands_every_round_and_defaults_to_off():
    assert load_params(ROOT / "params.yaml").switch == {}
    params = params_from_dict(switched(demo_raw()))
    assert params.round_keys() == ["0001", "0002", "0003", "0004"] and params.switch_round() == "0002"
    assert params.rounds["0003"].prev == "round=0002" and params.switch["0002"].heldout_share == 0.15


@pytest.mark.parametrize("raw, expected", [
    (switched(demo_raw(), {"0004": {"last": "0004"}}), ["'switch.0004'", "R = 0004", "use R in 0001..0003"]),
    (switched(demo_raw(), {"0006": {"last": "0004"}}), ["'switch.0006'", "R = 0006", "use R in 0001..0003"]),
    (switched(demo_raw(), critic={"enabled": False}), ["'switch.0002'", "'critic.enabled' is false", "switch: {}"]),
    (dict(demo_raw(), switch={"0002": {"last": "0004"}}), ["'switch.0002'", "set rounds: {}", "--switch-after R"]),
    (switched(demo_raw(), run={"rounds_per_stage": 2}), ["'switch.0002'", "run.rounds_per_stage: 1"]),
    (switched(demo_raw(), {"0001": {"last": "0004"}, "0002": {"last": "0004"}}), ["'switch'", "one entry"]),
    (switched(demo_raw(), {"2": {"last": "0004"}}), ["'2'", "4-digit"]),
    (switched(demo_raw(), {"0002": {"last": "0004", "seeds": 1}}), ["switch.0002.seeds", "'seed'"]),
    (switched(demo_raw(), {"0002": {"last": "0003"}}), ["'evaluate.policy' = 'round=0004'", "'round=0003'"]),
])
def test_bad_switch_overs_name_the_key_and_the_fix(raw, expected):
    with pytest.raises(ConfigError) as info:
        params_from_dict(raw)
    assert "\n" not in str(info.value) and all(part in str(info.value) for part in expected), str(info.value)


def test_params_are_frozen():
    params = load_params(ROOT / "params.yaml")
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.ppo.learning_rate = 1.0


def test_code_defaults_are_the_demo_profile():
    """params.yaml's demo profile and the dataclass defaults are one set of values."""
    params = load_params(ROOT / "params.yaml")
    for name, cls in SECTIONS.items():
        assert cls() == getattr(params, name), name


def test_ppo_defaults_match_legacy_trl():
    p = SECTIONS["ppo"]()  # learning_rate is the demo's (test above), TRL's is 1.41e-5
    assert (p.ppo_epochs, p.gamma, p.lam, p.cliprange, p.cliprange_value, p.vf_coef) == (
        4, 1.0, 0.95, 0.2, 0.2, 0.1)
    assert (p.init_kl_coef, p.target, p.horizon, p.ratio_threshold, p.kl_penalty) == (0.2, 6.0, 10000.0, 10.0, "kl")


@pytest.mark.parametrize("mutate, expected", [
    (lambda r: r["ppo"].update(learnin_rate=1e-4), ["ppo.learnin_rate", "Did you mean 'learning_rate'"]),
    (lambda r: r["ppo"].update(ppo_epochs="four"), ["ppo.ppo_epochs", "'four'", "int"]),
    (lambda r: r["ppo"].update(kl_penalty="kll"), ["ppo.kl_penalty", "'kll'", "one of"]),
    (lambda r: r["critic"].update(enabled="yes"), ["critic.enabled", "bool"]),
    (lambda r: r["critic"].update(max_error_rate=1.5), ["critic.max_error_rate", "1.5", "in [0, 1]"]),
    (lambda r: r["critic"].update(cache_namespace=3), ["critic.cache_namespace", "str"]),
    (lambda r: r["critic"].update(rewards={"positive": "high"}), ["critic.rewards", "dict[str, float]"]),
    (lambda r: r["rollout"].update(batch_size=0), ["rollout.batch_size", "> 0"]),
    (lambda r: r.update(critc={}), ["critc", "Did you mean 'critic'"]),
    (lambda r: r["rounds"].update({"0009": {"prev": "round=0001"}}), ["rounds.0009.prev", "round=0004"]),
    (lambda r: r["evaluate"].update(policy="round=0002"), ["evaluate.policy", "round=0004"]),
    (lambda r: r["run"].update(task="poetry"), ["run.task", "'poetry'", "sentiment"]),
    (lambda r: r.update(distill=["x.csv"]), ["'distill'", "{spans: FILE}"]),
    (lambda r: r.update(distill={"a/b": {"spans": "x.csv"}}), ["'a/b'", "critics/<key>"]),
    (lambda r: r.update(distill={"semeval": {}}), ["distill.semeval", "spans"]),
    (lambda r: r.update(distill={"semeval": {"spans": "x.csv", "sed": 1}}), ["distill.semeval.sed", "'seed'"]),
    (lambda r: r.update(distill={"semeval": {"spans": "x.csv", "heldout_share": 1.0}}),
     ["distill.semeval.heldout_share", "in (0, 1)"]),
])
def test_bad_values_name_the_key_the_value_and_the_fix(mutate, expected):
    raw = demo_raw()
    mutate(raw)
    with pytest.raises(ConfigError) as info:
        params_from_dict(raw)
    message = str(info.value)
    assert "\n" not in message
    for part in expected:
        assert part in message


@pytest.mark.parametrize("mutate, expected", [
    (lambda r: r["ppo"].update(mini_batch_size=7),
     ["'rollout.batch_size' = 128", "'ppo.mini_batch_size'", "7 x 1", "set ppo.mini_batch_size: 4", "a multiple of 7"]),
    (lambda r: r["ppo"].update(mini_batch_size=16, gradient_accumulation_steps=3),
     ["'rollout.batch_size' = 128", "'ppo.gradient_accumulation_steps'", "16 x 3", "a multiple of 48",
      "set ppo.gradient_accumulation_steps to a divisor of 128"]),
    (lambda r: r["ppo"].update(mini_batch_size=24, gradient_accumulation_steps=2), ["set ppo.mini_batch_size: 16"]),
    (lambda r: r["rollout"].update(batch_size=8), ["'rollout.batch_size' = 8", "16 x 1", "ppo.mini_batch_size: 8"]),
    (lambda r: (r["ppo"].update(num_shared_layers=1), r["base"].update(lora_r=8)),
     ["'ppo.num_shared_layers' = 1", "'base.lora_r' = 8", "set num_shared_layers to null"]),
    (lambda r: r["ppo"].update(num_shared_layers=2), ["'ppo.num_shared_layers' = 2", "'base.n_layer' = 2", "below 2"]),
    (lambda r: r["score"].update(scorer="hf_classifier"), ["'score.scorer' = 'hf_classifier'", "'score.model'", "vader"]),
    (lambda r: (r["run"].update(task="summarization"), r["score"].update(scorer="rouge1"),
                r["critic"].update(template="prompts/summarization.md", rewards={}),
                r["evaluate"].update(prompts=["world", "extra.jsonl"])),
     ["'evaluate.prompts'", "extra.jsonl", "'summarization'", "[world]"]),
    (lambda r: r["rollout"].update(min_new_tokens=30), ["'rollout.min_new_tokens' = 30", "'rollout.max_new_tokens' = 20"]),
])
def test_cross_section_mistakes_fail_at_load_naming_both_keys(mutate, expected):
    """Combinations that used to fail only in a later stage (ppo, score, evaluate) fail at `drlc check`:
    at load, or in the task's own checks (pipeline.tasks.check_params), which `drlc check` runs too."""
    raw = demo_raw()
    mutate(raw)
    with pytest.raises(ConfigError) as info:
        check_params(params_from_dict(raw))
    for part in expected:
        assert part in str(info.value)


def test_shared_layers_below_the_built_depth_and_a_dividing_minibatch_load():
    raw = demo_raw()
    raw["ppo"].update(num_shared_layers=1, mini_batch_size=32, gradient_accumulation_steps=2)
    params = params_from_dict(raw)
    assert (params.ppo.num_shared_layers, params.ppo.backward_batch_size) == (1, 64)


def test_overrides_apply_and_are_checked(tmp_path):
    params = load_params(ROOT / "params.yaml", ["critic.enabled=false", "ppo.learning_rate=0.001"])
    assert params.critic.enabled is False and params.ppo.learning_rate == 0.001
    with pytest.raises(ConfigError, match="ppo.nope"):
        load_params(ROOT / "params.yaml", ["ppo.nope=1"])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_params(tmp_path / "params.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_params(bad)


def test_params_survive_dvcs_rewrite_of_params_yaml(tmp_path):
    """`dvc exp run -S` rewrites params.yaml with ruamel (YAML 1.2); we read it with PyYAML (1.1).

    Values such as `no`, `on` or `0001` mean different things in the two; none may change.
    """
    from ruamel.yaml import YAML

    yaml12 = YAML()
    data = yaml12.load((ROOT / "params.yaml").read_text())
    data["ppo"]["learning_rate"] = 0.001  # what `-S ppo.learning_rate=0.001` does
    rewritten = tmp_path / "params.yaml"
    with rewritten.open("w") as f:
        yaml12.dump(data, f)
    before, after = load_params(ROOT / "params.yaml"), load_params(rewritten)
    assert after.ppo.learning_rate == 0.001
    assert dataclasses.replace(after, ppo=before.ppo) == before


def test_exponent_floats_without_a_dot_are_floats(tmp_path):
    params = load_params(ROOT / "params.yaml", ["ppo.learning_rate=1e-4", "ppo.target=6E0"])
    assert params.ppo.learning_rate == 1e-4 and params.ppo.target == 6.0
