"""Another benchmark run with the kernels' WGSL taken from DIR (a copy of shaders/ from another
commit, trial_settings' shaders=DIR), for A/Bs of kernels a benchmark has no variants for:

    python benchmarks/with_shaders.py DIR benchmarks/gpu_attention_decode.py --synthetic 8b --contexts 4000
"""

import runpy
import sys
from pathlib import Path

import trial_settings

if __name__ == "__main__":
    folder, script, *args = sys.argv[1:]
    trial_settings.apply({"shaders": str(Path(folder).resolve())}, {})
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")
