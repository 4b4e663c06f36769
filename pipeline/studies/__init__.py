"""The studies' analysis: does a critic's dense per-token reward make PPO (or GRPO) more sample-efficient?

`drlc study` (pipeline/commands/study.py) runs every study as DVC experiments of the project's own stages; the
modules here read and report them. One concept per module: ``analysis`` (the statistics: t intervals, paired
differences, steps-to-target, matched-KL frontiers, the scale factor), ``study_report`` (`drlc study`'s report:
its JSON, Markdown and PNGs, the one report renderer) and ``generated_blocks`` (the splice of a generated block
into docs/results.md). The arms of every study, the real-text one's critics included, are configs/study/arms.yaml.
"""
