"""ppo.algorithm's config checks: one-line errors at load (`drlc check`) naming both keys."""
import os
from pathlib import Path

import pytest
import yaml
from inprocess import drlc

from pipeline.core.config import params_from_dict
from pipeline.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def raw(**sections) -> dict:
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    for section, values in sections.items():
        params[section].update(values)
    return params


GROUPED = {"samples_per_prompt": 4}
VALUE_FREE = {"vf_coef": 0.0}


@pytest.mark.parametrize(("sections", "expected"), [
    ({"ppo": {"algorithm": "grpo", **VALUE_FREE}},
     ["'ppo.algorithm' = grpo", "'rollout.samples_per_prompt' >= 2", "got 1", "no baseline"]),
    ({"ppo": {"algorithm": "rloo", **VALUE_FREE}}, ["'ppo.algorithm' = rloo", "'rollout.samples_per_prompt'"]),
    ({"rollout": {"samples_per_prompt": 3}},
     ["'rollout.batch_size' = 128", "whole number of groups", "'rollout.samples_per_prompt' = 3"]),
    ({"rollout": GROUPED, "ppo": {"algorithm": "grpo"}},
     ["'ppo.vf_coef' = 0.1", "'ppo.algorithm' = grpo", "set ppo.vf_coef: 0"]),
    ({"ppo": {"algorithm": "reinforce_pp", "vf_coef": 0.5}}, ["'ppo.vf_coef' = 0.5", "'ppo.algorithm' = reinforce_pp"]),
    ({"ppo": {"algorithm": "a2c"}}, ["ppo.algorithm", "a2c", "grpo"]),
    ({"ppo": {"loss_type": "bnpo"}}, ["ppo.loss_type", "bnpo", "dr_grpo"]),
    ({"ppo": {"dense_weight": -1.0}}, ["ppo.dense_weight", ">= 0"]),
])
def test_mistakes_fail_at_load_in_one_line_naming_the_keys(sections, expected):
    with pytest.raises(ConfigError) as info:
        params_from_dict(raw(**sections))
    message = str(info.value)
    assert "\n" not in message
    for part in expected:
        assert part in message, message


@pytest.mark.parametrize("algorithm", ["grpo", "rloo", "reinforce_pp"])
def test_value_free_profiles_load(algorithm):
    params = params_from_dict(raw(rollout=GROUPED, ppo={"algorithm": algorithm, **VALUE_FREE}))
    assert params.ppo.algorithm == algorithm and params.rollout.samples_per_prompt == 4


def test_reinforce_pp_needs_no_group():
    assert params_from_dict(raw(ppo={"algorithm": "reinforce_pp", **VALUE_FREE})).rollout.samples_per_prompt == 1


def test_drlc_check_prints_the_one_line(tmp_path, monkeypatch):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw(ppo={"algorithm": "grpo", **VALUE_FREE})))
    for name in list(os.environ):  # a bare environment: no API key, no venv on PATH
        monkeypatch.delenv(name)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    result = drlc(["check", "--params", str(tmp_path / "params.yaml")], ROOT)
    assert result.returncode != 0
    assert "'ppo.algorithm' = grpo needs 'rollout.samples_per_prompt' >= 2" in result.stderr + result.stdout


def test_estimate_counts_no_value_head_for_a_value_free_algorithm():
    import dataclasses

    from pipeline.commands.estimate import estimate_disk
    from pipeline.core.config import load_params

    ppo = load_params(ROOT / "configs/paper/sentiment-dense.yaml")
    grpo = dataclasses.replace(ppo, ppo=dataclasses.replace(ppo.ppo, algorithm="grpo", vf_coef=0.0))
    with_head, without = estimate_disk(ppo, root=ROOT), estimate_disk(grpo, root=ROOT)
    head = 1280 + 1  # gpt2-large: hidden 1280, a Linear(1280, 1)
    assert with_head.value_head_bytes == 4 * head and without.value_head_bytes == 0
    assert with_head.policy.trainable - without.policy.trainable == head
    # per checkpoint: the head's fp32 weights and its two Adam moments (gpt2-large is saved fp32)
    assert with_head.checkpoint_bytes - without.checkpoint_bytes == 4 * head + 2 * 4 * head
