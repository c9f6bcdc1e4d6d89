"""Helpers of the interactions package: the interaction-YAML loader."""
