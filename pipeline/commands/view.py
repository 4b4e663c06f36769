"""`drlc view RUN`: one self-contained HTML page of what the critic marked and what it did to each token's reward.

The page (`<run>/reports/view.html` by default) needs no network: its data sit in the page as JSON
and a short script renders them. For each critiqued response: the prompt, the response token by
token shaded by its reward, the parts PPO adds (README, "Where each reward is computed"):

- env reward: the scorer's, on the last token, as PPO put it there (`scores.env_reward_shaped`: pipeline/rewards/,
  then score.scale and score.normalize, pipeline/rewards/shaping.py);
- critic: the span rewards per token, toggled per label (`annotations.token_rewards`, pipeline/critic/align.py);
- KL penalty: −β·KL per token as the round's PPO used it (`kl_rewards.kl_reward`, written by the ppo stage
  from pipeline/train/ppo.py token_kl_rewards; rloo: the per-token terms of its sequence penalty; grpo:
  none, its KL is a loss term). A round whose ppo stage has not run yet has no KL part (shown as such).

Each part has a toggle. Also: the critic's raw answer, the status, the kept spans and the dropped
items with their reasons. Filters by round, status, label and env reward; a per-round summary at
the top; 25 rows a page, so thousands of rows stay fast.
"""
from __future__ import annotations

import html
import json
from pathlib import Path

from pipeline.core.errors import DataError

ROWS_SQL = """
SELECT a.round, a.rollout_id, r.query, r.response, r.response_ids, s.env_reward_shaped, a.status, a.raw_text,
       a.spans, a.dropped, a.token_rewards, a.cache_hit, a.attempts, a.error, {kl} AS kl_reward, {kind} AS kl_kind
FROM annotations a JOIN rollouts r USING (round, rollout_id) JOIN scores s USING (round, rollout_id) {join}
WHERE a.critiqued ORDER BY a.round, a.rollout_id
"""
KL_JOIN = "LEFT JOIN kl_rewards k USING (round, rollout_id)"


def rows_sql(has_kl: bool) -> str:
    """ROWS_SQL, with the ppo stage's per-token KL reward when the run has a kl_rewards table (else null)."""
    if has_kl:
        return ROWS_SQL.format(kl="k.kl_reward", kind="k.algorithm", join=KL_JOIN)
    return ROWS_SQL.format(kl="NULL::DOUBLE[]", kind="NULL::VARCHAR", join="")


def view_rows(data_dir: str | Path, tokenizer) -> list[dict]:
    """One dict per critiqued response, with its tokens' text (decoded one by one) and character offsets."""
    from pipeline.core.store import connect

    con = connect(data_dir)
    views = {name for (name,) in con.sql("SELECT view_name FROM duckdb_views()").fetchall()}
    missing = [table for table in ("annotations", "rollouts", "scores") if table not in views]
    if missing:
        raise DataError(f"No {', '.join(missing)} table under '{data_dir}': run `dvc repro` with critic.enabled "
                        "first, or name a finished run's folder: `drlc view RUN`.")
    has_kl = "kl_rewards" in views
    rows = con.sql(rows_sql(has_kl)).df().to_dict("records")
    if not rows:
        raise DataError(f"No critiqued responses under '{data_dir}': run `dvc repro` with critic.enabled first.")
    return [_row(row, tokenizer) for row in rows]


def _row(row: dict, tokenizer) -> dict:
    tokens = [tokenizer.decode([int(t)], skip_special_tokens=False) for t in row["response_ids"]]
    return {
        "round": int(row["round"]), "id": row["rollout_id"], "query": row["query"], "response": row["response"],
        "tokens": tokens, "env": float(row["env_reward_shaped"]), "status": row["status"], "raw": row["raw_text"] or "",
        "critic": [float(x) for x in row["token_rewards"]], "error": row["error"] or "",
        "spans": [{k: _plain(s[k]) for k in ("label", "text", "start", "end", "reward")} for s in row["spans"]],
        "dropped": [{k: _plain(d[k]) for k in ("label", "text", "reason")} for d in row["dropped"]],
        "cache_hit": bool(row["cache_hit"]), "attempts": int(row["attempts"] or 0),
        "kl": None if _null(row["kl_reward"]) else [float(x) for x in row["kl_reward"]],
        "kl_kind": _kl_kind(row["kl_kind"]),
    }


def _kl_kind(algorithm) -> str:
    """What the row's KL part is, for the page: none stored, a per-token reward, or a loss term (grpo)."""
    if _null(algorithm):  # no kl_rewards row
        return "no KL stored for this round (its ppo stage has not run)"
    if algorithm == "grpo":
        return "grpo: KL is a loss term, not a reward"
    return f"{algorithm}: -beta*KL per token"


def _null(value) -> bool:
    return value is None or (isinstance(value, float) and value != value)  # pandas gives NaN for some nulls


def _plain(value):
    return value.item() if hasattr(value, "item") else value


def write_view(run_dir: str | Path, out: str | Path | None = None, tokenizer_dir: str | Path | None = None) -> Path:
    """Write the page for the finished run in `run_dir` (its data/ and models/base); returns its path."""
    from pipeline.critic.align import load_decoding_tokenizer

    run = Path(run_dir)
    tokenizer_dir = Path(tokenizer_dir or run / "models" / "base")
    if not tokenizer_dir.is_dir():
        raise DataError(f"Tokenizer folder '{tokenizer_dir}' not found: pass --tokenizer (the run's models/base).")
    rows = view_rows(run / "data", load_decoding_tokenizer(tokenizer_dir))
    path = Path(out or run / "reports" / "view.html")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_page(rows, title=f"drlc view: {run.resolve().name}"), encoding="utf-8")
    return path


def render_page(rows: list[dict], *, title: str) -> str:
    """The HTML page: data as JSON in the page, rendered by PAGE_SCRIPT (no external resource)."""
    data = json.dumps(rows, ensure_ascii=True).replace("</", "<\\/")  # no `</script>` inside the JSON
    return PAGE.replace("{title}", html.escape(title)).replace("{data}", data).replace("{script}", PAGE_SCRIPT)


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'">
<style>
body{font:14px system-ui,sans-serif;margin:1em 2em;color:#222}
table.summary{border-collapse:collapse}table.summary td,table.summary th{border:1px solid #ccc;padding:2px 8px;text-align:right}
#filters label{margin-right:1em}.row{border-top:1px solid #ddd;padding:.6em 0}
.meta{color:#555;font-size:12px}.prompt{color:#666}.tok{white-space:pre;border-radius:2px}
.tok.spanned{text-decoration:underline}pre.raw{background:#f6f6f6;padding:4px;white-space:pre-wrap;margin:2px 0}
#pager button{margin:0 .3em}
</style></head><body>
<h1>{title}</h1>
<h2>Per round</h2><table class="summary" id="summary"></table>
<h2>Responses</h2>
<div id="filters">
<label>round <select id="f-round"><option value="">all</option></select></label>
<label>status <select id="f-status"><option value="">all</option></select></label>
<label>label <select id="f-label"><option value="">any</option></select></label>
<label>env reward from <input id="f-env-min" type="number" step="any" size="6"> to
<input id="f-env-max" type="number" step="any" size="6"></label>
</div>
<div id="toggles">shade by: <label><input type="checkbox" id="t-env" checked> env reward (last token)</label>
<span id="t-labels"></span>
<label><input type="checkbox" id="t-kl" checked> KL penalty (&minus;&beta;&middot;KL per token, as PPO used it)</label>
</div>
<div id="pager"></div><div id="count"></div><div id="rows"></div>
<script type="application/json" id="data">{data}</script>
<script>{script}</script>
</body></html>
"""

PAGE_SCRIPT = r"""
const ROWS = JSON.parse(document.getElementById('data').textContent);
const PAGE_SIZE = 25;
let page = 0;
const $ = (id) => document.getElementById(id);
const el = (tag, props, ...kids) => { const e = document.createElement(tag); Object.assign(e, props || {});
  kids.forEach(k => e.append(k)); return e; };
const uniq = (xs) => [...new Set(xs)].sort((a, b) => a < b ? -1 : a > b ? 1 : 0);
const LABELS = uniq(ROWS.flatMap(r => r.spans.map(s => s.label)));

function tokenLabels(row) {  // label of the kept span(s) each token overlaps, by character offsets
  let at = 0;
  return row.tokens.map(t => { const start = at, end = at + t.length; at = end;
    return uniq(row.spans.filter(s => s.start < end && s.end > start).map(s => s.label)); });
}
function shade(v) {  // green for positive reward, red for negative; saturates at |v| = 1
  const a = Math.min(1, Math.abs(v)) * 0.6;
  return v >= 0 ? `rgba(0,160,0,${a})` : `rgba(220,0,0,${a})`;
}
function tokenReward(row, j, labels) {
  let v = 0;
  if ($('t-env').checked && j === row.tokens.length - 1) v += row.env;
  if (labels[j].length === 0 || labels[j].some(l => { const t = $('t-label-' + l); return !t || t.checked; }))
    v += row.critic[j] || 0;
  if ($('t-kl').checked && row.kl) v += row.kl[j] || 0;
  return v;
}
function filtered() {
  const round = $('f-round').value, status = $('f-status').value, label = $('f-label').value;
  const lo = $('f-env-min').value, hi = $('f-env-max').value;
  return ROWS.filter(r => (!round || r.round === Number(round)) && (!status || r.status === status)
    && (!label || r.spans.some(s => s.label === label))
    && (lo === '' || r.env >= Number(lo)) && (hi === '' || r.env <= Number(hi)));
}
function renderRow(row) {
  const labels = tokenLabels(row);
  const response = el('div', {className: 'response'});
  row.tokens.forEach((t, j) => {
    const r = tokenReward(row, j, labels);
    const s = el('span', {className: 'tok' + (labels[j].length ? ' spanned' : ''), textContent: t,
      title: `token ${j}: critic ${(row.critic[j] || 0).toFixed(3)}, `
        + (row.kl ? `KL ${(row.kl[j] || 0).toFixed(4)}` : row.kl_kind) + (j === row.tokens.length - 1 ?
        `, env ${row.env.toFixed(3)}` : '') + (labels[j].length ? ` [${labels[j].join(', ')}]` : '')});
    s.style.background = shade(r); s.dataset.reward = r.toFixed(6);
    if (row.kl) s.dataset.kl = row.kl[j] || 0;
    response.append(s);
  });
  const spans = el('ul', {className: 'spans'}, ...row.spans.map(s => { const li = el('li', {className: 'span',
    textContent: `kept ${s.label} "${s.text}" [${s.start}, ${s.end}) reward ${s.reward}`});
    Object.assign(li.dataset, {label: s.label, start: s.start, end: s.end, text: s.text}); return li; }),
    ...row.dropped.map(d => el('li', {className: 'dropped', textContent: `dropped ${d.label} "${d.text}": ${d.reason}`})));
  const div = el('div', {className: 'row'},
    el('div', {className: 'meta', textContent: `round ${row.round} · ${row.id} · status ${row.status} · env reward `
      + `${row.env.toFixed(3)} · ${row.cache_hit ? 'cache hit' : row.attempts + ' attempt(s)'} · ${row.kl_kind}`
      + (row.error ? ` · ${row.error}` : '')}),
    el('div', {className: 'prompt', textContent: 'prompt: ' + row.query}), response, spans,
    el('details', {}, el('summary', {textContent: 'raw critic answer'}), el('pre', {className: 'raw', textContent: row.raw})));
  div.dataset.id = row.id; div.dataset.round = row.round; div.dataset.status = row.status;
  return div;
}
function render() {
  const rows = filtered(), pages = Math.max(1, Math.ceil(rows.length / PAGE_SIZE));
  page = Math.min(page, pages - 1);
  $('count').textContent = `${rows.length} of ${ROWS.length} critiqued responses`;
  $('rows').replaceChildren(...rows.slice(page * PAGE_SIZE, (page + 1) * PAGE_SIZE).map(renderRow));
  const prev = el('button', {textContent: 'previous', disabled: page === 0, onclick: () => { page--; render(); }});
  const next = el('button', {id: 'next', textContent: 'next', disabled: page >= pages - 1, onclick: () => { page++; render(); }});
  $('pager').replaceChildren(prev, `page ${page + 1} of ${pages}`, next);
}
function summary() {
  const head = el('tr', {}, ...['round', 'critiqued', 'ok', 'other statuses', 'spans', 'mean env reward',
    'critic reward sum', 'KL reward sum'].map(h => el('th', {textContent: h})));
  const body = uniq(ROWS.map(r => r.round)).map(round => { const rs = ROWS.filter(r => r.round === round);
    const other = rs.filter(r => r.status !== 'ok').length;
    const cells = [round, rs.length, rs.length - other, other, rs.reduce((n, r) => n + r.spans.length, 0),
      (rs.reduce((n, r) => n + r.env, 0) / rs.length).toFixed(3),
      rs.reduce((n, r) => n + r.critic.reduce((a, b) => a + b, 0), 0).toFixed(3),
      rs.some(r => r.kl) ? rs.reduce((n, r) => n + (r.kl || []).reduce((a, b) => a + b, 0), 0).toFixed(4) : 'n/a'];
    return el('tr', {}, ...cells.map(c => el('td', {textContent: String(c)}))); });
  $('summary').replaceChildren(head, ...body);
}
uniq(ROWS.map(r => r.round)).forEach(r => $('f-round').append(el('option', {value: r, textContent: r})));
uniq(ROWS.map(r => r.status)).forEach(s => $('f-status').append(el('option', {value: s, textContent: s})));
LABELS.forEach(l => { $('f-label').append(el('option', {value: l, textContent: l}));
  $('t-labels').append(el('label', {}, el('input', {type: 'checkbox', id: 't-label-' + l, checked: true}),
    ` critic: ${l}`)); });
document.querySelectorAll('select, input').forEach(i => i.addEventListener('change', () => { page = 0; render(); }));
summary(); render();
"""
