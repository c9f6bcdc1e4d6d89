"""verl's fully-asynchronous recipe under its own entry point (`fully_async_main`), run by rlpost's one
trainer with `trainer.v1.trainer_mode=separate_async`."""
