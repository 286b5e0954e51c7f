"""The before/after table of benchmarks/h200_before_after.sh's outputs: per row of gpu_model.py, the
median of each side's runs, their ratio and the runs themselves.

    python benchmarks/before_after_table.py --before docs/h200/redesign-before*.txt --after docs/h200/redesign-after*.txt
"""

import argparse
import statistics

COLUMNS = ["prefill 512", "1 stream", "8 streams", "32 streams"]


def rows(paths: list[str]) -> dict[str, list[list[float]]]:
    out: dict[str, list[list[float]]] = {}
    for path in paths:
        for line in open(path):
            if line.startswith("| synthetic"):
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                out.setdefault(cells[0], []).append([float(c) for c in cells[2:6]])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", nargs="+", required=True)
    ap.add_argument("--after", nargs="+", required=True)
    a = ap.parse_args()
    before, after = rows(a.before), rows(a.after)
    print("| row, tok/s | before (median) | after (median) | after / before | before runs | after runs |")
    print("|---|---:|---:|---:|---|---|")
    for model, runs in before.items():
        for k, name in enumerate(COLUMNS):
            b, f = [r[k] for r in runs], [r[k] for r in after[model]]
            mb, mf = statistics.median(b), statistics.median(f)
            print(f"| {model.removeprefix('synthetic-')} {name} | {mb:,.0f} | {mf:,.0f} | {mf / mb:.3f} | "
                  f"{' '.join(f'{x:.0f}' for x in b)} | {' '.join(f'{x:.0f}' for x in f)} |")


if __name__ == "__main__":
    main()
