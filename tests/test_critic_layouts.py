"""The lexicon critic's other answer layouts (drlc critic serve --layout) name the same spans."""
import json
import random
from pathlib import Path

import pytest
from test_critic_server import chat_body, post

from pipeline.core.errors import CriticError
from pipeline.critic.align import match_items
from pipeline.critic.offline.lexicon import LAYOUTS, answer
from pipeline.critic.offline.server import make_server, serve_in_background
from pipeline.critic.parse import parse_answer

PROMPTS = Path(__file__).resolve().parents[1] / "prompts"
WORDS = ("the movie was not good but the cast was very charming and the plot dull awful wonderful "
         "shut up you stupid idiot kind fine boring really great").split()


def texts(n=40):
    rng = random.Random(1)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 14))).capitalize() + "." for _ in range(n)]


def kept(template, raw, response):
    parsed = parse_answer(raw, labels=template.labels, leading_label=template.leading_label)
    spans, dropped = match_items(parsed.items, response, rewards={label: 1.0 for label in template.labels})
    assert dropped == [], raw
    return parsed.status, spans


@pytest.mark.parametrize("task", ["sentiment", "toxicity", "summarization"])
@pytest.mark.parametrize("layout", [f for f in LAYOUTS if f != "drlc"])
def test_every_layout_keeps_the_drlc_formats_spans(task, layout):
    from pipeline.critic.templates import load_template

    template = load_template(PROMPTS / f"{task}.md")
    answers = []
    for text in texts():
        fields = {"response": text} if task != "summarization" else \
            {"document": "The cast was good.", "summary": text, "score": "0.2"}
        messages = template.render(fields)
        drlc, other = answer(messages), answer(messages, layout=layout)
        response = fields.get("response", fields.get("summary"))
        assert kept(template, other, response) == kept(template, drlc, response)
        answers.append(other)
    assert all(a != answer(template.render({"response": "x"} if task != "summarization" else
                                           {"document": "x", "summary": "x", "score": "0"})) for a in answers)
    if layout == "messy":  # several habits show up across 40 answers
        assert any("\r\n" in a for a in answers) and len({a.split("\n")[0][:6] for a in answers}) >= 3


def test_layout_is_served_over_http_and_checked():
    from pipeline.critic.templates import load_template

    messages = load_template(PROMPTS / "sentiment.md").render({"response": "The plot was awful."})
    with serve_in_background(backend="lexicon", layout="paper") as (url, _):
        status, _, body = post(url, chat_body(messages))
    assert status == 200
    assert json.loads(body)["choices"][0]["message"]["content"] == answer(messages, layout="paper")
    assert "Identified Negative Text Span:\n[Span 1]: awful" in answer(messages, layout="paper")
    with pytest.raises(CriticError, match="only used by backend 'lexicon'"):
        make_server(backend="echo", layout="messy")
    with pytest.raises(CriticError, match="unknown lexicon layout 'yaml'"):
        make_server(backend="lexicon", layout="yaml")


def test_cli_offers_every_layout():
    from pipeline.commands.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["critic", "serve", "--layout", "messy"])
    assert args.layout == "messy"
    serve = parser._subparsers._group_actions[0].choices["critic"]._subparsers._group_actions[0].choices["serve"]
    choices = next(a.choices for a in serve._actions if a.dest == "layout")
    assert tuple(choices) == LAYOUTS
