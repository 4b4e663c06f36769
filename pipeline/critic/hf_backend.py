"""The ``hf`` backend of the local critic server: a local causal LM checkpoint as the critic.

This is the self-critique setting of the paper: the critic is a local Hugging Face
checkpoint (typically the policy or its base model) instead of a remote API. The
checkpoint is loaded once per server from a directory (never from the hub); each chat
request is rendered with the tokenizer's chat template (``add_generation_prompt=True``)
and decoded greedily, so the same request always gets the same answer.

Generation runs under a lock: the server answers each connection in its own thread, and
one model shared by concurrent ``generate`` calls would only compete for the same cores.
"""

from __future__ import annotations

import threading
from pathlib import Path

from pipeline.critic.server import Completion, content_text
from pipeline.errors import CriticError

__all__ = ["DEFAULT_MAX_NEW_TOKENS", "MAX_NEW_TOKENS_CAP", "HFBackend"]

DEFAULT_MAX_NEW_TOKENS = 256
"""New tokens generated when a request sends no ``max_tokens``."""
MAX_NEW_TOKENS_CAP = 1024
"""Most new tokens generated for one request, whatever its ``max_tokens`` says."""


class HFBackend:
    """Answer chat requests with a local causal LM that has a chat template.

    :param model_dir: a directory written by ``save_pretrained`` holding the model and a
        tokenizer whose ``chat_template`` is set
    :raises CriticError: if the directory is missing, the checkpoint cannot be loaded or
        the tokenizer has no chat template
    """

    name = "hf"

    def __init__(self, model_dir: str | Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model_dir = Path(model_dir)
        if not self.model_dir.is_dir():
            raise CriticError(f"critic server --model-dir {str(self.model_dir)!r} is not a directory; "
                              "pass a folder written by save_pretrained")
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir), local_files_only=True)
            self.model = AutoModelForCausalLM.from_pretrained(str(self.model_dir), local_files_only=True)
        except (OSError, ValueError) as error:
            raise CriticError(f"critic server --model-dir {str(self.model_dir)!r} holds no loadable causal LM "
                              f"and tokenizer ({error})") from error
        if not getattr(self.tokenizer, "chat_template", None):
            raise CriticError(f"the tokenizer in --model-dir {str(self.model_dir)!r} has no chat_template; "
                              "set tokenizer.chat_template and save it again")
        self.model.eval()
        self._lock = threading.Lock()

    def __call__(self, request: dict) -> Completion:
        """Greedy-decode an answer to one chat-completions request body.

        :param request: the parsed JSON body; ``messages`` is required, ``max_tokens`` (or
            ``max_completion_tokens``) caps the new tokens at :data:`MAX_NEW_TOKENS_CAP`
        :return: the decoded text (special tokens removed), token counts from the
            tokenizer, and ``finish_reason`` "stop" if an end-of-sequence token ended the
            answer or "length" if the token limit did
        """
        import torch

        max_new_tokens = _max_new_tokens(request)
        messages = [{"role": m.get("role", "user"), "content": content_text(m.get("content"))}
                    for m in request["messages"]]
        prompt_ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                        return_dict=False)
        if hasattr(prompt_ids, "keys"):  # some tokenizers return a BatchEncoding even with return_dict=False
            prompt_ids = prompt_ids["input_ids"]
        input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long)  # (1, P)
        eos_id = self.tokenizer.eos_token_id
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos_id
        with self._lock, torch.inference_mode():
            output = self.model.generate(
                input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
                do_sample=False, eos_token_id=eos_id, pad_token_id=pad_id,
            )  # (1, P + N)
        new_ids = output[0, input_ids.shape[1]:].tolist()
        ended = eos_id is not None and eos_id in new_ids
        if ended:
            new_ids = new_ids[: new_ids.index(eos_id) + 1]  # the end token counts as generated
        text = self.tokenizer.decode(new_ids, skip_special_tokens=True)
        return Completion(text=text, prompt_tokens=input_ids.shape[1], completion_tokens=len(new_ids),
                          finish_reason="stop" if ended else "length")


def _max_new_tokens(request: dict) -> int:
    """The request's token limit, capped; the default if it sends none."""
    limit = request.get("max_completion_tokens", request.get("max_tokens"))
    if limit is None:
        return DEFAULT_MAX_NEW_TOKENS
    assert isinstance(limit, int) and limit >= 1, "the server rejects a bad max_tokens with 400"
    return min(limit, MAX_NEW_TOKENS_CAP)

