"""Data-parallel rollout and evaluation: `accelerate launch` with 2 CPU processes (torchrun + gloo)
writes what one process writes, because every generation batch draws from its own seeded generator."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
import yaml
from conftest import save_tiny_gpt2, train_bpe
from e2e import tiny_params

from pipeline.core import store
from pipeline.model.policy import load_policy
from pipeline.model.sampling import sample_responses
from pipeline.parallel.shard import batch_seed

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["a good film", "a bad film", "the film was good and long", "long and bad", "the cast was good"]
pytestmark = pytest.mark.slow  # each test starts a 2-process accelerate launch


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args: list[str], processes: int) -> subprocess.CompletedProcess:
    """`python ARGS` for one process, `accelerate launch --multi_gpu --num_processes N ARGS` for more."""
    launcher = [sys.executable] if processes == 1 else [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(free_port())]
    # one thread per process in both: torchrun gives each process 1, and on some CPUs (an AVX2 EPYC)
    # a matmul's float rounding changes with the thread count, which no sharding scheme can undo
    env = dict(os.environ, PYTHONPATH=str(ROOT), TQDM_DISABLE="1", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    result = subprocess.run(launcher + args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.set_num_threads(1)
    tokenizer = train_bpe(TEXTS * 10, vocab_size=300)
    tokenizer.pad_token = tokenizer.eos_token
    return save_tiny_gpt2(tmp_path_factory.mktemp("base"), tokenizer)


@pytest.mark.parametrize("samples_per_prompt", [1, 2])
def test_two_processes_write_the_one_process_rollout_table(tmp_path, model_dir, samples_per_prompt):
    # 10 responses in generation batches of 3: batches 0 and 2 on rank 0, 1 and 3 (one row) on rank 1;
    # groups of 2: 5 prompts, each sample index's 2 batches split over the ranks
    params = tiny_params(n_rounds=1, rollout={"batch_size": 10, "generation_batch_size": 3, "max_new_tokens": 6,
                                              "min_new_tokens": 3, "samples_per_prompt": samples_per_prompt},
                         ppo={"mini_batch_size": 10})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    prompts = [{"run_id": "e2e", "round": 0, "prompt_id": f"p{i}", "split": "train", "text": t, "reference": ""}
               for i, t in enumerate(TEXTS * 3)]
    store.write_table(prompts, "prompts", tmp_path / "prompts")
    tables = {}
    for processes in (1, 2):
        out = tmp_path / f"rollouts-{processes}"
        launch(["stages/rollout.py", "--params", str(tmp_path / "params.yaml"), "--round", "0001", "--prompts",
                str(tmp_path / "prompts"), "--policy", model_dir, "--out", str(out), "--metrics",
                str(tmp_path / f"{processes}.json")], processes)
        tables[processes] = pq.read_table(out / "part-0.parquet").to_pylist()
        metrics = json.loads((tmp_path / f"{processes}.json").read_text())
        assert metrics["processes"] == processes and metrics["rows"] == 10 and metrics["device"] == "cpu"
    assert len(tables[1]) == 10 and len({tuple(r["response_ids"]) for r in tables[1]}) > 1
    assert tables[2] == tables[1]


def test_two_processes_evaluate_like_one(tmp_path, model_dir):
    got = {}
    for processes in (1, 2):
        launch(["tests/evaluate_launch.py", model_dir, str(tmp_path / f"{processes}.json")], processes)
        got[processes] = json.loads((tmp_path / f"{processes}.json").read_text())
        assert got[processes]["processes"] == processes
    # 5 prompts x 3 samples = 15 continuations per policy in batches of 4: both ranks decode
    assert len(got[1]["samples"]) == 30
    assert got[2]["samples"] == got[1]["samples"] and got[2]["metrics"] == got[1]["metrics"]


def test_each_generation_batch_has_its_own_seed_and_batch_zero_keeps_the_round_seed(model_dir):
    """What makes the process count irrelevant: batch b's samples depend on (seed, b) only, not on the
    batches sampled before it in the same process."""
    policy, tokenizer = load_policy(model_dir)
    queries = [tokenizer.encode(t) for t in TEXTS + TEXTS]
    kwargs = dict(eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id, max_new_tokens=5, progress=False)
    whole = sample_responses(policy, queries=queries, seed=11, batch_size=4, **kwargs)
    # batch 2 alone (queries 8-9) drawn from its own seed = the last rows of the whole run
    alone = sample_responses(policy, queries=queries[8:], seed=batch_seed(11, 2), batch_size=4, **kwargs)
    assert whole[8:] == alone
    assert sample_responses(policy, queries=queries[:4], seed=11, batch_size=4, **kwargs) == whole[:4]
    assert len({batch_seed(11, b) for b in range(100)}) == 100 and batch_seed(11, 0) == 11
