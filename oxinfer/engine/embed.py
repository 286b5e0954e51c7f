"""Embeddings: a prompt-only pass per input on the CPU executor (its products batched with the other
requests' in the scheduler), the final norm's output pooled and L2-normalized; no KV is kept.

Pooling: the model's own where it names one (a GGUF's pooling_type, as llama.cpp reads it; a
sentence-transformers directory's 1_Pooling), else "mean" (every position's row: what llama.cpp's
--pooling mean and sentence-transformers' mean pooling do, as decoder-only chat models such as
SmolLM2, Llama and Qwen have no pooling of their own); or as asked: "mean", "cls" (the first row)
or "last" (the last token's row: how last-token embedding models such as e5-mistral and
Qwen3-Embedding are read).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from oxinfer.errors import ContextOverflowError
from oxinfer.runtime.executor import PREFILL_CHUNK

POOLINGS = ("mean", "cls", "last")
BATCH_ROWS = 2048  # inputs stacked into one pass up to this many rows
MAX_INPUTS = 2048  # inputs a request (OpenAI's limit: 40k held the server's loop for 1.4 s)


def inputs_ids(engine, inputs) -> list[list[int]]:
    """Text, token ids, or a list of either -> one id list per input; ValueError if unusable."""
    if isinstance(inputs, str) or (isinstance(inputs, Sequence) and inputs and all(
            isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in inputs)):
        inputs = [inputs]
    if isinstance(inputs, np.ndarray) and inputs.ndim == 1:
        inputs = [inputs.tolist()]
    if not isinstance(inputs, Sequence) or isinstance(inputs, str) or not inputs:
        raise ValueError("input: give a text, a list of texts, token ids, or a list of token-id lists")
    if len(inputs) > MAX_INPUTS:
        raise ValueError(f"input: {len(inputs)} inputs, at most {MAX_INPUTS} a request (OpenAI's limit)")
    out = []
    for i, x in enumerate(inputs):
        if isinstance(x, (str, Sequence, np.ndarray)) and not (isinstance(x, Sequence) and x and isinstance(x[0], dict)):
            try:
                ids = engine.prompt_ids(x)
            except ValueError as e:
                raise ValueError(f"input[{i}]: {e}") from None
        else:
            raise ValueError(f"input[{i}]: must be a text or a list of token ids")
        if len(ids) > engine.config.context_length:
            raise ContextOverflowError(f"input[{i}]: {len(ids)} tokens exceed the context length "
                                       f"({engine.config.context_length})")
        out.append(ids)
    return out


async def embed(engine, inputs, pooling: str | None = None, normalize: bool = True) -> np.ndarray:
    """(n inputs, d) float32 embeddings (pooling: None, the model's own or mean)."""
    pooling = pooling or engine.config.pooling or "mean"
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
    ids = inputs_ids(engine, inputs)
    model, scheduler = engine.model, engine.scheduler
    out = np.empty((len(ids), model.cfg.d_model), np.float32)
    batch: list[int] = []
    rows = 0  # the batch's

    async def run(members: list[int]) -> None:
        seqs = [np.asarray(ids[i]) for i in members]
        caches = [model.new_cache(len(s)) for s in seqs]  # dropped after: no KV is kept
        rows = await scheduler.run(model.normed_hidden, seqs, caches, solo=True, requests=len(seqs))
        at = np.cumsum([0] + [len(s) for s in seqs])
        for k, i in enumerate(members):
            out[i] = _pool(rows[at[k]:at[k + 1]], pooling)

    for i, seq in enumerate(ids):
        if len(seq) > PREFILL_CHUNK:  # alone, in chunks (attention's scores stay bounded)
            cache, parts = model.new_cache(len(seq)), []
            for c in range(0, len(seq), PREFILL_CHUNK):
                parts.append(await scheduler.run(model.normed_hidden, [np.asarray(seq[c:c + PREFILL_CHUNK])], [cache],
                                                 solo=True))
            out[i] = _pool(np.concatenate(parts), pooling)
            continue
        if batch and rows + len(seq) > BATCH_ROWS:
            await run(batch)
            batch, rows = [], 0
        batch.append(i)
        rows += len(seq)
    if batch:
        await run(batch)
    if normalize:
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), np.float32(1e-12))
    return out


def _pool(rows: np.ndarray, pooling: str) -> np.ndarray:
    return rows.mean(axis=0) if pooling == "mean" else rows[0] if pooling == "cls" else rows[-1]
