"""Trainers: `main_ppo` (PPO family on Ray), its config package, and the SFT trainer."""
