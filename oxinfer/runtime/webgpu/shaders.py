"""The WGSL of every kernel, assembled from the files of shaders/: which snippets a weight format's
decoder and a kernel family need, in which order, with their unrolled lines expanded."""

from __future__ import annotations

import re
from pathlib import Path

from oxinfer.errors import WebGpuUnavailable
from oxinfer.formats.iquants import GRIDS
from oxinfer.runtime.webgpu.kernels import BLK_SHAPES, BLK_SHARED, I8_R, I8_T, I8_TY


def shader_dir() -> Path:
    """shaders/ of a source checkout, else where a wheel installs them (pyproject data-files)."""
    import sys

    for d in (Path(__file__).resolve().parents[3] / "shaders", Path(sys.prefix) / "share" / "oxinfer" / "shaders"):
        if (d / "common.wgsl").is_file():
            return d
    raise WebGpuUnavailable("the WGSL kernels (shaders/*.wgsl) are not installed")




# qtype -> decode snippet; F32/F16 have no kernel: such matrices stay on the CPU
DECODERS = {"BF16": "decode_bf16", "Q8_0": "decode_q8_0", "Q4_0": "decode_q4_0", "Q4_1": "decode_q4_1",
             "Q5_0": "decode_q5_0", "Q5_1": "decode_q5_1", "IQ4_NL": "decode_iq4_nl", "Q2_K": "decode_q2_k",
             "Q3_K": "decode_q3_k", "Q4_K": "decode_q4_k", "Q5_K": "decode_q5_k", "Q6_K": "decode_q6_k",
             "IQ4_XS": "decode_iq4_xs", "IQ2_XXS": "decode_iq2_xxs", "IQ2_XS": "decode_iq2_xs",
             "IQ2_S": "decode_iq2_s", "IQ3_XXS": "decode_iq3_xxs", "IQ3_S": "decode_iq3_s", "IQ1_S": "decode_iq1_s",
             "IQ1_M": "decode_iq1_m"}
# qtype -> the snippets its decoder shares with another's, put before it
_DECODER_PRELUDES = {"Q4_K": ("kquant_scales",), "Q5_K": ("kquant_scales",), "IQ4_NL": ("iq4_levels",),
                     "IQ4_XS": ("iq4_levels",), **dict.fromkeys(GRIDS, ("iq_grid",))}
# kernel file -> the shared files it is appended to (after common + decoder)
_PRELUDES = {"matvec": ("matvec_common",), "matvec_subgroup": ("matvec_common",), "matvec_block": ("matvec_common", "xq_block"),
             "gemm_f16": ("matmul",), "gemm_i8": ("matvec_common", "xq_block", "matvec_block", "matmul")}
# kernel file -> the sizes kernels.py decides that its WGSL reads as constants
_DECLARED = {"matvec_block": {**dict(zip(("BLK_ROWS", "BLK_WG"), BLK_SHAPES["mv_blk_i8"])), "BLK_SHARED": BLK_SHARED},
             "gemm_i8": {"I8_R": I8_R, "I8_T": I8_T, "I8_TY": I8_TY}, "iq4_levels": {"IQ4_PACKED": 0}}
# kernel kind -> its own sizes, in place of its file's (one entry point compiled in several forms)
_KIND_SIZES = {k: dict(zip(("BLK_ROWS", "BLK_WG"), shape)) for k, shape in BLK_SHAPES.items()}
_KIND_SIZES |= {k: {"IQ4_PACKED": 1} for k in ("mv_subgroup", "mv_subgroup256")}  # (shaders/iq4_levels.wgsl)
# kernel file -> the WGSL extensions it enables (an `enable` directive must open the module)
_ENABLES = {"gemm_f16": "enable f16;"}
# kernel kind -> (file, entry point)
KERNELS = {
    "mv_rows": ("matvec", "mv_rows"),
    "mv_wg": ("matvec", "mv_wg"),
    "mv_subgroup": ("matvec_subgroup", "mv_subgroup"),
    "mv_subgroup256": ("matvec_subgroup", "mv_subgroup256"),
    "mv_tok": ("matvec", "mv_tok"),
    "mv_blk_i8": ("matvec_block", "mv_blk_i8"),  # a decode step's product on x in int8 (dot4I8Packed)
    "mv_blk_i8_1": ("matvec_block", "mv_blk_i8"),  # ... its one-token form (8 rows a workgroup)
    "xq_k": ("matvec_block", "xq_k"),  # ... after x is made int8 blocks
    "mm_tiled": ("matmul", "mm_tiled"),
    "mm_tiled64": ("matmul", "mm_tiled64"),
    "mm_kt": ("gemm_f16", "mm_kt"),  # a prompt's product in f16 from the operands wt_k and xt_k made (needs shader-f16)
    "wt_k": ("gemm_f16", "wt_k"),
    "xt_k": ("gemm_f16", "xt_k"),
    "mm_i8": ("gemm_i8", "mm_i8"),  # a prompt's product on x in int8 blocks (xq_k's) and W's blocks as int8
    "embed": ("embed", "embed"),  # the embedding lookup of the device-resident forward (runner.py)
}



MM_ROWS = 8  # token rows of x an invocation of the tile kernels holds (ROWS of their unrolled lines)

# the KV pool in float16 (kv_half): each vec4 of keys or values held as 4 halves in 2 words
_KV_HALF_DECL = "var<storage, read_write> {p}: array<vec4<f32>>;"
_KV_HALF = """
fn {p}_get(i: u32) -> vec4<f32> {{
    let w = {p}[i];
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}}
fn {p}_put(i: u32, x: vec4<f32>) {{
    {p}[i] = vec2<u32>(pack2x16float(x.xy), pack2x16float(x.zw));
}}
"""


def kv_half(code: str) -> str:
    """The attention kernels' WGSL (shaders/attention*.wgsl, whose pools are kpool and vpool, arrays
    of vec4<f32>) with the pools in float16: each `pool[i] = x;` stored through pack2x16float, each
    `pool[i]` read through unpack2x16float, and rope_kv's pair of floats (elements e, e + 1 of one
    vec4: e even) packed into one word. The float32 kernels stay as written."""
    for p, e in (("kpool", "ko"), ("vpool", "vo")):
        decl = _KV_HALF_DECL.format(p=p)
        if decl not in code:
            continue
        pair = f"{p}[{e} >> 2u][{e} & 3u] = a;\n        {p}[{e} >> 2u][({e} & 3u) + 1u] = b;"
        packed = f"{p}[{e} >> 2u][({e} & 3u) >> 1u] = pack2x16float(vec2<f32>(a, b));"
        if "fn rope_kv" in code and pair not in code:
            raise ValueError(f"kv_half: rope_kv's pair of stores to {p} is not as expected")
        code = code.replace(pair, packed)
        out, at = [], 0
        while (i := code.find(p + "[", at)) >= 0:
            if code[i - 1].isalnum() or code[i - 1] == "_" or code.startswith(packed, i):
                out.append(code[at:i + len(p)])
                at = i + len(p)
                continue
            depth, j = 0, i + len(p)  # j: the index's closing bracket
            while depth := depth + {"[": 1, "]": -1}.get(code[j], 0):
                j += 1
            index = code[i + len(p) + 1:j]
            if store := re.match(r"\s*=(?!=)([^;]*);", code[j + 1:]):  # pool[i] = x;
                out.append(code[at:i] + f"{p}_put({index}, {store[1].strip()});")
                at = j + 1 + store.end()
            else:
                out.append(code[at:i] + f"{p}_get({index})")
                at = j + 1
        code = "".join(out) + code[at:]
        code = code.replace(decl, decl.replace("array<vec4<f32>>", "array<vec2<u32>>") + _KV_HALF.format(p=p))
    return code


def unroll(code: str, consts: dict[str, int]) -> str:
    """WGSL with every line ending in "// unroll d < NAME" repeated for d = 0 .. consts[NAME] - 1:
    "{d}" replaced by d, "{d4}" by d // 4, "{dm}" by d % 4 and "{dc}" by the component "xyzw"[d % 4].
    "// unroll h < A, d < B" repeats it for every h and d ("{h}" replaced by h), h the outer.
    The kernels' registers are named, one per d: an array indexed in a loop may live in memory
    (which made attend_rows 2.5x slower on an H200)."""
    out = []
    for line in code.splitlines():
        body, mark, bounds = line.partition("// unroll ")
        if not mark:
            out.append(line)
            continue
        lines = [body.rstrip()]
        for clause in bounds.split(","):
            var, _, name = (part.strip() for part in clause.partition("<"))
            lines = [_unrolled(text, var, i) for text in lines for i in range(consts[name])]
        out += lines
    return "\n".join(out)


def _unrolled(text: str, var: str, i: int) -> str:
    if var == "d":
        text = text.replace("{d4}", str(i // 4)).replace("{dm}", str(i % 4)).replace("{dc}", "xyzw"[i % 4])
    return text.replace("{" + var + "}", str(i))


def shader_source(qtype: str, kind: str, **sizes: int) -> str:
    """The WGSL of one kernel for one weight format: common + decoder (after what it shares with
    its kin) + kernel file, its unrolled lines expanded; the sizes it shares with kernels.py
    (_DECLARED, the kind's own _KIND_SIZES, or `sizes` in their place: benchmarks try others)
    declared first."""
    file = KERNELS[kind][0]
    parts = ["common", *_DECODER_PRELUDES.get(qtype, ()), DECODERS[qtype], *_PRELUDES.get(file, ()), file]
    d = shader_dir()
    consts = {name: n for p in parts for name, n in _DECLARED.get(p, {}).items()} | _KIND_SIZES.get(kind, {}) | sizes
    code = "\n".join(([_ENABLES[file]] if file in _ENABLES else []) + [f"const {k}: u32 = {n}u;" for k, n in consts.items()]
                     + [(d / f"{p}.wgsl").read_text() for p in parts])
    return unroll(code, {"ROWS": MM_ROWS, **consts})
