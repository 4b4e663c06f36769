"""The language models: policy with value head, reference, LoRA, GGUF import, sampling, log-probs, pretraining and SFT."""
