"""Random-weight checkpoints at any size, written the way ``save_pretrained`` writes them,
without ever holding the model in memory (for the benchmarks).

``save_pretrained`` needs the instantiated model: 10.6 GB of float32 for GPT-Neo 2.7B,
before the file is even written. Here the model is instantiated on the ``meta`` device
(shapes only, no memory), and each tensor is generated and appended to the safetensors
file one at a time, so a checkpoint of any size costs about one tensor of memory.
:func:`check_layout` builds a tiny model both ways and compares the file names, tensor
names, dtypes, shapes and config.json, so the streamed layout cannot drift from the
library's.

Initialisation: N(0, ``initializer_range``) for every matrix (the scale the families
initialise with), LayerNorm gains 1, biases 0: the random-weight checkpoints have the
published sizes and the families' initial scale, not their trained values.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np


def _auto_class(architecture: str) -> Any:
    import transformers

    return getattr(transformers, architecture)


def checkpoint_shapes(config: Any) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of ``config.architectures[0]``'s checkpoint, as
    ``save_pretrained`` writes it: tied weights once (under their first name)."""
    import torch

    with torch.device("meta"):
        model = _auto_class(config.architectures[0])(config)
    kept = {name for name, _ in model.named_parameters()}  # duplicates (tied) dropped
    kept |= {name for name, _ in model.named_buffers()}
    state = model.state_dict()  # persistent buffers only
    return {k: tuple(v.shape) for k, v in state.items() if k in kept}


def random_tensor(name: str, shape: tuple[int, ...], gen: Any, std: float) -> Any:
    """N(0, std) matrices, LayerNorm gains 1, biases 0 (float32)."""
    import torch

    if len(shape) >= 2:
        return torch.randn(shape, generator=gen, dtype=torch.float32).mul_(std)
    if name.endswith((".weight", ".gamma")):
        return torch.ones(shape, dtype=torch.float32)
    return torch.zeros(shape, dtype=torch.float32)


def write_safetensors_streaming(
    path: Path, shapes: Mapping[str, tuple[int, ...]], make: Callable[[str], Any]
) -> int:
    """Write float32 tensors ``make(name)`` to ``path`` one at a time in the safetensors
    format (header as safetensors writes it: names sorted, 8-byte aligned, format "pt").
    Returns the number of bytes written."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    names = sorted(shapes)
    for name in names:
        nbytes = 4 * int(np.prod(shapes[name], dtype=np.int64))
        header[name] = {
            "dtype": "F32",
            "shape": list(shapes[name]),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for name in names:
            t = make(name).contiguous()
            assert tuple(t.shape) == tuple(shapes[name])
            f.write(memoryview(t.numpy()).cast("B"))
            del t
    return 8 + len(raw) + offset


def build_checkpoint(out_dir: Path, config: Any, seed: int = 0) -> dict[str, Any]:
    """A random-weight checkpoint of ``config`` (its ``architectures[0]``) in ``out_dir``:
    config.json and one model.safetensors, streamed. Returns its size and build time."""
    import torch

    t0 = time.perf_counter()
    shapes = checkpoint_shapes(config)
    config.dtype = torch.float32
    out_dir.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out_dir)
    if _auto_class(config.architectures[0]).can_generate():
        from transformers import GenerationConfig

        GenerationConfig.from_model_config(config).save_pretrained(out_dir)
    gen = torch.Generator().manual_seed(seed)
    std = float(config.initializer_range)
    nbytes = write_safetensors_streaming(
        out_dir / "model.safetensors",
        shapes,
        lambda name: random_tensor(name, shapes[name], gen, std),
    )
    return {
        "n_params": sum(int(np.prod(s, dtype=np.int64)) for s in shapes.values()),
        "bytes": nbytes,
        "build_s": time.perf_counter() - t0,
    }


def safetensors_header(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n))


def check_layout(tmp: Path, config: Any) -> list[str]:
    """Build ``config`` (a tiny one) with ``save_pretrained`` and with
    :func:`build_checkpoint`; return the differences in file names, tensor names, dtypes,
    shapes and config.json (empty when the layouts agree)."""
    import torch

    ref, ours = tmp / "layout_ref", tmp / "layout_ours"
    torch.manual_seed(0)
    model = _auto_class(config.architectures[0])(config)
    model.save_pretrained(ref)
    del model
    build_checkpoint(ours, type(config).from_dict(config.to_dict()))
    problems = []
    files = [sorted(p.name for p in d.iterdir()) for d in (ref, ours)]
    if files[0] != files[1]:
        problems.append(f"files {files[1]} != {files[0]}")

    def desc(h: dict[str, Any]) -> dict[str, Any]:
        return {k: (v if k == "__metadata__" else (v["dtype"], v["shape"])) for k, v in h.items()}

    headers = [desc(safetensors_header(d / "model.safetensors")) for d in (ref, ours)]
    if headers[0] != headers[1]:
        only = sorted(set(headers[0]) ^ set(headers[1]))
        problems.append(f"safetensors headers differ (names only in one: {only[:6]})")
    cfgs = [json.loads((d / "config.json").read_text()) for d in (ref, ours)]
    diff = sorted(k for k in cfgs[0].keys() | cfgs[1].keys() if cfgs[0].get(k) != cfgs[1].get(k))
    if diff:
        problems.append(f"config.json differs in {diff}")
    shutil.rmtree(ref)
    shutil.rmtree(ours)
    return problems
