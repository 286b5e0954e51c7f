"""Which of an A/B's two shader sets was faster, from gpu_attention_decode.py's lines in turns ("== old" /
"== new" headers): the sums of each side's "attention alone" milliseconds; prints "old" or "new".

    python3 benchmarks/ab_pick.py ab.txt
"""

import re
import sys

sums, side = {"old": 0.0, "new": 0.0}, None
for line in open(sys.argv[1]):
    if line.startswith("== "):
        side = line.split()[1]
    elif (m := re.search(r"attention alone ([0-9.]+) ms", line)) and side in sums:
        sums[side] += float(m[1])
print("new" if sums["new"] < sums["old"] else "old", file=sys.stdout)
print(f"attention alone, summed: old {sums['old']:.3f} ms, new {sums['new']:.3f} ms", file=sys.stderr)
