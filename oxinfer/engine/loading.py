"""Loading: a model file (GGUF or an HF directory) into a tokenizer, a model, the matmul scheduler,
and the executor its forward runs on (the GPU's when a WebGPU backend can run it all)."""

from __future__ import annotations

from pathlib import Path

from oxinfer.formats import GGUFFile, HFDirectory, default_model_path, hub
from oxinfer.logs import get_logger
from oxinfer.models import Llama, ModelConfig
from oxinfer.models.kv_cache import kv_cache_dtype
from oxinfer.runtime import CpuBackend, MatmulScheduler
from oxinfer.runtime import cpu_prompts as prompts
from oxinfer.runtime.executor import PREFILL_CHUNK
from oxinfer.runtime.ops import CpuOps
from oxinfer.runtime.select import device_executor, select_gpu_backend
from oxinfer.tokenizer import Tokenizer

log = get_logger("oxinfer.engine")


def load(path: str | Path | None, backend: str = "cpu", gpu=None, max_concurrent: int = 16, cpu_int8: bool = True,
         resident: bool = True, kv_bytes: int | None = None, context_length: int | None = None,
         kv_dtype: str | None = None, cpu_prompts: str = "auto"):
    """(path, tokenizer, model, scheduler, the device's executor or None), blocking."""
    kv = kv_cache_dtype(kv_dtype)  # a bad name before anything loads
    prompts.check_choice(cpu_prompts)
    path = hub.resolve(path) if path is not None else default_model_path()  # a path, or a hub name
    if path.is_dir():  # an HF model directory: config.json, safetensors, tokenizer.json
        f = HFDirectory(path)
        cfg, tokenizer = ModelConfig.from_hf(f), Tokenizer.from_hf(f)
    else:
        f = GGUFFile(path)
        cfg, tokenizer = ModelConfig.from_gguf(f), Tokenizer.from_gguf(f)
        f.drop_metadata()  # ~100 MiB of parsed vocabulary, before the kernels are built
    cfg = cfg.limited(context_length)
    if cfg.rope_long is not None and cfg.context_length > cfg.rope_long[1]:
        log.warning("rope_long_factors", context_length=cfg.context_length, original_context=cfg.rope_long[1],
                    note="every position rotates by the long factors, as llama.cpp chooses by the context size; "
                         "transformers rotates a forward within the original context by the short ones: "
                         "pass context_length <= original_context to get those")
    scheduler = MatmulScheduler(CpuBackend(int8=cpu_int8), gpu=gpu if gpu is not None else select_gpu_backend(backend))
    model = Llama.from_gguf(f, cfg, CpuOps(cfg, scheduler.linear))
    refused = prompts.refuses(model, cpu_prompts, kv)  # ("openvino" where it cannot: the error before any conversion)
    f.loaded()  # tensors it left: a GGUF's metadata that disagrees with them refused, an HF directory's named
    device = None
    release = getattr(f, "release_pages", None)  # a GGUF's map: its pages leave as a device or kernels copy them
    if resident:
        try:
            device = device_executor(scheduler.gpu, model, max_rows=PREFILL_CHUNK, max_seqs=max(64, max_concurrent),
                                     kv_bytes=kv_bytes, uploaded=release, kv_dtype=kv)
        except Exception as e:  # noqa: BLE001 - an unsupported weight type, out of memory: matmuls offload
            log.warning("gpu_resident_unavailable", reason=str(e), action="only big matmuls run on the GPU")
    if device is None:
        if release:
            release()  # the pages fusing q/k/v and gate/up read
        rows = getattr(f, "row_reader", None)
        if scheduler.gpu is not None or not scheduler.cpu.build_graph(model, release, kv, refused, rows):
            scheduler.cpu.upload_all(model.matrices(), release)
        if release:
            release()  # (the CPU graph reads the embedding's rows with pread; kernels map them back as tokens need them)
    elif release:
        release()  # the header's and the vectors' pages too: the device holds the weights
    held = device.kv_dtype if device is not None else model.kv_dtype  # (the CPU graph sets the model's as it builds)
    if kv is not None and kv != held:
        runs = "matmuls offloaded to the GPU" if scheduler.gpu is not None else "a kernel per matrix on the CPU"
        raise ValueError(f"kv_cache_dtype {kv_dtype!r}: the CPU graph and the GPU's whole forward hold {kv.name} keys "
                         f"and values; this model runs as {runs}, whose keys and values are {held.name}")
    for m in model.matrices():
        scheduler.register(m, cpu=False)
    # with the whole forward on the GPU the CPU kernels (SmolLM2: 2.5 s and ~300 MiB to build;
    # TinyLlama: ~20 s) wait until a GPU fault sends a request to the CPU
    return path, tokenizer, model, scheduler, device
