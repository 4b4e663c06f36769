"""`drlc check` and each stage's start refuse a bad input file, model path or params file with one line,
exit 2, before any output exists; the same bad byte read by the data loaders names file, line and offset.

`drlc` and the stage scripts run in the test process (tests/inprocess.py); tests/test_bad_inputs.py
runs one of each as a real process."""
import json
import shutil

import pytest
from inprocess import drlc, stage
from test_bad_inputs import ROOT, assert_clean_failure, edit_params

from pipeline.core.errors import DataError
from pipeline.data.local import read_records
from pipeline.evaluate.prompts import read_dexperts_prompts

LATIN1 = "caf\xe9".encode("latin-1")  # byte 0xe9 then end of line: not UTF-8


@pytest.fixture
def workdir(tmp_path):
    shutil.copytree(ROOT / "prompts", tmp_path / "prompts")
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    return tmp_path


def write(path, data: bytes | str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def good_jsonl(n=3):
    return "".join(json.dumps({"text": f"review number {i}", "label": i % 2}) + "\n" for i in range(n))


def check_with(workdir, *sets):
    return drlc(["check", *[item for s in sets for item in ("--set", s)]], workdir)


@pytest.mark.parametrize("files, sets, needles", [
    ({}, ["world.source=data/nope.jsonl"], ["'world.source'", "data/nope.jsonl", "no such file"]),
    ({"in/empty.jsonl": ""}, ["world.source=in/empty.jsonl"], ["'world.source'", "in/empty.jsonl", "is empty"]),
    ({"in/blank.jsonl": "\n \n"}, ["world.source=in/blank.jsonl"], ["in/blank.jsonl", "only blank lines"]),
    ({"in/p.jsonl": ""}, ["evaluate.prompts=[in/p.jsonl]", "run.task=toxicity", "score.scorer=lexicon",
                          "critic.template=prompts/toxicity.md", "critic.labels=[toxic]", "critic.rewards={toxic: -1.0}"],
     ["'evaluate.prompts'", "in/p.jsonl", "is empty"]),
    ({"in/a.jsonl": "[1, 2]\n"}, ["world.source=in/a.jsonl"], ["in/a.jsonl:1", "JSON object", "list"]),
    ({"in/a.jsonl": "{nope\n"}, ["world.source=in/a.jsonl"], ["in/a.jsonl:1", "not valid JSON"]),
    ({"in/a.csv": "text,label\n"}, ["world.source=in/a.csv"], ["in/a.csv", "header and no rows"]),
    ({"in/a.parquet": b"PAR1 not really"}, ["world.source=in/a.parquet"], ["in/a.parquet", "cannot be read"]),
    ({"in/a.tsv": "hello\n"}, ["world.source=in/a.tsv"], ["in/a.tsv", "'.tsv'", ".jsonl", ".txt"]),
    ({"in/d/x.md": "x"}, ["world.source=in/d"], ["'world.source'", "in/d", "no .jsonl"]),
    ({"in/d/a.jsonl": good_jsonl(), "in/d/b.jsonl": ""}, ["world.source=in/d"], ["in/d/b.jsonl", "is empty"]),
    ({}, ["base.model=models/nope.gguf"], ["'base.model'", "models/nope.gguf", "does not exist"]),
    ({}, ["base.model=pkg:no_such_gguf_package"], ["'base.model'", "no_such_gguf_package"]),
    ({}, ["score.train_data=in/rtp.jsonl"], ["'score.train_data'", "in/rtp.jsonl"]),
], ids=["missing", "empty", "blank", "empty-eval-prompts", "not-an-object", "bad-json", "csv-no-rows",
        "corrupt-parquet", "unknown-suffix", "folder-without-data", "folder-with-empty-file", "missing-gguf",
        "unknown-gguf-package", "missing-train-data"])
def test_check_refuses_bad_input_files(workdir, files, sets, needles):
    for name, data in files.items():
        write(workdir / name, data)
    before = sorted(workdir.rglob("*"))
    assert_clean_failure(check_with(workdir, *sets), *needles)
    assert sorted(workdir.rglob("*")) == before  # the check writes nothing


def test_check_passes_good_local_files(workdir):
    write(workdir / "in/a.jsonl", good_jsonl())
    write(workdir / "in/b.csv", "text,label\ncaf\u00e9 fine,1\n")
    assert check_with(workdir, "world.source=in/a.jsonl").returncode == 0
    result = check_with(workdir, "world.source=in/b.csv")
    assert result.returncode == 0, result.stderr


def test_non_utf8_byte_is_named_with_line_and_offset(workdir):
    # line 3 starts at byte len(line1) + len(line2); 0xe9 is its 4th byte ("caf")
    head = good_jsonl(2).encode()
    write(workdir / "in/a.jsonl", head + b'{"text": "' + LATIN1 + b'"}\n')
    offset = len(head) + len(b'{"text": "caf')
    needles = ["in/a.jsonl:3", "byte 0xe9", f"byte offset {offset}", "not UTF-8", "iconv"]
    assert_clean_failure(check_with(workdir, "world.source=in/a.jsonl"), *needles)
    with pytest.raises(DataError) as error:  # the loader the prepare stage uses says the same
        read_records(str(workdir / "in/a.jsonl"))
    assert f"a.jsonl:3: byte 0xe9 at byte offset {offset}" in str(error.value)


def test_non_utf8_byte_in_eval_prompts_and_csv(tmp_path):
    prompts = write(tmp_path / "p.jsonl", b'{"prompt": {"text": "' + LATIN1 + b'"}}\n')
    with pytest.raises(DataError, match=r"p.jsonl:1: byte 0xe9 at byte offset 24 is not UTF-8"):
        read_dexperts_prompts(prompts)
    csv = write(tmp_path / "a.csv", b"text,label\nok,1\n" + LATIN1 + b",0\n")
    with pytest.raises(DataError, match=r"a.csv:3: byte 0xe9 at byte offset 19 is not UTF-8"):
        read_records(str(csv))


def test_utf8_check_finds_a_byte_past_the_first_chunk(tmp_path):
    from pipeline.data import inputs

    body = ("x" * 99 + "\n").encode() * 30000  # 3 MB: three 1 MiB chunks
    path = write(tmp_path / "big.jsonl", body + b"\xff\n")
    with pytest.raises(DataError, match=rf"big.jsonl:30001: byte 0xff at byte offset {len(body)} "):
        inputs.check_utf8(path)
    cut = write(tmp_path / "cut.jsonl", b'{"a": 1}\n' + "\u00e9".encode()[:1])  # a character cut at the end
    with pytest.raises(DataError, match=r"cut.jsonl:2: byte 0xc3 at byte offset 9 "):
        inputs.check_utf8(cut)


@pytest.mark.parametrize("text, needles", [
    ("ppo:\n  ppo_epochs: 2\n  ppo_epochs: 3\n", ["line 3, column 3", "duplicate key 'ppo_epochs'", "first at line 2"]),
    ("ppo:\n  ppo_epochs: 2\nrun:\n  seed: 0\nppo:\n  learning_rate: 0.1\n",
     ["line 5, column 1", "duplicate key 'ppo'", "first at line 1"]),
    ("ppo:\n  ppo_epochs: [2, 3\n  gamma: 1\n", ["bad.yaml", "line 3, column 8", "expected ',' or ']'"]),
], ids=["duplicate-key", "duplicate-section", "syntax-error"])
def test_yaml_problems_give_line_and_column(workdir, text, needles):
    (workdir / "bad.yaml").write_text(text)
    assert_clean_failure(drlc(["check", "--params", "bad.yaml"], workdir), *needles)


def test_prepare_stage_refuses_a_bad_world_source_before_writing(workdir):
    write(workdir / "in/a.jsonl", b'{"text": "' + LATIN1 + b'"}\n')
    edit_params(workdir, lambda r: r["world"].update(source="in/a.jsonl"))
    result = stage("prepare", ["--corpus", "data/corpus", "--prompts", "data/prompts/round=0000"], workdir)
    assert_clean_failure(result, "in/a.jsonl:1", "byte 0xe9", "not UTF-8")
    assert not (workdir / "data").exists()


def test_base_stage_refuses_a_missing_gguf_before_writing(workdir):
    edit_params(workdir, lambda r: r["base"].update(model="models/nope.gguf"))
    result = stage("base", ["--corpus", "data/corpus", "--out", "models/base", "--metrics", "m.json"], workdir)
    assert_clean_failure(result, "'base.model'", "models/nope.gguf")
    assert not (workdir / "models").exists()


CONFIG = '{"model_type": "gpt2"}'
TOKENIZER = '{"version": "1.0"}'


@pytest.mark.parametrize("files, sets, needles", [
    ({}, ["base.model=./models/nope"], ["'base.model'", "./models/nope", "no such folder", "hub id"]),
    ({"in/m.json": "{}"}, ["base.model=in/m.json"], ["'base.model'", "in/m.json", "is a file, not a model folder"]),
    ({"in/m/README.md": "x"}, ["base.model=in/m"],
     ["'base.model'", "'in/m'", "no config.json and no weights", "and no tokenizer files", "save_pretrained"]),
    ({"in/m/config.json": CONFIG, "in/m/model.safetensors": b"x"}, ["base.model=in/m"],
     ["'base.model'", "'in/m'", "no tokenizer files", "tokenizer.save_pretrained"]),
    ({"in/m/config.json": "{nope", "in/m/model.safetensors": b"x", "in/m/tokenizer.json": TOKENIZER},
     ["base.model=in/m"], ["'base.model'", "config.json does not parse"]),
    ({"in/clf/config.json": CONFIG, "in/clf/tokenizer.json": TOKENIZER, "in/clf/training_args.bin": b"x"},
     ["score.scorer=hf_classifier", "score.model=in/clf"], ["'score.model'", "'in/clf'", "no weights"]),
    ({}, ["evaluate.fluency_model=in/lm/"], ["'evaluate.fluency_model'", "in/lm/", "no such folder"]),
    ({}, ["evaluate.classifier_data=in/labels.txt"], ["'evaluate.classifier_data'", "in/labels.txt", "no such file",
                                                     "'world'"]),
    ({"in/labels.txt": "1 a fine film\n2 not a label\n"}, ["evaluate.classifier_data=in/labels.txt"],
     ["'evaluate.classifier_data'", "in/labels.txt:2", "<0|1> <text>", "2 not a label"]),
    ({"in/labels.txt": b"1 ok\n0 " + LATIN1 + b"\n"}, ["evaluate.classifier_data=in/labels.txt"],
     ["in/labels.txt:2", "byte 0xe9", "not UTF-8"]),
], ids=["missing-model-folder", "model-path-is-a-file", "empty-model-folder", "no-tokenizer", "bad-config",
        "classifier-without-weights", "missing-fluency-model", "missing-classifier-data", "bad-classifier-line",
        "classifier-data-not-utf8"])
def test_check_refuses_bad_model_folders_and_classifier_data(workdir, files, sets, needles):
    for name, data in files.items():
        write(workdir / name, data)
    before = sorted(workdir.rglob("*"))
    assert_clean_failure(check_with(workdir, *sets), *needles)
    assert sorted(workdir.rglob("*")) == before


def test_check_passes_a_saved_model_folder_a_hub_id_and_good_classifier_data(workdir):
    from tests.test_resume import save_tiny_base

    save_tiny_base(workdir / "in" / "m")  # GPT-2 weights, config.json and a tokenizer, as save_pretrained writes
    write(workdir / "in/labels.txt", "1 a fine film\n\n0 a dull one\n")
    for sets in (["base.model=in/m"], ["base.model=gpt2"], ["evaluate.classifier_data=in/labels.txt"],
                 ["score.scorer=hf_classifier", "score.model=in/m"]):
        result = check_with(workdir, *sets)
        assert result.returncode == 0, (sets, result.stderr)


def test_score_stage_refuses_a_broken_score_model_before_writing(workdir):
    write(workdir / "in/clf/config.json", CONFIG)
    edit_params(workdir, lambda r: r["score"].update(scorer="hf_classifier", model="in/clf"))
    result = stage("score", ["--round", "0001", "--rollouts", "data/rollouts/round=0001", "--out",
                             "data/scores/round=0001", "--metrics", "m.json"], workdir)
    assert_clean_failure(result, "'score.model'", "'in/clf'", "no weights")
    assert not (workdir / "data").exists()


def test_estimate_exits_non_zero_on_a_missing_local_path(workdir):
    result = drlc(["estimate", "params.yaml", "--set", "world.source=data/nope.jsonl"], workdir)
    assert result.returncode == 2
    assert "MISSING local path" in result.stdout
    assert result.stderr.count("\n") == 1 and "world.source = 'data/nope.jsonl'" in result.stderr, result.stderr


def test_a_missing_params_file_suggests_no_flag_the_command_lacks(workdir):
    result = drlc(["estimate", "configs/paper/nope.yaml"], workdir)
    assert_clean_failure(result, "configs/paper/nope.yaml", "not found", "fix the path")
    assert "--params" not in result.stderr


def scores_rows(round_):
    return [{"run_id": "demo", "round": round_, "rollout_id": f"r{i}", "env_reward": float(i),
             "env_reward_shaped": float(i), "scorer": "vader", "scorer_version": "1"} for i in range(3)]


def test_sql_names_a_corrupt_partition_and_other_tables_still_answer(workdir):
    from pipeline.core import store

    for round_ in (1, 2):
        store.write_table(scores_rows(round_), "scores", workdir / f"data/scores/round={round_:04d}")
    store.write_table([{"run_id": "demo", "round": 0, "prompt_id": "0", "split": "eval", "text": "t", "reference": ""}],
                      "prompts", workdir / "data/prompts/round=0000")
    ok = drlc(["sql", "SELECT count(*) AS n FROM scores"], workdir)
    assert ok.returncode == 0 and "6" in ok.stdout, ok.stderr
    bad = workdir / "data/scores/round=0002/part-0.parquet"
    bad.write_bytes(bad.read_bytes()[:40])  # a truncated copy: no footer
    result = drlc(["sql", "SELECT count(*) AS n FROM scores"], workdir)
    assert_clean_failure(result, "Table 'scores'", "data/scores/round=0002/part-0.parquet",
                         "re-create it with the stage that writes it", "dvc repro")  # no dvc.lock here to compare
    other = drlc(["sql", "SELECT split, count(*) AS n FROM prompts GROUP BY 1"], workdir)
    assert other.returncode == 0 and "eval" in other.stdout, other.stderr
    assert bad.stat().st_size == 40  # nothing rewritten
