#!/usr/bin/env bash
# Run the whole test suite (README's second command). Extra args go to pytest, e.g.
#   bash scripts/test.sh -m "not e2e"     # skip the long end-to-end runs
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
ruff check rlpost tests scripts examples benchmarks   # lint first: seconds, and a red lint fails CI like a red test
# Two processes (pytest-xdist; TEST_WORKERS=1 runs one), whole files to each: the suite is mostly start-ups (Ray,
# engines, subprocess launches) that leave a core idle; a file's module-scoped fixtures stay in one process.
WORKERS=${TEST_WORKERS:-2}
if [[ "$WORKERS" == 1 ]]; then exec python -m pytest -q -ra --durations=15 "$@"; fi
exec python -m pytest -q -ra --durations=15 -n "$WORKERS" --dist loadfile "$@"
