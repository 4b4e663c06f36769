"""The RL math (`ppo`: pure functions over tensors) and the round's trainer that applies it to models."""
