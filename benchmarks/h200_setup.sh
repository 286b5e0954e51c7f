# Sourced by the benchmarks/h200_*.sh scripts on the lent H200 (the device tool, from the repository
# root, with [".gl", ".whl"] carried): the Vulkan loader debs unpacked into /, the wheels the image
# lacks installed into /tmp/site (and the wheels H200_WHEELS names), the NVIDIA Vulkan driver
# named where the image has it. Each script then sets PYTHONPATH=/tmp/site:<the tree it runs>.
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl $H200_WHEELS || return 1
export PYTHONUNBUFFERED=1
[ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ] && export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json

# write_shapes SHAPE...: benchmarks/gpu_model.py's synthetic Q4_1 models as /tmp/s-SHAPE.gguf
write_shapes() {
  python3 - "$@" <<'PY'
import sys
import time
from pathlib import Path
sys.path.insert(0, "benchmarks")
from gpu_model import SYNTHETIC
from oxinfer.testing import write_tiny_llama
for s in sys.argv[1:]:
    t = time.perf_counter()
    write_tiny_llama(Path(f"/tmp/s-{s}.gguf"), fast=True, context=4096, **SYNTHETIC[s])
    print(f"wrote {s} in {time.perf_counter() - t:.1f} s")
PY
}
