"""The sample-efficiency study (drlc issue 10): dense critic rewards vs sparse PPO, in-process, per task.

One concept per module: ``config`` (study sizes and each task's presets), ``tasks`` (the per-task
layer: world, critic template, stated notes, report view), ``base_cache`` (the pretrained base
model, built once per task and world seed), ``world`` / ``world_toxicity`` / ``world_summarization``
(the fair worlds: environment reward, degradation measures, evaluation metrics), ``critic`` (the
in-process lexicon critic behind the content-hashed cache, with call and cost accounting),
``arms`` (what each arm changes), ``runner`` (PPO rounds of one arm and seed), ``analysis``
(steps-to-target, matched-KL frontier, scale factor), ``ablation`` (zero-cost replay of recorded
rollouts), ``reading`` (the honest reading generated from the numbers), ``report`` (PNGs,
Markdown, README splice).
"""
