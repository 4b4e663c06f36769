"""drlc: PPO with dense per-token rewards from a language-model critic, as an offline pipeline."""
