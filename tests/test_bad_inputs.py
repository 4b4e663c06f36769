"""Bad input stops with one stderr line naming the value and the fix, exit code 2, no output.

`drlc` and the stage scripts run in the test process (tests/inprocess.py); the two `slow` tests at the
end run one of each as a real process."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from inprocess import drlc, stage

ROOT = Path(__file__).resolve().parents[1]


def assert_clean_failure(result, *needles):
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture
def workdir(tmp_path):
    shutil.copytree(ROOT / "prompts", tmp_path / "prompts")
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    return tmp_path


def edit_params(workdir, edit):
    raw = yaml.safe_load((workdir / "params.yaml").read_text())
    edit(raw)
    (workdir / "params.yaml").write_text(yaml.safe_dump(raw))


def test_demo_params_pass_the_check(workdir):
    result = drlc(["check"], workdir)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


@pytest.mark.parametrize("edit, needles", [
    (lambda r: r["ppo"].update(learnig_rate=0.1), ["ppo.learnig_rate", "learning_rate"]),
    (lambda r: r["rollout"].update(max_new_tokens="20"), ["rollout.max_new_tokens", "'20'", "int"]),
    (lambda r: r["critic"].update(alignment="fuzzy"), ["critic.alignment", "'fuzzy'", "exact"]),
    (lambda r: r["critic"].update(rewards={"positive": 0.5, "toxic": -1.0}), ["toxic", "positive"]),
    (lambda r: r["critic"].update(template="prompts/missing.md"), ["prompts/missing.md"]),
    (lambda r: r["critic"].update(endpoint="api.example.com/v1"), ["critic.endpoint", "api.example.com/v1"]),
    (lambda r: r["critic"].update(endpoint="https://api.openai.com/v1"), ["OPENAI_API_KEY"]),
])
def test_bad_params_fail_the_check(workdir, monkeypatch, edit, needles):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    edit_params(workdir, edit)
    assert_clean_failure(drlc(["check"], workdir), *needles)


def test_template_without_its_placeholder(workdir):
    template = workdir / "prompts" / "sentiment.md"
    template.write_text(template.read_text().replace("{response}", "the response"))
    assert_clean_failure(drlc(["check"], workdir), "sentiment.md", "response")


def test_stage_with_bad_params_stops_before_writing(workdir):
    edit_params(workdir, lambda r: r["score"].update(scale="big"))
    out = workdir / "data" / "scores" / "round=0001"
    result = stage("score", ["--round", "0001", "--rollouts", "data/rollouts/round=0001", "--out", str(out),
                             "--metrics", str(out) + ".json"], workdir)
    assert_clean_failure(result, "score.scale", "'big'")
    assert not out.exists()


def test_stage_with_a_missing_input_table(workdir):
    out = workdir / "data" / "scores" / "round=0001"
    result = stage("score", ["--round", "0001", "--rollouts", "data/rollouts/round=0001", "--out", str(out),
                             "--metrics", str(out) + ".json"], workdir)
    assert_clean_failure(result, "data/rollouts/round=0001/part-0.parquet", "not found")
    assert not out.exists()


def test_stage_with_an_unknown_round(workdir):
    result = stage("score", ["--round", "0042", "--rollouts", "x", "--out", "y", "--metrics", "m.json"], workdir)
    assert_clean_failure(result, "0042", "0001")


@pytest.mark.parametrize("args", [[], ["check"], ["replay"], ["report"], ["sql"], ["catalog"], ["cache"], ["critic"], ["critic", "serve"],
                                  ["critic", "batch-prepare"], ["critic", "batch-ingest"]])
def test_every_subcommand_has_help(args, workdir):
    result = drlc([*args, "--help"], workdir)
    assert result.returncode == 0 and "usage: drlc" in result.stdout


def test_sql_error_is_one_line(workdir):
    result = drlc(["sql", "SELECT nope FROM nowhere"], workdir)
    assert_clean_failure(result, "Query failed")


# --- more bad inputs: params files, overrides, templates, data files and CLI flags -------------

def bad_template_front_matter(workdir):
    (workdir / "prompts" / "bad.md").write_text("---\ntask: [\n---\n## system\nTask: sentiment\n")
    return ["check", "--set", "critic.template=prompts/bad.md"]


def template_without_output_format(workdir):
    template = workdir / "prompts" / "sentiment.md"
    template.write_text(template.read_text().replace("### Output format", "### Format"))
    return ["check"]


def cache_dir_under_a_file(workdir):
    (workdir / "blocker").write_text("a file, so nothing can be created below it (not even by root)")
    return ["check", "--set", "critic.cache_dir=blocker/sub"]


def not_a_parquet_file(workdir):
    (workdir / "x.parquet").write_text("not parquet")
    from pipeline.core.cache import CriticCache

    CriticCache(workdir / "cache").close()  # an existing cache: the failed import adds nothing to it
    return ["cache", "import", "x.parquet", "--dir", "cache"]


_HELD_SOCKETS = []


def busy_port(workdir):
    import socket

    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    _HELD_SOCKETS.append(blocker)  # kept open until the test ends
    return ["critic", "serve", "--port", str(blocker.getsockname()[1])]


@pytest.mark.parametrize("make_args, needles", [
    (lambda w: (w / "bad.yaml").write_text("run: [\n") and ["check", "--params", "bad.yaml"], ["bad.yaml", "YAML"]),
    (lambda w: ["check", "--params", "nope.yaml"], ["nope.yaml", "not found", "fix the path"]),
    (lambda w: ["check", "--set", "nokey"], ["'nokey'", "section.key=value"]),
    (lambda w: ["check", "--set", "rounds.0002={prev: round=0009}"], ["round=0009", "round=0001"]),
    (lambda w: ["check", "--set", "evaluate.policy=round=0002"], ["evaluate.policy", "round=0002", "last round"]),
    (lambda w: ["check", "--set", "critic.max_concurrency=0"], ["critic.max_concurrency", "0", "> 0"]),
    (lambda w: ["check", "--set", "critic.template=prompts/toxicity.md"], ["toxicity.md", "run.task"]),
    (bad_template_front_matter, ["prompts/bad.md", "not valid YAML", "'---'"]),
    (template_without_output_format, ["sentiment.md", "Output format"]),
    (cache_dir_under_a_file, ["critic.cache_dir", "blocker/sub", "not a directory", "writable directory"]),
    (not_a_parquet_file, ["x.parquet", "drlc cache export"]),
    (lambda w: ["cache", "export"], ["cache export", "FILE.parquet"]),
    (lambda w: ["critic", "serve", "--error-rate", "2"], ["error_rate=2.0", "[0, 1]"]),
    (lambda w: ["critic", "serve", "--latency", "-1"], ["latency_s=-1.0", ">= 0"]),
    (lambda w: ["critic", "serve", "--backend", "nope"], ["'nope'", "lexicon"]),
    (lambda w: ["critic", "serve", "--port", "99999"], ["99999", "--port"]),
    (busy_port, ["Address already in use", "--port"]),
    (lambda w: ["report", "nowhere"], ["'nowhere'", "finished runs"]),
], ids=["params-not-yaml", "params-missing", "override-no-equals", "round-chain", "eval-policy-not-last",
        "concurrency-zero", "template-other-task", "template-front-matter", "template-no-output-format",
        "cache-dir-under-file", "cache-import-not-parquet", "cache-export-no-file", "serve-error-rate",
        "serve-negative-latency", "serve-unknown-backend", "serve-port-out-of-range", "serve-port-busy",
        "report-missing-run"])
def test_more_bad_inputs_fail_with_one_line(workdir, monkeypatch, make_args, needles):
    from pipeline.critic.offline.server import _CriticServer

    def serve_forever(self, *args, **kwargs):  # in-process, a server that starts would serve until killed
        raise AssertionError("drlc critic serve started serving: the bad input was not refused")

    monkeypatch.setattr(_CriticServer, "serve_forever", serve_forever)
    try:
        args = make_args(workdir)
        before = sorted(p.relative_to(workdir) for p in workdir.rglob("*"))
        result = drlc(args, workdir)
    finally:
        while _HELD_SOCKETS:
            _HELD_SOCKETS.pop().close()
    assert_clean_failure(result, *needles)
    after = sorted(p.relative_to(workdir) for p in workdir.rglob("*"))
    assert after == before  # no partial output


def test_stage_with_a_corrupt_input_table(workdir):
    table = workdir / "data" / "rollouts" / "round=0001" / "part-0.parquet"
    table.parent.mkdir(parents=True)
    table.write_bytes(b"PAR1 half-written")
    out = workdir / "data" / "scores" / "round=0001"
    result = stage("score", ["--round", "0001", "--rollouts", str(table.parent), "--out", str(out),
                             "--metrics", str(out) + ".json"], workdir)
    assert_clean_failure(result, "rollouts/round=0001/part-0.parquet", "not a readable Parquet file", "dvc repro")
    assert not out.exists()


# --- the same, in a real process --------------------------------------------------------------

def spawn(argv, cwd):
    return subprocess.run([sys.executable, *map(str, argv)], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_real_drlc_process_exits_2_with_one_line(workdir):
    """The real-process check of what the in-process `drlc` tests above check for every case: through
    `python -m pipeline` (pipeline/__main__.py, the interpreter's exit status, its stderr) a bad input
    exits 2 with one line naming the value and the fix and writes nothing; --help exits 0."""
    help_ = spawn(["-m", "pipeline", "check", "--help"], workdir)
    assert help_.returncode == 0 and "usage: drlc check" in help_.stdout, help_.stderr
    edit_params(workdir, lambda r: r["ppo"].update(learnig_rate=0.1))
    before = sorted(workdir.rglob("*"))
    assert_clean_failure(spawn(["-m", "pipeline", "check"], workdir), "ppo.learnig_rate", "learning_rate")
    assert sorted(workdir.rglob("*")) == before


@pytest.mark.slow
def test_a_real_stage_process_exits_2_with_one_line(workdir):
    """The real-process check of what the in-process stage tests above check for every case: `python
    stages/score.py` with bad params exits 2 with one stderr line naming the value, before writing."""
    edit_params(workdir, lambda r: r["score"].update(scale="big"))
    out = workdir / "data" / "scores" / "round=0001"
    result = spawn([ROOT / "stages" / "score.py", "--round", "0001", "--rollouts", "data/rollouts/round=0001",
                    "--out", out, "--metrics", f"{out}.json"], workdir)
    assert_clean_failure(result, "score.scale", "'big'")
    assert not (workdir / "data").exists()
