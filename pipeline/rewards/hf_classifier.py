"""A Hugging Face text-classification model as a batched scorer (the paper profiles' rewards).

Sentiment (paper: lvwerra/distilbert-imdb) reads the raw logit of the POSITIVE label;
toxicity (paper: facebook/roberta-hate-speech-dynabench-r4-target) reads the softmax
probability of its toxic label. `model` is a local folder saved with `save_pretrained` or a
hub id (needs network). The label is looked up by name in the model's ``id2label``.
"""
from __future__ import annotations

from pipeline.core.errors import ConfigError


class HFClassifier:
    """Scores texts with one label of a sequence-classification model, in batches.

    Params: model: folder or hub id; label: a name in the model's id2label; output: "logit"
    (raw logit of the label) or "prob" (its softmax probability); batch_size: texts per forward
    pass; max_length: tokens kept per text.
    Raises: ConfigError if the model cannot be loaded or has no such label (names the model,
    its labels and the fix).
    """

    def __init__(self, model: str, *, label: str, output: str = "logit", batch_size: int = 64,
                 max_length: int = 512) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model)
            self.model = AutoModelForSequenceClassification.from_pretrained(model).eval()
        except (OSError, ValueError) as err:
            raise ConfigError(f"'score.model' = {model!r} could not be loaded as a text classifier "
                              f"({str(err).splitlines()[0][:120]}): point it at a saved HF classifier folder.") from None
        labels = {str(name): int(i) for i, name in self.model.config.id2label.items()}
        if label not in labels:
            raise ConfigError(f"'score.model' = {model!r} has labels {sorted(labels)} and no {label!r}: set "
                              f"'score.label' to the label that means {label.lower()}.")
        assert output in ("logit", "prob")
        self.index, self.output, self.batch_size, self.max_length = labels[label], output, batch_size, max_length
        self.name, self.version = f"hf:{model}", getattr(self.model.config, "_commit_hash", None) or "local"

    def to(self, device) -> HFClassifier:
        """Run the model on `device` (its inputs follow it); returns self."""
        self.model.to(device)
        return self

    @property
    def device(self) -> str:
        return str(self.model.device)

    def values(self, texts: list[str]) -> list[float]:
        """The label's logit or probability for each text, in order."""
        import torch

        out: list[float] = []
        with torch.no_grad():
            for start in range(0, len(texts), self.batch_size):
                batch = self.tokenizer(texts[start:start + self.batch_size], padding=True, truncation=True,
                                       max_length=self.max_length, return_tensors="pt").to(self.model.device)
                logits = self.model(**batch).logits.float()  # (B, n_labels)
                if self.output == "prob":
                    logits = logits.softmax(dim=-1)
                out += logits[:, self.index].tolist()
        return out

    def toxicity(self, texts: list[str]) -> list[float]:
        return self.values(texts)

    def score(self, texts: list[str], *, references: list[str] | None = None) -> list[float]:
        return self.values(texts)
