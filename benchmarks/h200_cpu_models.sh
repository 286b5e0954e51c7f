# Sourced by benchmarks/h200_llamacpp_cpu.sh and h200_cpu_kv_half.sh (PYTHONPATH holding gguf and this tree): the
# synthetic 135m and 1b shapes as Q4_1 GGUFs both engines load, /tmp/m/<shape>.gguf, each written once a machine.
mkdir -p /tmp/m && python3 - <<'PY'
from pathlib import Path
from gguf import GGMLQuantizationType as T
from oxinfer.bench import SYNTHETIC
from oxinfer.testing import write_tiny_llama
for k in ("135m", "1b"):
    if not Path(f"/tmp/m/{k}.gguf").exists():
        write_tiny_llama(Path(f"/tmp/m/{k}.gguf"), qtype=T.Q4_1, fast=True, context=2048, llama_cpp=True, **SYNTHETIC[k])
PY
