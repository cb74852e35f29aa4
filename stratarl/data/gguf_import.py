"""Layer 5, data: a GGUF causal LM (llama.cpp's format) as a plain Hugging Face model directory.

transformers reads GGUF (`from_pretrained(..., gguf_file=...)`, with the `gguf` package) and
dequantizes every tensor to float, but marks the model as quantized, so `save_pretrained` refuses
it. The dequantized state dict loads into a fresh model of the same config (quantization entry
dropped), which saves as an ordinary directory: float32 safetensors, config, generation config, and
the GGUF's own tokenizer and chat template. `import_gguf` does that, then reloads the directory as a
user would and checks that its greedy continuations equal the GGUF-loaded model's, token for token.
The weights are the GGUF's quantized values in float: the same function as the quantized file, not
the original checkpoint's full-precision weights.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

# Chat prompts whose greedy continuations must agree between the GGUF and the imported directory.
CHECK_PROMPTS = (
    "What is 7 + 8? Reply as 'Answer: <integer>'.",
    "Name three colours.",
)
INFO_FILE = "stratarl_import.json"


@dataclass(frozen=True)
class ImportReport:
    """What `import_gguf` wrote and checked (also saved as `stratarl_import.json` in the directory)."""

    gguf_file: str
    gguf_sha256: str
    out_dir: str
    architecture: str
    num_parameters: int
    vocab_size: int
    greedy_checks: list[dict]  # per prompt: prompt, the continuation, whether both models agree
    seconds: float
    transformers_version: str

    @property
    def greedy_outputs_agree(self) -> bool:
        return all(check["agree"] for check in self.greedy_checks)


def import_gguf(
    gguf_path: str | Path,
    out_dir: str | Path,
    *,
    check_prompts: Sequence[str] = CHECK_PROMPTS,
    max_new_tokens: int = 24,
) -> ImportReport:
    """Write `gguf_path` to `out_dir` as an HF directory and check greedy outputs against the GGUF.

    Raises `ImportError` naming the package when `gguf` is missing, `ValueError` when the imported
    model's greedy continuation differs from the GGUF-loaded one (nothing is left half-written as a
    usable directory: the info file is written last)."""
    start = time.perf_counter()
    gguf_path, out = Path(gguf_path), Path(out_dir)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"no GGUF file at {gguf_path}")
    try:
        import gguf  # noqa: F401  (transformers' GGUF reader needs it)
    except ImportError as err:
        raise ImportError(
            "reading GGUF needs the gguf package: pip install gguf (make real-model does)"
        ) from err
    source = dict(pretrained_model_name_or_path=str(gguf_path.parent), gguf_file=gguf_path.name)
    tokenizer = AutoTokenizer.from_pretrained(**source)
    quantized = AutoModelForCausalLM.from_pretrained(**source, dtype=torch.float32).eval()
    plain = _unquantized_copy(quantized)
    out.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)
    del plain

    imported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    checks = [
        _greedy_check(tokenizer, quantized, imported, prompt, max_new_tokens) for prompt in check_prompts
    ]
    report = ImportReport(
        gguf_file=gguf_path.name,
        gguf_sha256=_sha256(gguf_path),
        out_dir=str(out),
        architecture=type(imported).__name__,
        num_parameters=sum(p.numel() for p in imported.parameters()),
        vocab_size=len(tokenizer),
        greedy_checks=checks,
        seconds=round(time.perf_counter() - start, 1),
        transformers_version=transformers.__version__,
    )
    if not report.greedy_outputs_agree:
        bad = next(c for c in checks if not c["agree"])
        raise ValueError(
            f"imported model's greedy output differs from the GGUF's on {bad['prompt']!r}: {bad}"
        )
    (out / INFO_FILE).write_text(json.dumps(asdict(report), indent=2) + "\n")
    return report


def _unquantized_copy(quantized: PreTrainedModel) -> PreTrainedModel:
    """A fresh model of the same config without the quantization entry, holding the same tensors."""
    config = type(quantized.config).from_dict(
        {k: v for k, v in quantized.config.to_dict().items() if k != "quantization_config"}
    )
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # assign=True takes the dequantized tensors as they are (no copy into meta storage)
    plain.load_state_dict(quantized.state_dict(), strict=True, assign=True)
    plain.tie_weights()
    plain.generation_config = quantized.generation_config
    return plain.eval()


@torch.no_grad()
def _greedy_check(tokenizer, reference, imported, prompt: str, max_new_tokens: int) -> dict:
    messages = [{"role": "user", "content": prompt}]
    ids = torch.tensor(
        [tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)]
    )
    kwargs = dict(attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens)
    expected = reference.generate(ids, **kwargs)[0, ids.shape[1] :].tolist()
    got = imported.generate(ids, **kwargs)[0, ids.shape[1] :].tolist()
    return {"prompt": prompt, "continuation": tokenizer.decode(got), "agree": got == expected}


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
