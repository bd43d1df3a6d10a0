"""The random twin written one unit at a time, with the family's own initialisation.

``from_config`` followed by ``save_pretrained`` holds the whole model in float32 and
what the writer copies (1.05 x 4 n_params: 30 GB for Mistral-7B). Here the model's
skeleton is built with its parameters on the meta device (``streaming``), and its
tensors are drawn, cast and written unit by unit (a decoder layer, the embeddings, the
LM head: ``streaming.model_units``), so that the peak is one unit in float32:

1. ``torch.manual_seed(seed)``, then the draws ``from_config`` makes while it builds the
   modules (each module's ``reset_parameters``, in module order), into scratch tensors
   that are dropped: they are overwritten by step 2 in ``from_config`` too, but they
   advance the random stream, so that the values drawn next are the same;
2. the family's ``_init_weights`` dispatched as ``PreTrainedModel.initialize_weights``
   does (children before their parent, a nested pretrained model with its own
   ``_initialize_weights``), on each module's parameters materialised in float32 just
   before; when a unit's root module is done, its tensors are cast to the saved dtype,
   written, and freed.

For the encoder families (BERT, ALBERT: every twin of ``config/test.yaml`` and the
default config) the tensors are bit-identical to ``from_config``'s; for families whose
modules draw in their constructors outside ``reset_parameters`` (GPT-2's Conv1D) or
whose head model builds and initialises its base model first (the causal LMs) the
draws follow another order: the same initialisation (distribution, scale, the special
per-name scalings of ``_init_weights``), other values; tested per tensor by mean and
standard deviation against ``from_config``.

The files are safetensors in the dtype the configuration publishes (``dtype`` /
``torch_dtype`` of config.json: bf16 for Mistral-7B; float32 when it names none, as
before), one ``model.safetensors`` when the model fits one shard, else
``model-0000i-of-0000n.safetensors`` shards of at most ``SHARD_BYTES`` with
``model.safetensors.index.json``. Each header is written first (every offset follows
from the skeleton's shapes), then the tensors in order as they are drawn. Parameters
tied to one written already (an LM head tied to the input embeddings) are left out,
as ``save_pretrained`` does.
"""

from __future__ import annotations

import gc
import json
import math
from pathlib import Path
from typing import Any, BinaryIO

from specalign.runtime import (
    HEAP_CEILING,
    heap_set_aside,
    release_freed_memory,
    set_mmap_threshold,
)
from specalign.transformers.load.families import adapter_for
from specalign.transformers.load.streaming import (
    STREAM_MMAP_THRESHOLD,
    model_units,
    parameters_on_meta,
)

#: Largest shard file (the size the Hub's large checkpoints use).
SHARD_BYTES = 5 * 10**9
#: Bytes of the saved dtype cast and written at once.
WRITE_SLICE_BYTES = 2**26
_ST_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64"}


def saved_dtype(config: Any) -> Any:
    """The dtype the configuration publishes its weights in (float32 when none)."""
    import torch

    name = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(name, torch.dtype):
        name = str(name).removeprefix("torch.")
    if name in (None, "auto"):
        return torch.float32
    if name not in _ST_DTYPES:
        raise ValueError(f"config.json dtype {name!r} is not a float dtype a twin can be saved in")
    return getattr(torch, name)


def _materialise(module: Any, ids: set[int], once: bool = False) -> None:
    """Float32 storage for the module's own meta parameters whose ids are in ``ids``
    (with ``once``, each id is then removed: a tied parameter is drawn once)."""
    import torch

    for n, p in list(module._parameters.items()):
        if p is not None and p.device.type == "meta" and id(p) in ids:
            if once:
                ids.discard(id(p))
            module._parameters[n] = torch.nn.Parameter(
                torch.empty(p.shape, dtype=torch.float32), requires_grad=False
            )


class _ShardWriter:
    """Writes the planned tensors into their shards, in plan order, header first."""

    def __init__(self, folder: Path, plan: list[list[tuple[str, tuple[int, ...]]]], dtype: Any):
        import torch

        self.folder, self.dtype = folder, dtype
        self.code = _ST_DTYPES[str(dtype).removeprefix("torch.")]
        self.size = torch.empty((), dtype=dtype).element_size()
        n = len(plan)
        self.files = (
            ["model.safetensors"]
            if n == 1
            else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
        )
        self.shard_of: dict[str, int] = {}
        self.order: list[list[str]] = []
        self.headers: list[dict[str, Any]] = []
        for i, tensors in enumerate(plan):
            header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
            offset = 0
            for name, shape in tensors:
                nbytes = math.prod(shape) * self.size
                header[name] = {"dtype": self.code, "shape": list(shape),
                                "data_offsets": [offset, offset + nbytes]}  # fmt: skip
                offset += nbytes
                self.shard_of[name] = i
            self.headers.append(header)
            self.order.append([name for name, _ in tensors])
        self._open: tuple[int, BinaryIO] | None = None
        self._next = [0] * n

    def _file(self, i: int) -> BinaryIO:
        if self._open is not None and self._open[0] == i:
            return self._open[1]
        self.close()
        f = open(self.folder / self.files[i], "wb")  # noqa: SIM115 (closed by close())
        raw = json.dumps(self.headers[i], separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # the data start 8-byte aligned
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        self._open = (i, f)
        return f

    def write(self, name: str, tensor: Any) -> None:
        import torch

        i = self.shard_of[name]
        if self.order[i][self._next[i]] != name:
            raise RuntimeError(f"{name} drawn out of the planned order")
        # cast and written a slice at a time: a whole cast copy beside the float32 draw
        # (Llama-3-70B's embedding: 2.1 GB of bf16 beside 4.2 GB) set the twin's peak
        flat = tensor.detach().contiguous().view(-1)
        step = max(1, WRITE_SLICE_BYTES // self.size)
        f = self._file(i)
        for a in range(0, flat.numel(), step):
            part = flat[a : a + step].to(self.dtype)
            f.write(memoryview(part.view(torch.uint8).numpy()))
        self._next[i] += 1

    def close(self) -> None:
        if self._open is not None:
            self._open[1].close()
            self._open = None

    def finish(self) -> None:
        self.close()
        for i, names in enumerate(self.order):
            if self._next[i] != len(names):
                raise RuntimeError(
                    f"{self.files[i]}: {len(names) - self._next[i]} tensors unwritten"
                )
        if len(self.files) > 1:
            index = {
                "metadata": {"total_size": sum(
                    h[n]["data_offsets"][1] - h[n]["data_offsets"][0]
                    for h in self.headers for n in h if n != "__metadata__")},
                "weight_map": {n: self.files[i] for n, i in self.shard_of.items()},
            }  # fmt: skip
            (self.folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def write_random_weights(
    model_class: Any, config: Any, folder: Path, seed: int, shard_bytes: int = SHARD_BYTES
) -> dict[str, Any]:
    """Draw the random twin of ``config`` (a ``transformers`` configuration) with
    ``model_class``'s initialisation under ``seed`` and write its weights and config.json
    into ``folder`` (module doc). Returns what was written: dtype, files, bytes, the
    largest unit's float32 bytes."""
    import torch
    from transformers.modeling_utils import PreTrainedModel

    dtype = saved_dtype(config)
    with parameters_on_meta():
        model = model_class.from_config(config, dtype=torch.float32)
    adapter = adapter_for(config.to_dict())
    units = model_units(model, adapter)
    # names written: the first of every tied group, as save_pretrained keeps it
    seen: set[int] = set()
    keep: dict[str, tuple[int, ...]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) not in seen:
            seen.add(id(p))
            keep[name] = tuple(p.shape)
    keep_ids = {id(model.get_parameter(n)) for n in keep}
    size = torch.empty((), dtype=dtype).element_size()
    plan: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    used = 0
    for names in units.values():
        tensors = [(n, keep[n]) for n in names if n in keep]
        if not tensors:  # an LM head tied to the embeddings: nothing of its own
            continue
        nbytes = sum(math.prod(s) for _, s in tensors) * size
        if plan[-1] and used + nbytes > shard_bytes:
            plan.append([])
            used = 0
        plan[-1].extend(tensors)
        used += nbytes
    unit_of = {n: path for path, names in units.items() for n in names}
    remaining = {path: {n for n in names if n in keep} for path, names in units.items()}
    writer = _ShardWriter(folder, plan, dtype)
    for m in model.modules():  # the skeleton's post_init marked every module done
        m.__dict__.pop("_is_hf_initialized", None)
    torch.manual_seed(seed)
    with torch.no_grad():
        # 1. the constructors' draws, into scratch storage
        for m in model.modules():
            if hasattr(m, "reset_parameters") and any(
                p.device.type == "meta" for p in m.parameters(recurse=False)
            ):
                saved = dict(m._parameters)
                _materialise(m, {id(p) for p in saved.values() if p is not None})
                m.reset_parameters()
                m._parameters.update(saved)

        # 2. the family's initialisation, unit by unit, written as each unit completes
        def done(prefix: str, module: Any) -> None:
            for n, p in list(module._parameters.items()):
                full = prefix + n
                if full in remaining.get(unit_of.get(full, ""), ()):
                    writer.write(full, p)
                    module._parameters[n] = torch.nn.Parameter(
                        torch.empty(p.shape, dtype=p.dtype, device="meta"), requires_grad=False
                    )

        def apply(module: Any, fn: Any, prefix: str) -> None:
            for child_name, child in module.named_children():
                own = child._initialize_weights if isinstance(child, PreTrainedModel) else fn
                apply(child, own, f"{prefix}{child_name}.")
            _materialise(module, keep_ids, once=True)
            fn(module, False)
            path = prefix.rstrip(".")
            if path in units:  # a unit's root: every tensor below it is final
                for sub_path, sub in module.named_modules():
                    done(f"{path}.{sub_path}." if sub_path else f"{path}.", sub)
                gc.collect()
                release_freed_memory()  # see below

        # each unit's drawn tensors are collected as it is written: scan only what is
        # drawn here (runtime.set_aside_heap). The heap must not grow with depth: under
        # glibc's own raised mmap threshold the slices cast for writing landed on the
        # heap, whose freed pages stay resident, and the peak grew by 32 MiB a layer
        # (Mistral-7B's twin: 1.24 GB at 1 layer, 1.53 at 10, 2.43 at 32; 16 MiB a
        # layer with the threshold set alone). Large blocks are mapped apart from the
        # heap, as while a model streams, and each written unit's freed heap pages are
        # handed back (flat at 1.28 GB from 1 to 8 layers)
        set_mmap_threshold(STREAM_MMAP_THRESHOLD)
        try:
            with heap_set_aside():
                apply(model, model._initialize_weights, "")
        finally:
            set_mmap_threshold(HEAP_CEILING)
    writer.finish()
    config.dtype = dtype
    config.save_pretrained(str(folder))
    largest = max(sum(math.prod(model.get_parameter(n).shape) for n in names)
                  for names in units.values()) * 4  # fmt: skip
    return {"dtype": str(dtype).removeprefix("torch."), "files": writer.files,
            "largest_unit_f32_bytes": int(largest)}  # fmt: skip
