"""LoRA policies (peft): add adapters to a base LM, save them, load them back.

A LoRA policy trains only the adapters (and the value head); the base weights stay as the base
stage saved them, so "the same model with the adapters disabled" is the reference model and,
for self-critique, the critic (see pipeline/model/reference.py and critic.model_dir).
A saved LoRA policy folder holds adapter_config.json + adapter weights + tokenizer + value head;
adapter_config.json's base_model_name_or_path names the base model folder it applies to.
"""
from __future__ import annotations

from pathlib import Path

import torch

from pipeline.core.errors import ConfigError

ADAPTER_CONFIG = "adapter_config.json"


def is_adapter_folder(model_dir: str | Path) -> bool:
    return (Path(model_dir) / ADAPTER_CONFIG).is_file()


def has_adapters(lm: torch.nn.Module) -> bool:
    from peft import PeftModel

    return isinstance(lm, PeftModel)


def add_adapters(lm: torch.nn.Module, *, r: int, alpha: float, target_modules: list[str], seed: int,
                 base_dir: str | Path) -> torch.nn.Module:
    """Wrap `lm` with fresh LoRA adapters (rank r, scaling alpha / r) and return the peft model.

    The adapters' random matrices are drawn under torch seed `seed` (the global RNG is restored
    afterwards); B starts at zero, so the wrapped model computes exactly what `lm` did.
    target_modules empty = peft's default modules for the model type.
    Raises ConfigError when the model has none of the target modules.
    """
    from peft import LoraConfig, get_peft_model
    from peft.tuners.tuners_utils import NoMatchingPeftModuleError

    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, task_type="CAUSAL_LM",
                        target_modules=list(target_modules) or None, base_model_name_or_path=str(base_dir))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            return get_peft_model(lm, config)
        except NoMatchingPeftModuleError:
            names = sorted({name.rsplit(".", 1)[-1] for name, module in lm.named_modules()
                            if isinstance(module, torch.nn.Linear) or type(module).__name__ == "Conv1D"})
            raise ConfigError(
                f"'base.lora_target_modules' = {list(target_modules)} matches no module of the "
                f"{lm.config.model_type} model: use some of its linear layers {names} (or [] for peft's default)."
            ) from None
        except ValueError as err:  # peft has no default target modules for this model type
            raise ConfigError(f"LoRA cannot wrap the {lm.config.model_type} model ({err}): set "
                              "'base.lora_target_modules' to the names of its attention projections.") from None


def load_adapter_lm(model_dir: str | Path) -> torch.nn.Module:
    """Load the base LM named in model_dir's adapter_config.json with the trainable adapters applied.

    Raises ConfigError if that base model folder does not exist.
    """
    import json

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base_dir = json.loads((Path(model_dir) / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    if not base_dir or not Path(base_dir).is_dir():
        raise ConfigError(f"LoRA policy '{model_dir}' applies to base model {base_dir!r}, which is not a "
                          "folder here: run the base stage (paths are relative to the project root).")
    lm = AutoModelForCausalLM.from_pretrained(base_dir)
    return PeftModel.from_pretrained(lm, str(model_dir), is_trainable=True)
