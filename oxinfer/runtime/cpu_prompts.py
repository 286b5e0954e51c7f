"""Long prompts through OpenVINO's CPU plugin, where OpenVINO is installed (`pip install
'oxinfer[openvino]'`): the CPU graph's own ONNX step (runtime/graph_ops.py) written once more for
it, every Q4_1 minimum as a product beside (OpenVINO reads the file, not onnxruntime's packing)
and the products at accuracy level 1 (OpenVINO's reader takes level 4 as int8 activations), then
compiled by OpenVINO. Its FullyConnected keeps the 4-bit weights and runs a prompt's products on
AMX tiles in bfloat16 where the CPU has them (OpenVINO's own default there; float32 elsewhere):
what onnxruntime's kernels reach only through int8 products with per-row scales
(docs/benchmarks.md, session 22). Decode steps stay onnxruntime's (one row: OpenVINO's product was
3-5x slower, benchmarks/cpu_openvino_probe.py).

On the 2-core dev VM (AVX-512 VNNI, AMX), the default model's 512-token prompt
(benchmarks/cpu_openvino_prompt.py): onnxruntime 705 tok/s, its logits 1.4e-2 of the largest off
the exact numpy forward's (int8 activations); OpenVINO bfloat16 2,236 tok/s, 9.7e-3; OpenVINO
float32 920 tok/s, 1.5e-6.

A sequence's prompt rows run alone (OpenVINO's GroupQueryAttention takes one sequence), after the
keys its lane holds (a cached prefix, an earlier chunk: copied out for the run), so its logits are
the same whatever else runs. OpenVINO compiles at the first step whose prompt runs of RUN_ROWS rows
or more hold MIN_ROWS rows together (one long prompt, or many short ones at once), which waits for
it (the default model: 1.7-4 s on the 2-core VM, with its load); a model that never sees one pays nothing. From
then on every prompt run of RUN_ROWS rows or more is OpenVINO's; shorter runs (decode steps among
them), and models whose attention has windows or soft caps (untested there), stay onnxruntime's.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import time

import numpy as np

from oxinfer.logs import get_logger
from oxinfer.runtime import blockwise, cpu_decode
from oxinfer.runtime.graph_ops import GraphOps

log = get_logger("oxinfer.runtime")

# OpenVINO compiles at the first step whose prompt runs of RUN_ROWS rows or more hold this many rows
# together: a chat turn's prompt never pays its compile (~1.7 s for the default model on 2 cores,
# against onnxruntime's ~0.06 s for its ~40 tokens) nor its memory (COPY_FACTOR's note); a step
# this long gains from the first run on
MIN_ROWS = 256
# once compiled, a sequence's prompt run of this many rows or more is OpenVINO's: on the 2-core VM
# (the default model, a first prompt alone, ms) 32 rows onnxruntime 70-76 / OpenVINO 74-97, 64 rows
# 125-141 / 69-123, 128 rows 225-229 / 110-145; 16 first prompts of 128 tokens in one step got their
# first tokens after 3.4-4.0 s in onnxruntime's runs of 512 rows, 1.3-1.6 s one by one in OpenVINO's
RUN_ROWS = 64
# a prompt's rows a run takes (CpuExecutor.prompt_rows; llama.cpp's n_ubatch): OpenVINO's attention
# holds a head's scores for every row and key at once (2,048 rows: ~175 MiB more of the default
# model's RSS than 512)
PROMPT_ROWS = 512
# OpenVINO's INFERENCE_PRECISION_HINT: None its own (bf16 where the CPU has it, else f32 with int8
# activations); "f32": float32 activations (its dynamic quantization off), the numpy forward's logits
PRECISION: str | None = None


CHOICES = ("auto", "openvino", "onnxruntime")  # Engine.load(cpu_prompts=)
# once compiled OpenVINO holds the weights again, and more: the default model +~450 MiB of RSS for
# its 92 MiB of weights (~100 of it OpenVINO's libraries), the 1.1B shape +1.5 GiB for ~620 MiB
# (docs/cpu_graph.md). "auto" takes it only where this estimate is at most half of the memory the
# machine has available at the load: an 8B model's ~4.5 GiB would want ~11 GiB more
COPY_FACTOR, COPY_FIXED_MIB = 2.5, 200


def check_choice(choice: str) -> None:
    if choice not in CHOICES:
        raise ValueError(f"cpu_prompts {choice!r}: expected one of {', '.join(CHOICES)}")


def refuses(model, choice: str = "auto", kv_dtype=None) -> str | None:
    """Why prompts of this model stay onnxruntime's, or the numba step's (None: OpenVINO takes them).
    choice "openvino" raises ValueError where it cannot (the reason), "onnxruntime" always refuses.
    kv_dtype: the KV pool's (the numba step reads float32 and float16)."""
    check_choice(choice)
    cfg = model.cfg
    if choice == "onnxruntime":
        return "cpu_prompts='onnxruntime'"
    env = os.environ.get("OXINFER_OPENVINO", "").strip()
    if choice == "auto" and env == "0":
        return "OXINFER_OPENVINO=0"
    weighed = choice == "auto" and env != "1"  # (OXINFER_OPENVINO=1 takes it wherever it can run)
    reason = None
    if not installed():
        reason = "openvino is not installed (pip install 'oxinfer[openvino]')"
    elif weighed and cpu_decode.runs_prompts(kv_dtype):
        reason = ("the numba step runs prompts here (AMX tiles, or its int8 rows) and no onnxruntime graph is "
                  "built; cpu_prompts='openvino' (or OXINFER_OPENVINO=1) takes it anyway")
    elif weighed and not bf16_products():
        reason = ("no bfloat16 products on this CPU (AMX or AVX512_BF16): OpenVINO's float32 ones were slower than "
                  "onnxruntime's int8 ones and held ~450 MiB more; cpu_prompts='openvino' (or OXINFER_OPENVINO=1) "
                  "takes it anyway")
    elif cfg.layer_windows and any(cfg.layer_windows) or cfg.attn_softcap:
        reason = "attention windows or soft caps"
    elif choice == "auto" and (free := available_mib()) is not None and (need := memory_mib(model)) > free / 2:
        reason = (f"its memory (~{need:,.0f} MiB more, for this model's weights) would take over half of the "
                  f"{free:,.0f} MiB available; cpu_prompts='openvino' takes it anyway")
    if reason and choice == "openvino":
        raise ValueError(f"cpu_prompts='openvino': {reason}")
    return reason


def memory_mib(model) -> float:
    """The RSS OpenVINO's compile of this model is expected to add (COPY_FACTOR, COPY_FIXED_MIB)."""
    bases = {id(m.base or m): m.base or m for m in model.matrices()}.values()
    return COPY_FIXED_MIB + COPY_FACTOR * sum(b.n_out * b.codec.row_bytes(b.n_in) for b in bases) / 2**20


def available_mib() -> float | None:
    """The machine's available memory (Linux's MemAvailable), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def bf16_products() -> bool:
    """Whether OpenVINO runs prompts' products in bfloat16 here (AMX tiles or AVX512_BF16), its gain: on a
    2-core AMD EPYC with AVX2 alone (session 42) its float32 prompts read 446 tok/s against onnxruntime's
    513-516 (the default model, 512 tokens) and took the bench's peak RSS from 464 to 917 MiB."""
    features = blockwise.host_features()
    return bool(features.get("amx-bf16") or features.get("avx512bf16"))


def installed() -> bool:
    """Whether OpenVINO can be imported (imported only once a prompt needs it: ~0.14 s)."""
    return importlib.util.find_spec("openvino") is not None


class OpenVinoPrompts:
    """OpenVINO's compile of the step graph for long prompts, made at the first `ready()`."""

    def __init__(self, model, converted):
        """converted(model): every matrix's kernel blocks at zero point 8 (cpu_graph._converted)."""
        self.model = model
        self._converted = converted
        self._request = None  # OpenVINO's infer request, once compiled
        self._names: dict[str, int] = {}  # its outputs' indices by name
        self._built = False

    def takes(self, lengths: list[int]) -> bool:
        """Whether a step's prompt runs (lengths: its sequences' rows) of RUN_ROWS rows or more go
        to OpenVINO: once compiled, yes; before, compiled now where they hold MIN_ROWS rows."""
        rows = sum(n for n in lengths if n >= RUN_ROWS)
        return rows > 0 and (self._built or rows >= MIN_ROWS) and self.ready()

    def ready(self) -> bool:
        """Whether it runs prompts: compiled now if not yet (False if OpenVINO refused the graph)."""
        if not self._built:
            self._built = True
            self._build(self._converted)
            self._converted = None
        return self._request is not None

    def _build(self, converted) -> None:
        t0 = time.perf_counter()
        try:
            import openvino

            with tempfile.TemporaryDirectory(prefix="oxinfer-openvino-") as folder:
                path = os.path.join(folder, "model.onnx")
                with open(os.path.join(folder, "weights.bin"), "wb") as data:
                    rec = GraphOps(self.model.cfg, data, converted(self.model), np.float32, False, accuracy_level=1)
                    onnx = rec.model_bytes(self.model.trace(rec), blockwise.IR_VERSION)
                with open(path, "wb") as f:
                    f.write(onnx)
                del rec, onnx
                config = {"INFERENCE_NUM_THREADS": blockwise.threads(), "PERFORMANCE_HINT": "LATENCY"}
                if PRECISION:
                    config["INFERENCE_PRECISION_HINT"] = PRECISION
                if PRECISION == "f32":
                    config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = 0
                compiled = openvino.Core().compile_model(path, "CPU", config)
                blockwise.drop_mapped(os.path.join(folder, "weights.bin"))
            self._names = {o.get_any_name(): i for i, o in enumerate(compiled.outputs)}
            self._request = compiled.create_infer_request()
            blockwise.trim_heap()
            log.info("openvino_prompts", build_s=round(time.perf_counter() - t0, 3),
                     precision=compiled.get_property("INFERENCE_PRECISION_HINT").to_string())
        except Exception as e:  # noqa: BLE001 - reported, and the prompts stay onnxruntime's
            log.warning("openvino_prompts_refused", error=str(e), action="prompts run in onnxruntime's graph")

    def run(self, x: np.ndarray, past: list[tuple[np.ndarray, np.ndarray]]
            ) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
        """A sequence's rows x (S, d) after the keys and values `past` holds, (KV, start, hd) a
        layer: the last row's logits (vocab,) and each layer's keys and values of the rows
        (KV, S, hd; OpenVINO's until the next run)."""
        S, start = len(x), past[0][0].shape[1]
        inputs = {"x": x[None].astype(np.float32, copy=False), "seqlens_k": np.array([start + S - 1], np.int32),
                  "total_seq": np.array(start + S, np.int32), "last": np.full((1, 1, x.shape[1]), S - 1, np.int64)}
        for layer, (k, v) in enumerate(past):  # (contiguous float32 copies: OpenVINO's attention reads them whole)
            inputs[f"past_key_{layer}"] = np.ascontiguousarray(k[None], np.float32)
            inputs[f"past_value_{layer}"] = np.ascontiguousarray(v[None], np.float32)
        req = self._request
        req.infer(inputs)
        out = req.get_output_tensor
        kv = [(out(self._names[f"present_key_{layer}"]).data[0, :, start:],
               out(self._names[f"present_value_{layer}"]).data[0, :, start:]) for layer in range(len(past))]
        return out(0).data[0, 0].copy(), kv
