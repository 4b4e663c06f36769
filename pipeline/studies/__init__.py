"""The studies: does a critic's dense per-token reward make PPO (or GRPO) more sample-efficient?

The library of benchmarks/sample_efficiency.py (the synthetic worlds, drlc issue 10: in-process, per
task) and benchmarks/sample_efficiency_dvc.py (the same arms as DVC experiments, and the real-text
study of issue 30). It sits above steps/ (it runs rounds from their functions) and below commands/.

One concept per module: ``config`` (study sizes and each task's presets), ``tasks`` (the per-task
layer: world, critic template, stated notes, report view), ``base_cache`` (the pretrained base
model, built once per task and world seed), ``world`` / ``world_toxicity`` / ``world_summarization``
(the fair worlds: environment reward, degradation measures, evaluation metrics), ``critic`` (the
in-process lexicon critic behind the content-hashed cache, with call and cost accounting),
``arms`` (what each arm changes), ``critics`` (the real-text arms: which critic, which algorithm),
``runner`` (PPO rounds of one arm and seed), ``analysis`` (steps-to-target, matched-KL frontier,
scale factor), ``ablation`` (zero-cost replay of recorded rollouts), ``reading`` (the honest
reading generated from the numbers), ``report`` (PNGs, Markdown), ``real_text`` (the real-text
study's tables and plots), ``generated_blocks`` (the splice of a generated block into
docs/results.md, shared with benchmarks/demo_queries.py).
"""
