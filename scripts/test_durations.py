"""tests/durations.json from the --durations lines of a full run's log: each test's seconds
(setup + call + teardown), which the xdist scheduler (tests/tiers.py) hands out the longest
groups first by. Refresh it after a run whose times moved:
    CI=true bash scripts/test.sh --durations=0 --durations-min=0.5 2>&1 | tee run.log
    .venv/bin/python scripts/test_durations.py run.log
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

# "12.34s call     tests/test_x.py::test_y[a b]" (a CI log may put a timestamp first)
LINE = re.compile(r"(?:^|\s)(\d+\.\d+)s (setup|call|teardown)\s+(tests/\S.*?)\s*$")
OUT = Path(__file__).resolve().parents[1] / "tests" / "durations.json"


def parse(lines) -> dict[str, float]:
    seconds: Counter[str] = Counter()
    for line in lines:
        m = LINE.search(line)
        if m:
            seconds[m[3]] += float(m[1])
    return {test: round(s, 1) for test, s in sorted(seconds.items())}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        with open(argv[0], errors="replace") as f:
            durations = parse(f)
    except OSError as e:
        print(f"cannot read {argv[0]}: {e.strerror}", file=sys.stderr)
        return 2
    if not durations:
        print(f"no --durations lines in {argv[0]}", file=sys.stderr)
        return 1
    OUT.write_text(json.dumps(durations, indent=0, sort_keys=True) + "\n")
    print(f"{OUT}: {len(durations)} tests, {sum(durations.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
