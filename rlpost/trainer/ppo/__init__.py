"""PPO-family training: algorithms (`core_algos`), metrics (`metric_utils`) and the Ray trainer."""
