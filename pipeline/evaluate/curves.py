"""Per-round training curves, read from the run's tables with DuckDB (DVC plots read the result).

Columns of each round (CURVE_COLUMNS): env_reward_mean = mean environment reward of the
round's rollouts; intrinsic_reward_sum = mean over responses of the summed critic token
rewards; kl, kl_coef = mean over the round's PPO steps; critic_calls = responses sent to the
critic (cached or not); cache_hits; cache_hit_rate = cache_hits / critic_calls (0 when no
call); cost_usd = critic spend of the round; cost_usd_total = spend up to and including it.
"""
from __future__ import annotations

from pathlib import Path

from pipeline.store import connect

CURVE_COLUMNS = ["env_reward_mean", "intrinsic_reward_sum", "kl", "kl_coef", "critic_calls", "cache_hits",
                 "cache_hit_rate", "cost_usd", "cost_usd_total"]

CURVES_SQL = """
WITH per_round AS (
    SELECT s.round,
           avg(s.env_reward)                                        AS env_reward_mean,
           avg(coalesce(list_sum(a.token_rewards), 0.0))            AS intrinsic_reward_sum,
           sum(a.critiqued::INT)                                    AS critic_calls,
           sum((a.critiqued AND coalesce(a.cache_hit, false))::INT) AS cache_hits,
           coalesce(sum(a.cost_usd), 0.0)                           AS cost_usd
    FROM scores s JOIN annotations a USING (round, rollout_id)
    GROUP BY s.round
)
SELECT r.round, r.env_reward_mean, r.intrinsic_reward_sum, p.kl, p.kl_coef, r.critic_calls, r.cache_hits,
       coalesce(r.cache_hits / nullif(r.critic_calls, 0), 0.0)    AS cache_hit_rate,
       r.cost_usd,
       sum(r.cost_usd) OVER (ORDER BY r.round)                    AS cost_usd_total
FROM per_round r
JOIN (SELECT round, avg(kl) AS kl, avg(kl_coef) AS kl_coef FROM ppo_steps GROUP BY round) p USING (round)
ORDER BY r.round
"""


def round_curves(data_root: str | Path) -> list[dict]:
    """One dict per round: `round` and the CURVE_COLUMNS (floats rounded to 6 decimals)."""
    result = connect(data_root).sql(CURVES_SQL)
    names = [d[0] for d in result.description]
    return [{name: (round(v, 6) if isinstance(v, float) else v) for name, v in zip(names, row)}
            for row in result.fetchall()]
