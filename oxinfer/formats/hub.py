"""Models by name on the Hugging Face Hub, through `huggingface_hub` and its cache.

    org/repo                 an HF model directory (config.json, safetensors, tokenizer files)
    org/repo:Q4_K_M          the GGUF of the repo whose file name holds that quantization
    org/repo/file.gguf       one GGUF file of the repo
                             (a split GGUF's first shard, or either name above matching one: all its shards)
    ...@revision             a branch, tag or commit (default: main)

The environment says where and whether: `HF_HUB_CACHE` (or `HF_HOME`/hub) holds the cache,
`HF_ENDPOINT` the hub, `HF_HUB_OFFLINE=1` forbids the network (the cache must hold the model), and
`HF_TOKEN` authenticates. They are read at each call (huggingface_hub reads them once, at import).
Downloads draw huggingface_hub's progress bars on stderr ("Fetching 5 files: 100%|...", tested);
`HF_HUB_DISABLE_PROGRESS_BARS=1` turns them off. (A pseudo-terminal that reports no width gets bars
0 columns wide: nothing but line ends, which once looked like no bar at all.)
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from oxinfer.errors import ModelNotFoundError
from oxinfer.formats.gguf_file import shard_names

# what an HF directory needs, and what it may have; nothing else of a repo is downloaded
DIRECTORY_FILES = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json", "model.safetensors", "model.safetensors.index.json",
                   "model-*.safetensors"]
_NAME = re.compile(r"^(?P<repo>[\w.\-]+/[\w.\-]+)(?P<file>/[^@:]+\.gguf)?(?P<tail>(?:[:@][\w.\-/]+)*)$")


def _parse(spec: str) -> dict | None:
    """repo, file, quant and rev of a hub name (":QUANT" and "@REV" in either order), or None."""
    m = _NAME.match(spec)
    if m is None or m["repo"].endswith(".gguf"):  # dir/file.gguf is a path, never a repo
        return None
    out = {"repo": m["repo"], "file": m["file"], "quant": None, "rev": None}
    for mark, value in re.findall(r"([:@])([\w.\-/]+)", m["tail"]):
        key = "quant" if mark == ":" else "rev"
        if out[key] is not None or (key == "quant" and out["file"]):
            return None
        out[key] = value
    return out


def is_hub_name(spec: str) -> bool:
    return _parse(spec) is not None and not Path(spec).exists()


def resolve(spec: str | Path) -> Path:
    """The local path of a model given by path or by hub name (downloaded into the cache if it
    is not there, unless offline); ModelNotFoundError saying why when there is none."""
    path = Path(spec)
    m = None if path.exists() else _parse(str(spec))
    if m is None:  # a path (the file readers say what is wrong with it)
        return path
    repo, file, quant, rev = m["repo"], m["file"], m["quant"], m["rev"]
    try:
        import huggingface_hub as hub
        from huggingface_hub import utils as errors  # (where 0.24 and 2.x both keep them)
    except ImportError:  # a dependency of tokenizers: present unless uninstalled
        raise ModelNotFoundError(f"{spec}: models by name need huggingface_hub (pip install huggingface_hub)") from None
    kw = _settings()
    where = f"{repo}{'@' + rev if rev else ''}"
    try:
        if file:
            return _download(hub, repo, shard_names(file[1:]), rev, kw)
        if quant:
            return _gguf_by_quant(hub, repo, quant, rev, kw)
        return Path(hub.snapshot_download(repo, revision=rev, allow_patterns=DIRECTORY_FILES, **kw))
    except errors.LocalEntryNotFoundError as e:
        if kw["local_files_only"]:
            raise ModelNotFoundError(f"{where} is not in the Hugging Face cache ({kw['cache_dir']}) and "
                                     "HF_HUB_OFFLINE is set: download it once online (or unset HF_HUB_OFFLINE)") from e
        raise ModelNotFoundError(f"{where}: the hub at {kw['endpoint']} cannot be reached and the cache "
                                 f"({kw['cache_dir']}) does not hold it ({type(e).__name__})") from e
    except errors.RepositoryNotFoundError as e:
        raise ModelNotFoundError(f"{repo}: no such repository on {kw['endpoint']} (or it is private: set HF_TOKEN)") from e
    except errors.RevisionNotFoundError as e:
        raise ModelNotFoundError(f"{where}: no such revision of {repo}") from e
    except errors.EntryNotFoundError as e:
        raise ModelNotFoundError(f"{repo}: no file {file[1:] if file else ''!r} in the repository") from e


def _settings() -> dict:
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    cache = os.environ.get("HF_HUB_CACHE") or str(Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
                                                  / "hub")
    return {"cache_dir": cache, "local_files_only": offline,
            "endpoint": os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")}


def _gguf_by_quant(hub, repo: str, quant: str, rev: str | None, kw: dict) -> Path:
    """The one .gguf of the repo whose name holds the quantization (case-insensitive, as llama.cpp's
    -hf and Ollama match it), or the shards of one split GGUF whose names hold it."""
    if kw["local_files_only"]:  # the cached snapshot's files
        snap = Path(hub.snapshot_download(repo, revision=rev, allow_patterns=["*.gguf"], **kw))
        names = [str(p.relative_to(snap)) for p in snap.rglob("*.gguf")]
    else:
        api = hub.HfApi(endpoint=kw["endpoint"], token=os.environ.get("HF_TOKEN"))
        names = [n for n in api.list_repo_files(repo, revision=rev) if n.endswith(".gguf")]
    hits = [n for n in names if quant.lower() in Path(n).name.lower()]
    shards = shard_names(hits[0]) if hits else []
    if not hits or sorted(hits) != sorted(shards):
        listed = ", ".join(sorted(names)) or "none"
        raise ModelNotFoundError(f"{repo}:{quant}: {'no' if not hits else len(hits)} GGUF files match "
                                 f"(the repository's: {listed})")
    return _download(hub, repo, shards, rev, kw)


def _download(hub, repo: str, files: list[str], rev: str | None, kw: dict) -> Path:
    """Each file into the cache's snapshot of the revision (shards side by side), the first's path."""
    return [Path(hub.hf_hub_download(repo, f, revision=rev, **kw)) for f in files][0]

