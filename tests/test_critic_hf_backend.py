"""The server's hf backend: tiny GPT-2 checkpoints built from config, served over real HTTP."""

import http.client
import json
from urllib.parse import urlsplit

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

from pipeline.core.cache import CriticCache
from pipeline.core.errors import CriticError
from pipeline.critic.client import CriticClient
from pipeline.critic.offline.hf_backend import MAX_NEW_TOKENS_CAP, _max_new_tokens
from pipeline.critic.offline.server import make_server, serve_in_background

torch.set_num_threads(1)

WORDS = ["<unk>", "<eos>", "<|system|>", "<|user|>", "<|assistant|>",
         "Positive:", "Negative:", "none", "good", "bad"]
ID = {word: index for index, word in enumerate(WORDS)}
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
# the crafted model's greedy chain: every token's successor; anything not listed goes to <eos>
SUCCESSOR = {"<|assistant|>": "Positive:", "Positive:": "none", "none": "Negative:", "Negative:": "bad"}
MESSAGES = [{"role": "system", "content": "Task: sentiment"}, {"role": "user", "content": "a good day"}]


def tokenizer(chat_template=CHAT_TEMPLATE) -> PreTrainedTokenizerFast:
    word_level = Tokenizer(models.WordLevel(vocab=ID, unk_token="<unk>"))
    word_level.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=word_level, unk_token="<unk>", eos_token="<eos>",
                                  pad_token="<eos>")
    tok.add_special_tokens({"additional_special_tokens": ["<|system|>", "<|user|>", "<|assistant|>"]})
    tok.chat_template = chat_template
    return tok


def gpt2(*, crafted: bool) -> GPT2LMHeadModel:
    """A 1-layer GPT-2; ``crafted`` sets weights so the next token depends on the last token only.

    With the blocks' output projections and the position embeddings at zero, the final
    hidden state is LayerNorm(one-hot(last token)); lm_head row t holds the one-hots of
    the tokens whose successor is t, so the argmax is SUCCESSOR[last token].
    """
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(WORDS), n_positions=64, n_embd=len(WORDS), n_layer=1, n_head=2,
                        tie_word_embeddings=False, bos_token_id=ID["<eos>"], eos_token_id=ID["<eos>"],
                        pad_token_id=ID["<eos>"])
    model = GPT2LMHeadModel(config)
    if crafted:
        with torch.no_grad():
            model.transformer.wte.weight.copy_(torch.eye(len(WORDS)))
            model.transformer.wpe.weight.zero_()
            block = model.transformer.h[0]
            for layer in (block.attn.c_proj, block.mlp.c_proj):
                layer.weight.zero_()
                layer.bias.zero_()
            head = torch.zeros(len(WORDS), len(WORDS))
            for word in WORDS:
                head[ID[SUCCESSOR.get(word, "<eos>")], ID[word]] = 1.0
            model.lm_head.weight.copy_(head)
    return model


def save_checkpoint(folder, *, crafted: bool, chat_template=CHAT_TEMPLATE):
    tokenizer(chat_template).save_pretrained(folder)
    gpt2(crafted=crafted).save_pretrained(folder)
    return str(folder)


def post_json(base_url, payload):
    parts = urlsplit(base_url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        connection.request("POST", "/v1/chat/completions", body=json.dumps(payload).encode(),
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def prompt_length(messages):
    return len(tokenizer().apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                               return_dict=False))


def test_crafted_checkpoint_answers_through_the_client_and_cache(tmp_path):
    model_dir = save_checkpoint(tmp_path / "ckpt", crafted=True)
    requests = [MESSAGES, [{"role": "user", "content": "bad"}]]
    with serve_in_background(backend="hf", model_dir=model_dir) as (url, stats):
        client = CriticClient(base_url=url, model="critic-m", sampling={"max_tokens": 16})
        runs = []
        for name in ("first", "second"):  # two fresh caches: both runs reach the model
            with CriticCache(tmp_path / name) as cache:
                runs.append(client.run(requests, cache))
        assert stats()["requests"] == 4 and stats()["completions"] == 4
    first, second = runs
    assert [r.status for r in first] == ["ok", "ok"]
    # the chain <|assistant|> -> Positive: -> none -> Negative: -> bad -> <eos>, read off SUCCESSOR
    assert [r.raw_text for r in first] == ["Positive: none Negative: bad"] * 2
    assert [r.finish_reason for r in first] == ["stop", "stop"]
    assert [r.completion_tokens for r in first] == [5, 5]  # four words plus the end token
    assert [r.prompt_tokens for r in first] == [prompt_length(m) for m in requests]
    # by hand: "<|system|> Task: sentiment <|user|> a good day <|assistant|>" is 8 word-level tokens
    assert first[0].prompt_tokens == 8
    assert [(r.raw_text, r.prompt_tokens, r.completion_tokens) for r in second] == \
        [(r.raw_text, r.prompt_tokens, r.completion_tokens) for r in first]


def test_random_checkpoint_gives_openai_shape_deterministic_text_and_token_limit(tmp_path):
    model_dir = save_checkpoint(tmp_path / "ckpt", crafted=False)
    body = {"model": "critic-m", "messages": MESSAGES, "max_tokens": 6}
    with serve_in_background(backend="hf", model_dir=model_dir) as (url, _):
        replies = [post_json(url, body) for _ in range(2)]
        bad_status, bad_reply = post_json(url, body | {"max_tokens": 0})
    (status, reply), (_, again) = replies
    assert status == 200 and reply["object"] == "chat.completion" and reply["model"] == "critic-m"
    assert reply["system_fingerprint"] == "drlc-hf"
    choice = reply["choices"][0]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert choice["message"]["content"] == again["choices"][0]["message"]["content"]  # greedy: repeatable
    usage = reply["usage"]
    assert usage["prompt_tokens"] == prompt_length(MESSAGES) == 8
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    if choice["finish_reason"] == "length":
        assert usage["completion_tokens"] == 6
    else:
        assert choice["finish_reason"] == "stop" and 1 <= usage["completion_tokens"] <= 6
    assert bad_status == 400 and "max_tokens" in bad_reply["error"]["message"]


def test_token_limit_is_capped_and_defaults():
    assert _max_new_tokens({"max_tokens": 10**9}) == MAX_NEW_TOKENS_CAP
    assert _max_new_tokens({"max_tokens": 7}) == 7
    assert _max_new_tokens({"max_completion_tokens": 3, "max_tokens": 7}) == 3
    assert 1 <= _max_new_tokens({}) <= MAX_NEW_TOKENS_CAP


def test_bad_model_dirs_fail_naming_the_flag(tmp_path):
    with pytest.raises(CriticError, match="--model-dir"):
        make_server(backend="hf")
    with pytest.raises(CriticError, match="not a directory"):
        make_server(backend="hf", model_dir=str(tmp_path / "absent"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CriticError, match="no loadable causal LM"):
        make_server(backend="hf", model_dir=str(tmp_path / "empty"))
    no_template = save_checkpoint(tmp_path / "plain", crafted=False, chat_template=None)
    with pytest.raises(CriticError, match="chat_template"):
        make_server(backend="hf", model_dir=no_template)


def test_self_critique_serves_the_runs_base_model(tmp_path):
    """critic.model_dir 'base' serves the run's base model: with a LoRA policy, the policy with
    adapters disabled (the paper's self-critique)."""
    from pipeline.core.config import CriticParams
    from pipeline.steps.critique import critic_endpoint, critic_model_id

    base_dir = save_checkpoint(tmp_path / "base", crafted=True)
    critic = CriticParams(backend="hf", model_dir="base", model="self")
    assert critic_model_id(critic) == "drlc-local:hf:base"
    with critic_endpoint(critic, base_dir) as (url, stats):
        status, body = post_json(url, {"model": "self", "messages": MESSAGES, "max_tokens": 16})
        assert stats()["requests"] == 1
    assert status == 200 and body["choices"][0]["message"]["content"] == "Positive: none Negative: bad"
    with pytest.raises(CriticError, match="model_dir 'base' needs the run's base model folder"):
        with critic_endpoint(critic):
            pass


def tiny_llama_checkpoint(folder) -> str:
    """A seeded random 2-layer Llama sized to the word-level tokenizer, saved with it (chat template set)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    config = LlamaConfig(vocab_size=len(WORDS), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         bos_token_id=ID["<eos>"], eos_token_id=ID["<eos>"], pad_token_id=ID["<eos>"])
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    return str(folder)


# prompts of different lengths, so a batch needs left padding; limits differ within the batch
BATCH = [({"messages": [{"role": "user", "content": "good"}], "max_tokens": 12}),
         ({"messages": MESSAGES, "max_tokens": 7}),
         ({"messages": [{"role": "user", "content": "bad bad bad good none bad good"}], "max_tokens": 12}),
         ({"messages": [{"role": "system", "content": "none"}, {"role": "user", "content": "bad day"}],
           "max_tokens": 3})]


def answer_concurrently(backend, requests):
    import threading

    answers = [None] * len(requests)

    def ask(index):
        answers[index] = backend(requests[index])

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return answers


def test_concurrent_requests_decode_in_one_padded_batch_with_the_answers_of_batch_size_one(tmp_path):
    from pipeline.critic.offline.hf_backend import HFBackend

    model_dir = tiny_llama_checkpoint(tmp_path / "llama")
    alone = HFBackend(model_dir, max_batch_size=1)
    singles = [alone(request) for request in BATCH]
    assert alone.batch_sizes == [1, 1, 1, 1]
    together = HFBackend(model_dir, max_batch_size=4, batch_window_s=30.0)  # the 4th arrival starts the batch
    batched = answer_concurrently(together, BATCH)
    assert together.batch_sizes == [4]
    assert batched == singles  # text, token counts and finish reason, row by row
    assert [a.completion_tokens <= r["max_tokens"] for a, r in zip(batched, BATCH)] == [True] * 4
    assert any(a.completion_tokens >= 3 for a in batched), "the random model should say something"
    assert batched[3].completion_tokens <= 3 and batched[0].prompt_tokens < batched[2].prompt_tokens


def test_more_requests_than_the_batch_size_are_split_into_full_batches(tmp_path):
    from pipeline.critic.offline.hf_backend import HFBackend

    backend = HFBackend(save_checkpoint(tmp_path / "ckpt", crafted=True), max_batch_size=3, batch_window_s=30.0)
    answers = answer_concurrently(backend, [{"messages": MESSAGES, "max_tokens": 16}] * 6)
    assert backend.batch_sizes == [3, 3]
    assert [a.text for a in answers] == ["Positive: none Negative: bad"] * 6
