"""Per-round training curves, read from the run's tables with DuckDB (DVC plots read the result)."""
from __future__ import annotations

from pathlib import Path

from pipeline.store import connect

CURVES_SQL = """
SELECT s.round,
       avg(s.env_reward)                               AS env_reward_mean,
       avg(list_sum(a.token_rewards))                  AS intrinsic_reward_sum,
       sum(a.critiqued::INT)                           AS critic_calls,
       sum((a.critiqued AND a.cache_hit)::INT)         AS cache_hits,
       sum(a.cost_usd)                                 AS cost_usd,
       any_value(p.kl)                                 AS kl,
       any_value(p.kl_coef)                            AS kl_coef
FROM scores s
JOIN annotations a USING (round, rollout_id)
JOIN (SELECT round, avg(kl) AS kl, avg(kl_coef) AS kl_coef FROM ppo_steps GROUP BY round) p USING (round)
GROUP BY s.round ORDER BY s.round
"""


def round_curves(data_root: str | Path) -> list[dict]:
    """One dict per round: env reward, summed intrinsic reward per response, critic calls, KL."""
    con = connect(data_root)
    rows = con.sql(CURVES_SQL).fetchall()
    names = [d[0] for d in con.sql(CURVES_SQL).description]
    return [{name: (round(v, 6) if isinstance(v, float) else v) for name, v in zip(names, row)} for row in rows]
