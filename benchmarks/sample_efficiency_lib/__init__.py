"""The sample-efficiency study (drlc issue 10): dense critic rewards vs sparse PPO, in-process.

One concept per module: ``config`` (study sizes and presets), ``base_cache`` (the pretrained base
model, built once per world seed), ``world`` (the fair sentiment world: classifier reward, lexicon
critic, degradation measures), ``critic`` (the in-process lexicon critic behind the content-hashed
cache, with call and cost accounting), ``arms`` (what each arm changes), ``runner`` (PPO rounds of
one arm and seed), ``analysis`` (steps-to-target, matched-KL frontier, scale factor), ``ablation``
(zero-cost replay of recorded rollouts), ``report`` (PNGs, Markdown, README splice).
"""
