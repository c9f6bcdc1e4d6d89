"""Write the flattened key list of a verl trainer YAML (one dotted key a line, sorted) for the key-set test.

    git -C <verl checkout or bare repo> show HEAD:verl/trainer/config/_generated_ppo_trainer.yaml > /tmp/v.yaml
    python scripts/verl_key_list.py /tmp/v.yaml tests/data/verl_generated_ppo_trainer_keys.txt

Leaves only (a non-empty mapping is opened; an empty one is a leaf); verl's `_target_` class names are skipped,
as rlpost builds its own typed objects.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml


def flat_keys(node: dict, prefix: str = "") -> list[str]:
    """Dotted leaf keys of a nested mapping."""
    keys = []
    for name, value in node.items():
        if name == "_target_":
            continue
        if isinstance(value, dict) and value:
            keys += flat_keys(value, f"{prefix}{name}.")
        else:
            keys.append(prefix + name)
    return keys


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        raise SystemExit("usage: python scripts/verl_key_list.py <verl yaml> <output text file>")
    source, target = argv
    keys = sorted(flat_keys(yaml.safe_load(Path(source).read_text())))
    Path(target).write_text("".join(k + "\n" for k in keys))
    print(f"{len(keys)} keys -> {target}")


if __name__ == "__main__":
    main(sys.argv[1:])
