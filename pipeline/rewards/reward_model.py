"""A reward model loaded from a local folder: one scalar score per (document, summary) pair.

Two folder forms, told apart by config.json's ``architectures``:

- **sequence classification**: an ``AutoModelForSequenceClassification`` folder (a class name
  ending in ``ForSequenceClassification``) with ``num_labels`` 1, its weights as written by
  ``save_pretrained``, and a tokenizer. The score is the model's single logit.
- **trunk + scalar head**: the layout of the paper's TL;DR reward model
  (CarperAI/openai_summarize_tldr_rm_checkpoint, trlx's ``GPTRewardModel``): config.json of the
  trunk (e.g. GPT-J), a tokenizer, and one plain state-dict file (``*.bin``, ``*.pt`` or
  ``*.safetensors``) whose keys are ``transformer.<trunk keys>`` and ``v_head.weight`` (a
  ``Linear(hidden, 1, bias=False)``). The state dict is loaded with **strict** key checking:
  any missing or unexpected key raises ConfigError naming the file and the keys. Two
  mismatches are resolved, each exactly: (1) unexpected keys the trunk class itself declares
  as legacy buffers (HF's ``_keys_to_ignore_on_load_unexpected``, e.g. GPT-J's causal-mask
  ``attn.bias`` / ``attn.masked_bias``, which checkpoints written by older transformers
  contain) are dropped; (2) with ``strip_prefix="auto"``, one extra prefix on every key (e.g.
  ``module.`` from DDP) is stripped when stripping it makes the key set match exactly — only
  one prefix can do that, so the detection is unambiguous. Anything else is an error.

Scoring convention (trlx's, checked against its ``get_scores``): the model reads
``text_prefix + document + " " + summary`` (the document is the query ending in "TL;DR:";
the trunk + head form defaults to trlx's plain-text prefix ``<|startoftext|>``), right-padded;
the score is the head's output at the last non-pad token, i.e. the summary's last token
(trlx appended an EOS and read the position before the first pad = that EOS, which is the
same hidden state in a causal model). Over-long inputs are truncated from the left, so the
summary is never cut. Inference runs in eval mode without gradients; scores are float32.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

from pipeline.core.errors import ConfigError

STATE_DICT_SUFFIXES = (".bin", ".pt", ".safetensors")
NOT_STATE_DICTS = {"training_args.bin", "optimizer.pt", "scheduler.pt"}
HEAD_NAME = "v_head"
TRUNK_NAME = "transformer"
TRUNK_HEAD_TEXT_PREFIX = "<|startoftext|>"
SHOWN_KEYS = 5


def reward_text(document: str, summary: str) -> str:
    """The text a reward model reads: the document (query) and the summary joined by one space."""
    return f"{document.rstrip()} {summary.strip()}"


class TrunkWithHead(nn.Module):
    """A transformers base model (``transformer``) and a bias-free scalar head (``v_head``).

    ``forward`` returns the head's output at the last attended token of each row, (B,).
    """

    def __init__(self, config) -> None:
        from transformers import AutoModel

        super().__init__()
        self.transformer = AutoModel.from_config(config)
        self.v_head = nn.Linear(config.hidden_size, 1, bias=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (B, T); padding side cannot move positions
        hidden = self.transformer(input_ids=input_ids, attention_mask=attention_mask,
                                  position_ids=position_ids).last_hidden_state  # (B, T, H)
        values = self.v_head(hidden).squeeze(-1)  # (B, T)
        width = attention_mask.shape[1]
        last = width - 1 - attention_mask.flip(-1).argmax(-1)  # (B,) index of the last 1 in the mask
        return values.gather(1, last[:, None]).squeeze(1)  # (B,)


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a .safetensors or torch-pickled (.bin/.pt, weights only) state-dict file.

    Raises: ConfigError if the file cannot be read or is not a flat mapping of names to tensors.
    """
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch and safetensors raise many types for a bad file
        raise ConfigError(f"Reward-model state dict '{path}' could not be read ({str(err).splitlines()[0][:120]}): "
                          f"save it with torch.save(model.state_dict(), ...) or safetensors.") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(f"Reward-model file '{path}' is not a flat state dict (name -> tensor): save "
                          f"model.state_dict(), not a training checkpoint.")
    return state


def _ignorable(key: str, patterns: list[str]) -> bool:
    """True if key is under the trunk and ends with one of the trunk class's legacy-buffer patterns."""
    if not key.startswith(f"{TRUNK_NAME}."):
        return False
    return any(re.search(rf"(^|\.){pattern}$", key) for pattern in patterns)


def _unambiguous_prefix(keys: set[str], expected: set[str], patterns: list[str]) -> str | None:
    """The one prefix every key carries whose removal makes the keys match `expected` exactly, or None."""
    first = min(keys)
    for i, char in enumerate(first):
        if char != ".":
            continue
        prefix = first[:i + 1]
        if all(k.startswith(prefix) for k in keys):
            stripped = {k[len(prefix):] for k in keys}
            if {k for k in stripped if not _ignorable(k, patterns)} == expected:
                return prefix
    return None


def load_strict(module: nn.Module, state: dict[str, torch.Tensor], *, path: Path,
                strip_prefix: str | None = "auto") -> dict:
    """Load `state` into `module` with exact key and shape checking; return what was adjusted.

    Params: strip_prefix: "auto" strips one unambiguously detected extra prefix, None never
    strips, any other string is stripped from every key that has it.
    Returns: {"stripped_prefix": str | None, "ignored_keys": [legacy buffer keys dropped]}.
    Raises: ConfigError naming the file, the first missing/unexpected keys (or shape
    mismatches) and the fix.
    """
    expected = {k: v.shape for k, v in module.state_dict().items()}
    patterns = list(getattr(type(getattr(module, TRUNK_NAME)), "_keys_to_ignore_on_load_unexpected", None) or [])
    prefix = strip_prefix
    if strip_prefix == "auto":
        prefix = None if set(state) - {k for k in state if _ignorable(k, patterns)} == set(expected) \
            else _unambiguous_prefix(set(state), set(expected), patterns)
    if prefix:
        state = {(k[len(prefix):] if k.startswith(prefix) else k): v for k, v in state.items()}
    ignored = sorted(k for k in state if k not in expected and _ignorable(k, patterns))
    state = {k: v for k, v in state.items() if k not in ignored}
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        hint = _prefix_hint(missing, unexpected, strip_prefix)
        raise ConfigError(
            f"Reward-model state dict '{path}' does not match a '{TRUNK_NAME}' + '{HEAD_NAME}' model built from "
            f"config.json: {len(missing)} missing keys {missing[:SHOWN_KEYS]}, {len(unexpected)} unexpected keys "
            f"{unexpected[:SHOWN_KEYS]}. {hint}")
    wrong = [f"{k} {tuple(v.shape)} vs {tuple(expected[k])}" for k, v in state.items() if v.shape != expected[k]]
    if wrong:
        raise ConfigError(f"Reward-model state dict '{path}' has {len(wrong)} tensors whose shape differs from the "
                          f"model built from config.json (file vs model): {wrong[:SHOWN_KEYS]}. Use the config.json "
                          f"of the trunk this state dict was trained from.")
    module.load_state_dict(state, strict=True)
    return {"stripped_prefix": prefix or None, "ignored_keys": ignored}


def _prefix_hint(missing: list[str], unexpected: list[str], strip_prefix: str | None) -> str:
    if strip_prefix != "auto":
        return "Fix the keys or pass strip_prefix='auto'."
    if not unexpected:
        return (f"The file lacks weights the model needs: use the state dict of the whole reward model "
                f"('{TRUNK_NAME}.*' and '{HEAD_NAME}.weight').")
    return ("No single key prefix explains the difference (prefix stripping is only done when one prefix on every "
            f"key makes the keys match exactly): re-save the state dict with keys '{TRUNK_NAME}.<trunk key>' and "
            f"'{HEAD_NAME}.weight', or use the config.json of the trunk it was trained from.")


def _state_dict_file(folder: Path) -> Path:
    files = sorted(p for p in folder.iterdir()
                   if p.is_file() and p.suffix in STATE_DICT_SUFFIXES and p.name not in NOT_STATE_DICTS)
    if len(files) != 1:
        found = [p.name for p in files] or "none"
        raise ConfigError(f"Reward-model folder '{folder}' needs exactly one state-dict file (*.bin, *.pt or "
                          f"*.safetensors) next to config.json, found {found}: keep the reward model's weights only.")
    return files[0]


def _is_sequence_classifier(config) -> bool:
    return any(name.endswith("ForSequenceClassification") for name in (config.architectures or []))


class RewardModel:
    """A reward model from a local folder (either form, see the module docstring), scoring in batches.

    Params: folder: the model folder; batch_size: sequences per forward pass; max_length: tokens
    kept per sequence (default: the model's maximum positions; truncated from the left);
    strip_prefix: "auto" | None | a prefix (trunk + head form only, see `load_strict`);
    text_prefix: text put before every input (None: "" for sequence classification,
    "<|startoftext|>" for trunk + head, as trlx did).
    Attributes: form ("sequence_classification" or "trunk_head"), load_report (trunk + head:
    the dict from `load_strict`), name, version.
    Raises: ConfigError for a missing folder/config/tokenizer, a tokenizer without a pad
    token, num_labels != 1, or a state dict that does not match (names the file and keys).
    """

    def __init__(self, folder: str | Path, *, batch_size: int = 8, max_length: int | None = None,
                 strip_prefix: str | None = "auto", text_prefix: str | None = None) -> None:
        from transformers import AutoConfig

        self.folder = Path(folder)
        if not (self.folder / "config.json").is_file():
            raise ConfigError(f"Reward-model folder '{self.folder}' has no config.json: point 'score.model' / "
                              f"'evaluate.reward_model' at a folder with config.json, tokenizer and weights.")
        config = AutoConfig.from_pretrained(self.folder)
        self.tokenizer = self._load_tokenizer()
        self.load_report: dict = {}
        if _is_sequence_classifier(config):
            self.form, self.model = "sequence_classification", self._load_classifier(config)
        else:
            self.form, self.model = "trunk_head", TrunkWithHead(config)
            path = _state_dict_file(self.folder)
            self.load_report = load_strict(self.model, read_state_dict(path), path=path, strip_prefix=strip_prefix)
        self.model.eval()
        self.model.float()
        positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
        self.max_length = max_length or min(positions or 512, self.tokenizer.model_max_length)
        self.text_prefix = text_prefix if text_prefix is not None else (
            TRUNK_HEAD_TEXT_PREFIX if self.form == "trunk_head" else "")
        self.batch_size = batch_size
        self.name = f"reward_model:{self.folder.name}"
        self.version = getattr(config, "_commit_hash", None) or f"local-{self.form}"

    def _load_tokenizer(self):
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(self.folder)
        except (OSError, ValueError) as err:
            raise ConfigError(f"Reward-model folder '{self.folder}' has no loadable tokenizer "
                              f"({str(err).splitlines()[0][:120]}): save the tokenizer the model was trained with "
                              f"into it (tokenizer.save_pretrained).") from None
        if tokenizer.pad_token_id is None:
            raise ConfigError(f"The tokenizer in reward-model folder '{self.folder}' has no pad token: set one and "
                              f"re-save it (the research code used tokenizer.pad_token = tokenizer.eos_token).")
        tokenizer.padding_side, tokenizer.truncation_side = "right", "left"  # keep the summary's end, positions 0..n
        return tokenizer

    def _load_classifier(self, config):
        from transformers import AutoModelForSequenceClassification

        if config.num_labels != 1:
            raise ConfigError(f"Reward-model folder '{self.folder}' is a classifier with num_labels = "
                              f"{config.num_labels}: a reward model has one output (num_labels 1).")
        model = AutoModelForSequenceClassification.from_pretrained(self.folder)
        model.config.pad_token_id = self.tokenizer.pad_token_id  # its pooling finds the last non-pad token
        return model

    def to(self, device) -> RewardModel:
        """Run the model on `device` (its inputs follow it); returns self."""
        self.model.to(device)
        return self

    @property
    def device(self) -> str:
        return str(next(self.model.parameters()).device)

    @torch.no_grad()
    def score_texts(self, texts: list[str]) -> list[float]:
        """The reward of each full input text (prefix added here), in order; float32 values."""
        out: list[float] = []
        device = next(self.model.parameters()).device
        for start in range(0, len(texts), self.batch_size):
            batch = self.tokenizer([self.text_prefix + t for t in texts[start:start + self.batch_size]],
                                   padding=True, truncation=True, max_length=self.max_length,
                                   return_tensors="pt").to(device)
            if self.form == "trunk_head":
                values = self.model(batch["input_ids"], batch["attention_mask"])  # (B,)
            else:
                values = self.model(**batch).logits[:, 0]  # (B,)
            out += values.float().tolist()
        return out

    def score(self, documents: list[str], summaries: list[str]) -> list[float]:
        """The reward of each summary of its document (see `reward_text`), in order."""
        assert len(documents) == len(summaries)
        return self.score_texts([reward_text(d, s) for d, s in zip(documents, summaries)])
