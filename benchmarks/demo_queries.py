"""docs/results.md's "Query the run" outputs, made by running its queries on a finished demo run.

The SQL lives here, once: `run_queries` runs every query of `QUERIES` against a project's
tables (`pipeline.core.store.connect` over `<project>/data`) and records queries, column names and
rows with the run's provenance (git commit, sha256 of its dvc.lock, torch thread count,
machine). `render` turns that JSON, and only that JSON, into the Markdown that sits in
docs/results.md between `BLOCK_START` and `BLOCK_END`; tests/test_readme_queries.py regenerates
it from the committed JSON and compares, so the SQL shown is the SQL run and the numbers shown
are the numbers recorded; tests/test_e2e_demo_queries.py (slow) runs a fresh default demo and
compares its rows with the committed JSON, so a code change that moves a number fails there.

Usage:
    git clone . /tmp/demo_run && (cd /tmp/demo_run && dvc repro)     # a fresh demo run
    python benchmarks/demo_queries.py --project /tmp/demo_run --doc docs/results.md
Writes benchmarks/results/demo_queries.json (or --out); --doc also splices the section into that page.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import textwrap
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import DataError
from pipeline.studies import generated_blocks

ROOT = Path(__file__).resolve().parents[1]

BLOCK_START = "<!-- demo-queries:begin -->"  # the block of docs/results.md this script owns
BLOCK_END = "<!-- demo-queries:end -->"
RESULT = ROOT / "benchmarks" / "results" / "demo_queries.json"


@dataclass(frozen=True)
class Query:
    """One query of docs/results.md: the sentence above it, its SQL, and an optional note below its table."""

    key: str
    intro: str
    sql: str
    note: str = ""


QUERIES: tuple[Query, ...] = (
    Query(
        "critic_calls",
        "Critic calls and cache hits per round (`critic_requests`: HTTP attempts actually sent, "
        "retries included, 0 for a cache hit and for a repeat within the round; the stage line's number):",
        """SELECT round, count(*) FILTER (WHERE critiqued) AS critiqued,
       count(*) FILTER (WHERE critiqued AND cache_hit) AS cache_hits,
       coalesce(sum(attempts), 0) AS critic_requests
FROM annotations GROUP BY round ORDER BY round""",
        "(On a first run, the hits are responses identical to one answered in an earlier round: every "
        "round shares the cache. A response repeated within a round is sent once, and its repeats are "
        "neither requests nor hits. A `dvc repro --force` hits the cache for every call and sends no request.)",
    ),
    Query(
        "negative_spans",
        "The 10 most frequent negative spans:",
        """SELECT lower(s.text) AS span, count(*) AS n
FROM (SELECT unnest(spans) AS s FROM annotations)
WHERE s.label = 'negative' GROUP BY span ORDER BY n DESC, span LIMIT 10""",
    ),
    Query(
        "reward_correlation",
        "Correlation of the environment reward with the summed intrinsic reward of critiqued responses:",
        """SELECT round, corr(s.env_reward, list_sum(a.token_rewards)) AS corr, count(*) AS n
FROM scores s JOIN annotations a USING (round, rollout_id)
WHERE a.critiqued GROUP BY round ORDER BY round""",
    ),
    Query(
        "statuses",
        "What the critic's answers gave, per round (`ok`: spans kept; `none`: the answer names "
        "nothing; `no_match`: items read, none kept; `parse_error`: no item could be read; "
        "`failed`: `api_error`, `truncated` or `budget`):",
        """SELECT round, count(*) FILTER (WHERE status = 'ok') AS ok,
       count(*) FILTER (WHERE status = 'none') AS "none",
       count(*) FILTER (WHERE status = 'no_match') AS no_match,
       count(*) FILTER (WHERE status = 'parse_error') AS parse_error,
       count(*) FILTER (WHERE status IN ('api_error', 'truncated', 'budget')) AS failed,
       round(avg((status = 'parse_error')::INT), 4) AS parse_error_rate
FROM annotations WHERE critiqued GROUP BY round ORDER BY round""",
    ),
    Query(
        "items",
        "What the critic named and what became spans, per round (`spans`: one per aligned occurrence, "
        "so an item found twice gives two; `dropped`: items that gave no span, each with its reason):",
        """SELECT round, sum(len(items)) AS items, sum(len(spans)) AS spans, sum(len(dropped)) AS dropped
FROM annotations WHERE critiqued GROUP BY round ORDER BY round""",
    ),
    Query(
        "cost",
        "Cost per round, and what the same tokens would cost at gpt-3.5-turbo prices ($0.5 / $1.5 per "
        "1M prompt / completion tokens; the local server counts whitespace-separated words as tokens):",
        """SELECT round, sum(cost_usd) AS cost_usd, sum(prompt_tokens) AS prompt_tokens,
       sum(completion_tokens) AS completion_tokens,
       round(sum(prompt_tokens) * 0.5e-6 + sum(completion_tokens) * 1.5e-6, 4) AS at_gpt35_usd
FROM annotations GROUP BY round ORDER BY round""",
    ),
)


def _json_value(value):
    """A DuckDB value as JSON (HUGEINT sums arrive as int, DECIMAL as Decimal)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    from decimal import Decimal

    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return str(value)


def _git(project: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(project), *args], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else ""


def _cpuinfo(field: str, cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The first value of `field` in /proc/cpuinfo (Linux), else None."""
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    return next((line.split(":", 1)[1].strip() for line in lines if line.split(":", 1)[0].strip() == field), None)


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo, else the machine type (x86_64, arm64).

    Read without a process: platform.processor() runs `uname -p` on Linux and macOS.
    """
    return _cpuinfo("model name") or platform.machine()


VECTOR_FLAG_PREFIXES = ("sse", "ssse", "avx", "fma", "f16c", "amx")


def cpu_isa() -> list[str]:
    """The CPU's vector-instruction flags (SSE, AVX, AVX-512, FMA, AMX) from /proc/cpuinfo, sorted.

    A VM's model name can hide the generation ("AMD EPYC" covers Zen 2 to Zen 5), while torch's and
    oneDNN's kernels dispatch on these flags, and so sum in another order where they differ.
    """
    return vector_flags(_cpuinfo("flags") or "")


def vector_flags(flags: str) -> list[str]:
    """The vector-instruction flags of a cpuinfo `flags` value, sorted and each once."""
    return sorted({flag for flag in flags.split() if flag.startswith(VECTOR_FLAG_PREFIXES)})


def platform_name() -> str:
    """System, kernel release, machine and C library: on Linux the string platform.platform() gives
    (Linux-6.1.0-x86_64-with-glibc2.36), read without the `uname -p` process it runs to name a
    processor it then leaves out there ('unknown', or the machine type again)."""
    libc = "".join(platform.libc_ver())
    return "-".join(part for part in (platform.system(), platform.release(), platform.machine()) if part) \
        + (f"-with-{libc}" if libc else "")


def provenance(project: Path) -> dict:
    """Which run the rows come from, and the machine and thread count it ran with."""
    import duckdb
    import torch

    lock = project / "dvc.lock"
    return {
        "git_commit": _git(project, "rev-parse", "HEAD"),
        "git_modified": sorted(line[3:] for line in _git(project, "status", "--porcelain", "--untracked-files=no").splitlines()),
        "dvc_lock_sha256": hashlib.sha256(lock.read_bytes()).hexdigest() if lock.is_file() else None,
        # The stages set no thread count (except the base model's pretraining, which uses 1), so
        # the run used torch's default for a fresh process in this environment: this one's.
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "machine": {"cpu": cpu_name(), "cpu_isa": cpu_isa(),
                    "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
                    "cpus": os.cpu_count(), "platform": platform_name(),
                    "python": platform.python_version(), "torch": torch.__version__, "duckdb": duckdb.__version__},
    }


def run_queries(project: Path) -> dict:
    """Every query of QUERIES on `<project>/data`, with the run's provenance.

    Raises DataError if the project has no annotations table (run `dvc repro` there first).
    """
    from pipeline.core.store import connect

    con = connect(project / "data")
    if not con.sql("SELECT 1 FROM duckdb_views() WHERE view_name = 'annotations'").fetchall():
        raise DataError(f"No annotations table under '{project / 'data'}': run `dvc repro` in {project} first.")
    results = []
    for q in QUERIES:
        rel = con.sql(q.sql)
        results.append({"key": q.key, "intro": q.intro, "sql": q.sql, "note": q.note, "columns": list(rel.columns),
                        "types": [str(t) for t in rel.types],
                        "rows": [[_json_value(v) for v in row] for row in rel.fetchall()]})
    return {"provenance": provenance(project), "queries": results}


def _cell(value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return format(value, ".4g")
    return str(value)


def _table(columns: list[str], rows: list[list]) -> list[str]:
    numeric = [all(isinstance(r[i], (int, float)) or r[i] is None for r in rows) for i in range(len(columns))]
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---:" if n else ":---" for n in numeric) + "|"]
    return lines + ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]


def _prose(text: str) -> list[str]:
    return textwrap.wrap(text, width=100, break_long_words=False, break_on_hyphens=False)


def render(result: dict) -> str:
    """The docs/results.md section (without its markers) from a demo_queries.json result."""
    p = result["provenance"]
    machine = p["machine"]
    lines = _prose(
        f"The outputs below were made by `python benchmarks/demo_queries.py` on a fresh demo run "
        f"(`dvc repro` with the default params.yaml) of commit `{p['git_commit'][:12]}`, on "
        f"{machine['cpus']} CPUs ({machine['cpu']}, torch's {machine['torch_cpu_capability']} kernels) with "
        f"**{p['torch_threads']} torch thread(s)**, "
        f"torch {machine['torch']}; the rows are in `benchmarks/results/demo_queries.json`. The demo "
        f"is seeded and single-process, so a fresh `dvc repro` of that commit on the same kind of machine "
        f"with the same thread count gives these same rows (checked: a second fresh run, of another "
        f"commit with the same pipeline numbers, gave every row identically). "
        f"With another thread count (or CPU: a VM's model name can hide its generation, so the JSON also "
        f"records the CPU's vector-instruction flags), torch sums in another order, so floating-point results "
        f"differ in their last bits; sampling and the reward threshold turn that into other rollouts, "
        f"and every number below may change.") + [""]
    for q in result["queries"]:
        lines += _prose(q["intro"]) + ["", "```sql", q["sql"], "```", ""] + _table(q["columns"], q["rows"]) + [""]
        if q["note"]:
            lines += _prose(q["note"]) + [""]
    return "\n".join(lines)


def splice_block(text: str, markdown: str) -> str:
    """A page's text (docs/results.md) with the part between the demo-queries markers replaced by markdown."""
    return generated_blocks.splice(text, markdown, BLOCK_START, BLOCK_END)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, default=ROOT, help="a finished demo run (default: the repo root)")
    parser.add_argument("--out", type=Path, default=RESULT)
    parser.add_argument("--doc", type=Path, help="also splice the rendered section into this page (docs/results.md)")
    args = parser.parse_args(argv)
    result = run_queries(args.project.resolve())
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    if args.doc:
        args.doc.write_text(splice_block(args.doc.read_text(), render(result)))
        print(f"spliced {args.doc}")


if __name__ == "__main__":
    main()
