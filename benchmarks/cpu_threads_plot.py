"""Thread scaling of the CPU backend beside llama.cpp's CPU build: a JSON of prefill and decode
tok/s per thread count (docs/h200/cpu-threads-*.json, from benchmarks/h200_cpu.sh) -> a PNG.

    .venv/bin/python benchmarks/cpu_threads_plot.py docs/h200/cpu-threads-2026-12-04-s12.json docs/img/cpu-threads-h200.png
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src: str, dst: str) -> None:
    data = json.loads(open(src).read())
    threads = data["threads"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric, title in zip(axes, ("prefill_tps", "decode_tps"), ("prefill, 512 tokens", "decode, one stream")):
        for engine, style in (("oxinfer", "o-"), ("llama.cpp", "s--")):
            ax.plot(threads, data[engine][metric], style, label=engine)
        ax.set_xscale("log", base=2)
        ax.set_xticks(threads, [str(t) for t in threads])
        ax.set_xlabel("threads (cores)")
        ax.set_ylabel("tok/s")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    host = data.get("host", "H200 host's 16-core Xeon (AVX-512 VNNI, AMX)")  # (the JSON's "host", where it names one)
    fig.suptitle(f"SmolLM2-135M shape, Q4_1, CPU: {host}")
    fig.tight_layout()
    fig.savefig(dst, dpi=100)


if __name__ == "__main__":
    main(*sys.argv[1:3])
