"""The fastest side of an A/B run in turns, from gpu_attention_decode.py's lines under "== NAME"
headers (a side's turns may repeat): each side's "attention alone" milliseconds summed over a turn,
averaged over its turns; prints the name of the side with the least (stdout), and every side's
figure (stderr). For a device call that
runs a table under the winner:

    for v in old new old new; do echo "== $v"; ...gpu_attention_decode.py...; done > ab.txt
    python3 benchmarks/ab_pick.py ab.txt
"""

import re
import sys

sums, turns, side = {}, {}, None
for line in open(sys.argv[1]):
    if line.startswith("== "):
        side = line.split()[1]
        sums.setdefault(side, 0.0)
        turns[side] = turns.get(side, 0) + 1
    elif (m := re.search(r"attention alone ([0-9.]+) ms", line)) and side is not None:
        sums[side] += float(m[1])
if not sums:
    raise SystemExit(f"{sys.argv[1]}: no side (a line '== NAME') with an 'attention alone' figure")
means = {k: v / turns[k] for k, v in sums.items()}
print(min(means, key=means.get))
print("attention alone, a turn: " + ", ".join(f"{k} {v:.3f} ms" for k, v in means.items()), file=sys.stderr)
