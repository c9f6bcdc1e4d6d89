"""verl's one-step-off-policy recipe under its own entry point (`main_ppo`), run by rlpost's one trainer with
split placement and `trainer.staleness=1`."""
