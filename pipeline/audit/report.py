"""The Markdown report of a critic audit (`drlc critic eval`): one table row per critic scored."""
from __future__ import annotations

__all__ = ["render_report"]

_DESCRIPTIONS = {
    "configured": "the critic of the params file",
    "lexicon": "drlc's offline lexicon critic (local server)",
    "everything": "baseline: the whole post is a span",
    "nothing": "baseline: no span",
    "wordlist": "baseline: words labelled in > half their train occurrences",
}


def _number(value, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def render_report(summary: dict) -> str:
    """The report text: what was audited, then one row per critic (scores, statuses, calls, cost)."""
    sample = f"A seeded sample (seed {summary['seed']}) of" if summary["limit"] else "All"
    wordlist = ""
    if summary["train_file"]:
        kind = "in-sample: learnt on the same posts" if summary["wordlist_in_sample"] else "learnt on"
        wordlist = f" Word list {kind} `{summary['train_file']}`."
    statuses = list(next(iter(summary["critics"].values()))["status_share"])  # the audit writes every status
    lines = [
        f"# Critic audit: {summary['audit']}",
        "",
        f"{sample} {summary['n_posts']} posts of `{summary['spans_file']}` ({summary['n_posts_with_gold']} with "
        f"gold spans); template `{summary['template']}` (sha256 {summary['template_sha'][:12]}), critic "
        f"`{summary['critic_endpoint']}`.{wordlist}",
        "",
        "Char F1: SemEval-2021 Task 5 character F1, mean over posts (no gold and no prediction = 1). "
        f"Span P/R: a predicted span matches a gold span with the {summary['span_match']}. "
        "Absent: share of proposed spans found nowhere in the post. Calls: HTTP requests sent.",
        "",
        "Status columns: share of posts per answer status (every status the audit counts; they sum to 1).",
        "",
        f"| critic | model | char F1 | span P | span R | {' | '.join(s.replace('_', ' ') for s in statuses)} "
        "| absent | calls | cache hits | cost USD |",
        "|---" * (len(statuses) + 9) + "|",
    ]
    for name, c in summary["critics"].items():
        shares = " | ".join(_number(c["status_share"].get(status), 2) for status in statuses)
        lines.append(
            f"| {name} | {c['critic_model']} | {_number(c['char_f1'])} | {_number(c['span_precision'])} "
            f"| {_number(c['span_recall'])} | {shares} "
            f"| {_number(c['absent_span_share'], 2)} | {c['requests_sent']} | {c['cache_hits']} "
            f"| {c['cost_usd']:.4f} |"
        )
    lines += ["", *(f"- {name}: {_DESCRIPTIONS[name]}" for name in summary["critics"])]
    if summary["lexicon_is_configured"]:
        lines.append("- the configured critic is the lexicon critic, so it is not scored twice")
    return "\n".join(lines) + "\n"
