"""Test helper: a tiny Llama built from a config, written as a GGUF file with the gguf package's writer.

The file has what llama.cpp's converter writes for a Llama with a GPT-2 style BPE tokenizer:
the llama.* hyperparameters, tokenizer.ggml.* (tokens, token types, merges, special ids), an
optional tokenizer.chat_template, and F32 tensors under GGUF names. q and k projections are
stored row-permuted as llama.cpp expects (transformers undoes it on load): for n heads,
rows (n, 2, d/2n) are swapped to (n, d/2n, 2).
"""
import json

import numpy as np
import torch
from conftest import train_bpe
from transformers import LlamaConfig, LlamaForCausalLM

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TEXTS = ["a good day at the movies", "the plot was bad and the acting was worse", "a great film, truly great",
         "positive: good great", "negative: bad worse"] * 20
HEADS, KV_HEADS = 4, 2
LEAK = 1e-3  # craft_chain's scale on the attention and MLP output projections (see there)
LAYER_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}


def tiny_vocab() -> tuple[list[str], list[str]]:
    """(tokens in id order, merges) of a byte-level BPE trained on TEXTS, plus <|im_start|>, <|im_end|>."""
    spec = json.loads(train_bpe(TEXTS, vocab_size=300).backend_tokenizer.to_str())
    tokens = [t for t, _ in sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    return tokens + ["<|im_start|>", "<|im_end|>"], merges


def tiny_llama(vocab_size: int, *, seed: int = 0) -> LlamaForCausalLM:
    """A seeded 2-layer Llama, 32 wide, 4 query and 2 key/value heads; bos/eos = the last two ids."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=128,
                         rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                         bos_token_id=vocab_size - 2, eos_token_id=vocab_size - 1, pad_token_id=vocab_size - 1)
    return LlamaForCausalLM(config).eval()


def craft_chain(model: LlamaForCausalLM, tokens: list[str], *, answer: str = "Ġgood", filler: str = "Ġthe") -> None:
    """Set weights so the next token depends on the last token only: after a newline (the end of
    the chat template's generation prompt) comes `answer`, after `answer` the end token, after
    anything else `filler`. So the critic answers `answer` and stops; the policy writes fillers.

    The attention and MLP output projections are their random init times LEAK (1e-3), so the
    final hidden state is RMSNorm(embedding of the last token + a ~1e-5 residue): about e1 for a
    newline, e2 for `answer`, e0 for the rest; lm_head maps e0 -> filler, e1 -> answer, e2 -> eos
    (logit margin ~5.7, far above the residue). Not zero: exactly zero projections would also
    block every gradient to the q/k/v and MLP-input weights, and so to peft's default q/v LoRA
    adapters, which could then never train.
    """
    index = {token: i for i, token in enumerate(tokens)}
    eye = torch.eye(model.config.hidden_size)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(LEAK)
            layer.mlp.down_proj.weight.mul_(LEAK)
        model.model.embed_tokens.weight.copy_(eye[0].expand(len(tokens), -1))
        model.model.embed_tokens.weight[index["Ċ"]] = eye[1]
        model.model.embed_tokens.weight[index[answer]] = eye[2]
        model.lm_head.weight.zero_()
        model.lm_head.weight[index[filler]] = eye[0]
        model.lm_head.weight[index[answer]] = eye[1]
        model.lm_head.weight[len(tokens) - 1] = eye[2]


def _permute(weight: np.ndarray, n_head: int) -> np.ndarray:
    return weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:]).swapaxes(1, 2) \
        .reshape(weight.shape)


def _gguf_name(key: str) -> str:
    if key in TOP_NAMES:
        return TOP_NAMES[key]
    parts = key.split(".")  # model.layers.<i>.<module...>.weight
    return f"blk.{parts[2]}.{LAYER_NAMES['.'.join(parts[3:-1])]}.weight"


def write_tiny_gguf(path, *, chat_template: str | None = CHAT_TEMPLATE, seed: int = 0,
                    crafted: bool = False) -> LlamaForCausalLM:
    """Write a tiny Llama (random, or `crafted` by craft_chain) and its tokenizer as a GGUF file at `path`."""
    import gguf

    tokens, merges = tiny_vocab()
    model = tiny_llama(len(tokens), seed=seed)
    if crafted:
        craft_chain(model, tokens)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_context_length(128)
    writer.add_embedding_length(32)
    writer.add_feed_forward_length(64)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(32 // HEADS)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t.startswith("<|") else 1 for t in tokens])  # 3 = control (special)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(len(tokens) - 2)
    writer.add_eos_token_id(len(tokens) - 1)
    writer.add_pad_token_id(len(tokens) - 1)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    for key, tensor in model.state_dict().items():
        name, array = _gguf_name(key), tensor.numpy().astype(np.float32)
        if name.endswith("attn_q.weight"):
            array = _permute(array, HEADS)
        elif name.endswith("attn_k.weight"):
            array = _permute(array, KV_HEADS)
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model
