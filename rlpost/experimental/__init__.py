"""verl's `experimental` package path: `rlpost.experimental.agent_loop` (agent loops written against verl)."""
