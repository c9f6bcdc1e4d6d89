"""Helpers of the tools package: the tools-YAML loader and the shared YAML-entry reader."""
