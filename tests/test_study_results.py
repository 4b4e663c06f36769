"""benchmarks/study_results.py: docs/results.md's `drlc study` blocks are rendered from the committed JSON only."""
import json

import pytest
from test_study import record as run

from benchmarks import study_results as sc
from pipeline.studies.study_report import build_report


def reports():
    ppo = build_report({"sparse": [run("sparse", 0, 0.30, [0.2, 0.3]), run("sparse", 1, 0.25, [0.2, 0.25])],
                        "dense": [run("dense", 0, 0.40, [0.2, 0.4], requests=5)]})
    return [ppo | {"seeds": [0, 1], "project": "/somewhere/local"}]


def test_the_record_counts_experiments_against_the_grid_and_drops_local_paths():
    result = sc.record(reports(), "commongen")
    assert result["experiments_done"] == 3 and result["experiments_planned"] == 5 * 5
    assert "project" not in result["reports"][0]
    text = sc.render(json.loads(json.dumps(result)))  # as read back from the committed file
    assert "in progress: 3 of 25 experiments" in text
    assert "#### CommonGen: sparse, dense × seeds [0, 1]" in text and "| dense-sparse | 1 | +0.100 |" in text
    assert "**dense −" not in text  # no matched control in this grid, so no headline


def test_the_headline_puts_dense_against_the_better_matched_control():
    by_arm = {arm: [run(arm, seed, final, [0.2, final]) for seed, final in enumerate(finals)]
              for arm, finals in {"sparse": (0.30, 0.20), "dense": (0.40, 0.36), "sparse_scaled": (0.45, 0.47),
                                  "sparse_lowkl": (0.35, 0.33)}.items()}
    line = sc.headline(build_report(by_arm) | {"seeds": [0, 1]})
    # sparse_scaled has the higher end point; dense - sparse_scaled per seed -0.05, -0.11: mean -0.080,
    # half = t(1) * (0.06 / sqrt(2)) / sqrt(2) = 12.706 * 0.03
    assert line.startswith("**dense − sparse_scaled** (the better matched control at the end point)")
    assert f"at the end point -0.080 ± {12.706 * 0.03:.3f}" in line


@pytest.mark.parametrize("name", sorted(sc.STUDIES))
def test_the_page_holds_the_block_rendered_from_the_committed_json(name):
    if not sc.result_path(name).is_file():
        pytest.skip(f"no benchmarks/results/study_{name}.json committed yet")
    start, end = sc.markers(name)
    page = (sc.ROOT / "docs/results.md").read_text()
    block = page.split(start, 1)[1].split(end, 1)[0]
    assert block.strip("\n") == sc.render(json.loads(sc.result_path(name).read_text())).strip("\n")


def test_a_synthetic_study_names_its_profile_and_grid():
    result = sc.record(reports(), "sentiment")
    assert result["experiments_planned"] == 7 * 3 and result["profile"] == "configs/study-sentiment.yaml"
    text = sc.render(json.loads(json.dumps(result)))
    assert text.startswith("configs/study-sentiment.yaml through `drlc study` (in progress: 3 of 21 experiments;")
    assert "#### Synthetic sentiment world: sparse, dense × seeds [0, 1]" in text


def test_main_writes_the_json_and_splices_the_block_it_renders(tmp_path, capsys):
    report = tmp_path / "report.json"
    report.write_text(json.dumps(reports()[0]))
    start, end = sc.markers("sentiment")
    page = tmp_path / "results.md"
    page.write_text(f"head\n{start}\nold\n{end}\ntail\n")
    result = sc.main(["--name", "sentiment", "--report", str(report), "--out", str(tmp_path / "r.json"),
                      "--doc", str(page)])
    assert json.loads((tmp_path / "r.json").read_text()) == result
    text = page.read_text()
    assert "old" not in text and text.split(start, 1)[1].split(end, 1)[0].strip() == sc.render(result).strip()
    assert sc.render(result).strip() in capsys.readouterr().out


def test_the_detox_block_puts_each_critic_arms_gain_beside_its_char_f1():
    # final world/coverage per seed; the control of a PPO critic arm is sparse_scaled, of a GRPO one grpo_sparse
    finals = {"sparse": (0.30, 0.20), "sparse_scaled": (0.32, 0.26), "dense": (0.40, 0.30), "random": (0.31, 0.27),
              "dense_lexicon": (0.35, 0.27), "grpo_sparse": (0.50, 0.40), "grpo_dense": (0.52, 0.46)}
    by_arm = {arm: [run(arm, seed, final, [0.1, final]) for seed, final in enumerate(values)]
              for arm, values in finals.items()}
    result = sc.record([build_report(by_arm, metric="world/coverage") | {"seeds": [0, 1]}], "detox")
    measured = json.loads(sc.CRITIC_QUALITY.read_text())["critics"]
    assert result["critic_char_f1"]["tagger"] == measured["tagger"]["char_f1"]
    text = sc.render(json.loads(json.dumps(result)))
    table = text.split("Gain against critic quality", 1)[1]
    # dense - sparse_scaled per seed: +0.08, +0.04 -> mean +0.060, half = 12.706 * 0.02 (sd 0.02*sqrt(2), n 2)
    tagger = f"{measured['tagger']['char_f1']:.3f}"
    assert f"| dense | tagger | {tagger} | sparse_scaled | - | +0.060 ± {12.706 * 0.02:.3f} |" in table
    assert f"| dense_lexicon | lexicon | {measured['lexicon']['char_f1']:.3f} | sparse_scaled | - | +0.020 ±" in table
    assert "| grpo_dense | tagger |" in table and "| grpo_dense | tagger | 0.655 | grpo_sparse | - | +0.040 ±" in table
    assert "dense_smol_copy" not in table  # not run: no row
    assert sc.critic_quality(build_report(by_arm), {}, None) == ""


def test_study_critics_reads_smollm2_quality_from_the_committed_formats_result():
    from benchmarks.study_critics import smollm2_quality

    quality = smollm2_quality(sc.RESULTS / "critic_formats.json")
    rows = json.loads((sc.RESULTS / "critic_formats.json").read_text())["results"]
    hf = {r["answer_format"]: r for r in rows if r.get("endpoint", "hf") == "hf" and r["samples"] == 1}
    assert quality["smol_copy"]["char_f1"] == hf["copy"]["char_f1"]
    assert quality["smol_text"]["n_posts"] == hf["text"]["n_posts"]
    llamacpp = [r["char_f1"] for r in rows if r.get("endpoint") == "llamacpp" and r["answer_format"] == "copy"]
    assert llamacpp and quality["smol_copy"]["char_f1"] not in llamacpp  # the study's critic is drlc's hf one
