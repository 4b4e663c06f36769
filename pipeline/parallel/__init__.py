"""Data parallelism behind one interface: DDP, FSDP2 and DeepSpeed ZeRO for PPO, and sharded sampling."""
