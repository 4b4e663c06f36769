"""`drlc critic eval` with critic.answer_format json/copy and critic.samples: the same posts, the same scores."""
import json

import pytest
from test_critic_eval import toxicity_critic, write_posts

from pipeline.audit.critic_eval import audit_critic

LEXICON_F1 = (3 + 10 / 17) / 4  # test_critic_eval.test_lexicon_reference_and_the_catalog_view, by hand


@pytest.mark.parametrize("answer_format", ["json", "copy"])
def test_structured_lexicon_answers_score_like_text(tmp_path, answer_format):
    spans = write_posts(tmp_path / "posts.jsonl")
    rows, summary = audit_critic(spans_path=spans, critic=toxicity_critic(tmp_path, answer_format=answer_format),
                                 progress=False)
    assert summary["critics"]["configured"]["char_f1"] == pytest.approx(LEXICON_F1)
    first = next(r for r in rows if r["critic"] == "configured" and r["line"] == 1)
    assert json.loads(first["raw_text"])["spans"] == [{"label": "toxic", "text": "dumb"},
                                                      {"label": "toxic", "text": "idiot"}]


def test_three_samples_are_voted_and_each_is_sent(tmp_path):
    spans = write_posts(tmp_path / "posts.jsonl")
    critic = toxicity_critic(tmp_path, samples=3, temperature=0.7)
    rows, summary = audit_critic(spans_path=spans, critic=critic, progress=False)
    configured = summary["critics"]["configured"]
    assert configured["char_f1"] == pytest.approx(LEXICON_F1)  # three equal answers vote for their own spans
    assert configured["requests_sent"] == 12  # 4 posts x 3 sample indices, each its own cache entry
    first = next(r for r in rows if r["critic"] == "configured" and r["line"] == 1)
    assert len(json.loads(first["raw_text"])) == 3
    _, again = audit_critic(spans_path=spans, critic=critic, progress=False)
    assert again["critics"]["configured"]["requests_sent"] == 0 and again["critics"]["configured"]["cache_hits"] == 12
