"""Per-round training curves, read from the run's tables with DuckDB (DVC plots read the result).

Each name is defined once in docs/metrics.md. Per round (CURVE_COLUMNS): env_reward_mean (scores, the
task's units), env_reward_shaped_mean (scores, as PPO read it: score.scale, score.normalize), intrinsic_reward_sum, kl and kl_coef (ppo_steps: what the trainer used), critiqued,
critic_requests (the annotations' `attempts`: HTTP attempts actually sent, 0 for a cache hit),
cache_hits, cache_hit_rate, critic_tokens, critic_cost_usd and critic_cost_usd_total (annotations).
"""
from __future__ import annotations

from pathlib import Path

from pipeline.core.errors import DataError
from pipeline.core.store import connect

CURVE_COLUMNS = ["env_reward_mean", "env_reward_shaped_mean", "intrinsic_reward_sum", "kl", "kl_coef", "critiqued",
                 "critic_requests", "cache_hits", "cache_hit_rate", "critic_tokens", "critic_cost_usd",
                 "critic_cost_usd_total"]

CURVES_SQL = """
WITH per_round AS (
    SELECT s.round,
           avg(s.env_reward)                                        AS env_reward_mean,
           avg(s.env_reward_shaped)                                 AS env_reward_shaped_mean,
           sum(a.critiqued::INT)                                    AS critiqued,
           sum(a.attempts)                                          AS critic_requests,
           sum((a.critiqued AND coalesce(a.cache_hit, false))::INT) AS cache_hits,
           sum(CASE WHEN a.attempts > 0 THEN coalesce(a.prompt_tokens, 0) + coalesce(a.completion_tokens, 0)
                    ELSE 0 END)                                     AS critic_tokens,
           coalesce(sum(a.cost_usd), 0.0)                           AS critic_cost_usd
    FROM scores s JOIN annotations a USING (round, rollout_id)
    GROUP BY s.round
), ppo AS (
    SELECT round, avg(intrinsic_reward_sum) AS intrinsic_reward_sum, avg(kl) AS kl, avg(kl_coef) AS kl_coef
    FROM ppo_steps GROUP BY round
)
SELECT r.round, r.env_reward_mean, r.env_reward_shaped_mean, p.intrinsic_reward_sum, p.kl, p.kl_coef, r.critiqued, r.critic_requests,
       r.cache_hits, coalesce(r.cache_hits / nullif(r.critiqued, 0), 0.0) AS cache_hit_rate,
       r.critic_tokens, r.critic_cost_usd, sum(r.critic_cost_usd) OVER (ORDER BY r.round) AS critic_cost_usd_total
FROM per_round r JOIN ppo p USING (round)
ORDER BY r.round
"""


def round_curves(data_root: str | Path) -> list[dict]:
    """One dict per round: `round` and the CURVE_COLUMNS (floats rounded to 6 decimals).

    Raises DataError when the annotations lack `attempts` (tables written before the column existed).
    """
    con = connect(data_root)
    _check_attempts(con)
    result = con.sql(CURVES_SQL)
    names = [d[0] for d in result.description]
    return [{name: (round(v, 6) if isinstance(v, float) else v) for name, v in zip(names, row)}
            for row in result.fetchall()]


def _check_attempts(con) -> None:
    """critic_requests is the sum of annotations.attempts: a missing or null column is an error, never a 0."""
    columns = [d[0] for d in con.sql("SELECT * FROM annotations LIMIT 0").description]
    if "attempts" not in columns:
        raise DataError("The annotations table has no 'attempts' column (HTTP attempts per row), so critic_requests "
                        "cannot be counted: re-run each round's critique stage with this drlc "
                        "(`dvc repro --force critique@<round>`; cached answers cost nothing).")
    rounds = [r for (r,) in con.sql("SELECT DISTINCT round FROM annotations WHERE attempts IS NULL ORDER BY round")
              .fetchall()]
    if rounds:
        raise DataError(f"The annotations of rounds {rounds} have no 'attempts' values (written by an older drlc): "
                        f"re-run their critique stages (`dvc repro --force critique@<round>`).")
