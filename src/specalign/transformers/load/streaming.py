"""The real model run from its checkpoint with one layer's weights resident at a time.

The real-model passes of the study (propagation's ``real_model`` states, steering's
embedding output and the causal LM's next-token probabilities) need the family's own
forward (embeddings, FFNs, norms, rotary, masks), but not the whole model in memory:
Llama-3-70B is 141 GB in bf16 and 282 GB in float32, one of its decoder layers 3.4 GB
in float32. :func:`streamed_model` therefore builds the family's ``transformers`` model
with its *parameters* on the meta device (no storage; buffers such as rotary tables are
real, as the family computes them) and attaches a pre-forward hook to every *unit*
(each decoder layer, and each module outside the layers that owns parameters:
embeddings, final norm, LM head, projections). The hook reads the unit's tensors from
the checkpoint in their stored dtype (bf16, fp16, fp32 as published: ``safe_open`` per
tensor, or the memory-mapped ``pytorch_model*.bin``), casts them to the compute dtype
(float32, or float64 where the study asks), moves them to the device, and frees the
unit that was resident before: at most one unit's weights exist at any moment, and the
model is a plain ``transformers`` model for everything else (hooks, hidden states).

The vocabulary's two units are never held whole in the compute dtype (Llama-3-70B's
token table is 128,256 x 8192: 4.2 GB in float32): the input embedding reads only the
rows of the ids it is given (its pre-hook renumbers the ids into them; the looked-up
values are the table's), and a causal LM's head stays resident in its stored dtype and
is applied a slice of the vocabulary at a time (:data:`HEAD_SLICE_BYTES`), each slice
cast as it is used. Float tensors of safetensors files are read by plain reads into
their own buffer (``checkpoint.read_rows``): a memory-mapped read followed by a copy
held the tensor twice.

Several forwards that differ only from one module on (steering's variants of the last
layer's W_O) run in *lockstep* (:func:`forwards_in_lockstep`): each in a thread of its
own, the threads taking turns, all of them through a unit before the next is read, so
that every unit is read once for all of them; the modules before the one where they
differ run once, and the other forwards replay their outputs.

The decoder layers are found from the family adapter: its ``probe`` tensor name
(``layers.0.self_attn.o_proj.weight``, ``encoder.layer.0.attention...``) names the
layer list before its first numeric component, so no family's layout is listed here.
Checkpoint names are the model's with the base-model prefix swapped for the one the
checkpoint uses (found by the adapter's probe, as ``extract.find_prefix``), TF-port
``gamma``/``beta`` names accepted, and tied weights (an LM head absent from the
checkpoint) read from the tensor they are tied to.

Why not accelerate's disk offload: its hooks (``AlignDevicesHook``) are the same
mechanism, but it is not a dependency of the workflow, and its offload reads float32
copies (or the checkpoint's dtype uncast), where this module casts one unit at a time
from the stored dtype and releases the previous unit before loading the next.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import math
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from specalign.io import InputFileError
from specalign.runtime import HEAP_CEILING, heap_set_aside, set_mmap_threshold
from specalign.transformers.load import checkpoint
from specalign.transformers.load.extract import CheckpointReader, find_prefix, read_config
from specalign.transformers.load.families import FamilyAdapter, adapter_for

#: Bytes per value of the dtypes a checkpoint may store (safetensors dtype names).
DTYPE_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2}


#: Blocks of at least this many bytes are mapped apart from glibc's heap while a
#: model streams (see LayerStream)
STREAM_MMAP_THRESHOLD = 2**20

#: The output head (vocabulary x d) is applied in slices of about this many bytes in
#: the compute dtype: it stays resident in its stored dtype, and a slice at a time is
#: cast, so that Llama-3-70B's head (128,256 x 8192: 4.2 GB in float32) costs its
#: 2.1 GB of bf16 and one slice. A head within one slice is applied whole, as before.
HEAD_SLICE_BYTES = 2**28

#: The dtype a streamed model computes in unless its caller names another: the
#: issue's float32, whatever the checkpoint stores (callers that prepare tensors for
#: the model, such as steering's W_O variants, cast to this same name)
COMPUTE_DTYPE = "float32"


class LayerTooLargeError(InputFileError):
    """One unit of the model does not fit the memory limit even streamed."""


class _TorchCheckpoint(CheckpointReader):
    """The checkpoint's tensors as torch tensors in their stored dtype, one at a time.

    Float tensors of safetensors files are read by plain reads
    (:func:`specalign.transformers.load.checkpoint.read_rows`), so that a tensor costs its
    own bytes of memory and no mapped pages beside them; other dtypes and ``.bin``
    files go through their libraries."""

    def __init__(self, model_dir: Path) -> None:
        super().__init__(model_dir)
        self._headers: dict[Path, dict[str, dict[str, Any]]] = {}

    def header(self, key: str) -> dict[str, Any] | None:
        """The safetensors header entry of ``key`` (dtype, shape, offsets); None in a
        pickled checkpoint."""
        file = self._where[key]
        if file.suffix != ".safetensors":
            return None
        if file not in self._headers:
            self._headers[file] = checkpoint.read_header(file)
        return self._headers[file][key]

    def entry(self, key: str) -> dict[str, Any] | None:
        """The safetensors header entry of ``key`` when it is read by plain reads."""
        entry = self.header(key)
        return entry if entry is not None and entry["dtype"] in checkpoint.FLOAT_DTYPES else None

    def tensor(self, key: str) -> Any:
        return self.rows(key)

    def rows(self, key: str, start: int = 0, stop: int | None = None) -> Any:
        """Rows ``[start, stop)`` of tensor ``key`` (all of it by default)."""
        file = self._where[key]
        try:
            entry = self.entry(key)
            if entry is not None:
                return checkpoint.read_rows(file, entry, start, stop)
            if file.suffix == ".safetensors":
                from safetensors import safe_open

                # opened per tensor: a handle kept open would keep every page read mapped
                with safe_open(file, framework="pt") as handle:
                    if start == 0 and stop is None:
                        return handle.get_tensor(key).clone()
                    return handle.get_slice(key)[start:stop].clone()
            whole = self._handle(file)[key]
            return (whole if start == 0 and stop is None else whole[start:stop]).clone()
        except InputFileError:
            raise
        except Exception as exc:
            raise InputFileError(f"{file}: cannot read tensor {key!r} ({exc})") from exc

    def row(self, key: str, index: int) -> Any:
        """Row ``index`` of a 2-d tensor, without reading the rest."""
        return self.rows(key, int(index), int(index) + 1)[0]

    def file_of(self, key: str) -> Path:
        return self._where[key]


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Build modules with their parameters on the meta device and their buffers real
    (rotary frequencies, position ids, embedding scales are computed by the family's own
    constructors and are not in the checkpoint). Each parameter is first made by the
    family's constructor on the CPU and moved at once, so it is never written: with
    deterministic algorithms on, torch would fill it with NaN first (minutes at 70B)."""
    import torch
    import torch.utils.deterministic

    original = torch.nn.Module.register_parameter
    fill = torch.utils.deterministic.fill_uninitialized_memory

    def register(module: Any, name: str, param: Any) -> None:
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            module._parameters[name] = torch.nn.Parameter(param.to("meta"), requires_grad=False)

    torch.nn.Module.register_parameter = register  # type: ignore[method-assign]
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original  # type: ignore[method-assign]
        torch.utils.deterministic.fill_uninitialized_memory = fill  # type: ignore[attr-defined]


def layer_container(adapter: FamilyAdapter) -> str:
    """The base-model-relative path of the family's list of decoder layers (ALBERT: of
    its layer groups), from the adapter's probe tensor name: the components before its
    first numeric one (``layers.0.self_attn.o_proj.weight`` -> ``layers``)."""
    parts = adapter.probe.split(".")
    first = next(i for i, p in enumerate(parts) if p.isdigit())
    return ".".join(parts[:first])


def _base_prefix(model: Any) -> str:
    """The attribute holding the base model inside a head model ("" for a base model)."""
    base = getattr(model, "base_model_prefix", "")
    return base if base and hasattr(model, base) and model is not model.base_model else ""


def layers_path(model: Any, adapter: FamilyAdapter) -> str:
    """The module path of the decoder layers' list in ``model`` (base or head model)."""
    container, base = layer_container(adapter), _base_prefix(model)
    return f"{base}.{container}" if base else container


def model_units(model: Any, adapter: FamilyAdapter) -> dict[str, list[str]]:
    """Unit path -> the full names of its parameters, in the model's module order: each
    decoder layer is one unit, and so is every other module owning parameters directly,
    with everything below it (so that no unit is released while a module around it
    still computes)."""
    container = layers_path(model, adapter)
    layer_paths = [f"{container}.{i}" for i in range(len(model.get_submodule(container)))]
    units: dict[str, list[str]] = {}
    covered: tuple[str, ...] = tuple(f"{p}." for p in layer_paths)
    for path, module in model.named_modules():
        owns = any(True for _ in module.named_parameters(recurse=False))
        if path in layer_paths or (path and owns and not path.startswith(covered)):
            units[path] = [f"{path}.{n}" for n, _ in module.named_parameters()]
            if path not in layer_paths:
                covered = (*covered, f"{path}.")
    if any(True for _ in model.named_parameters(recurse=False)):
        raise ValueError(f"{type(model).__name__} owns parameters at its root")
    return units


def _input_embeddings(model: Any) -> Any:
    try:
        return model.get_input_embeddings()
    except (NotImplementedError, AttributeError):
        return None


def _output_embeddings(model: Any) -> Any:
    try:
        return model.get_output_embeddings()
    except (NotImplementedError, AttributeError):
        return None


def _head_class(kind: str) -> Any:
    from transformers import AutoModel, AutoModelForCausalLM

    return {"base": AutoModel, "causal_lm": AutoModelForCausalLM}[kind]


class LayerStream:
    """The hooks and checkpoint of a streamed model (``model.specalign_stream``)."""

    def __init__(
        self,
        model: Any,
        model_dir: Path,
        adapter: FamilyAdapter,
        device: str,
        dtype: Any,
    ) -> None:
        self.model, self.model_dir, self.adapter = model, model_dir, adapter
        self.device, self.dtype = device, dtype
        self.ckpt = _TorchCheckpoint(model_dir)
        # what the stream changes in the model and the process, undone by close and by a
        # construction that fails part way (a parameter whose tensor cannot be found,
        # say): the API's callers go on in the same process with the same model
        self._hooks: list[Any] = []
        self.head_path: str | None = None
        self._threshold_set = False
        self._set_aside = contextlib.ExitStack()
        try:
            self._attach(model, adapter, device)
        except BaseException:
            self._detach()
            raise

    def _attach(self, model: Any, adapter: FamilyAdapter, device: str) -> None:
        """Resolve every unit's checkpoint keys, then put the stream in place: glibc's
        threshold, the hooks, the head's sliced forward, the buffers on the device and
        the heap set aside (undone by :meth:`_detach`)."""
        model_dir = self.model_dir
        keys = self.ckpt.keys
        self._keys = set(keys)
        self.ckpt_prefix = find_prefix(keys, adapter, model_dir)
        self.base = _base_prefix(model)
        #: parameter name -> names of every parameter tied to it (the same object)
        by_id: dict[int, list[str]] = {}
        for name, p in model.named_parameters(remove_duplicate=False):
            by_id.setdefault(id(p), []).append(name)
        self._tied = {n: names for names in by_id.values() for n in names}
        self.units = model_units(model, adapter)
        #: the next unit's bytes are read into the page cache while one computes
        self.read_ahead = checkpoint.ReadAhead()
        #: parameter name -> checkpoint key, every one resolved before any long work;
        #: a module outside the layers that the checkpoint lacks entirely (the pooler of
        #: a base model saved from a masked LM) is initialised as ``from_pretrained``
        #: does, since nothing the study reads passes through it
        self.initialised = [
            path
            for path, names in self.units.items()
            if not self._is_layer(path) and not any(self._has(n) for n in names)
        ]
        self.keys = {
            n: self._key(n)
            for path, names in self.units.items()
            if path not in self.initialised
            for n in names
        }
        # while a model streams, glibc maps its blocks of 1 MiB or more apart from the
        # heap (runtime.set_mmap_threshold): under glibc's own raised threshold the units'
        # float32 copies and activations fragmented the heap, and a streamed causal LM's
        # peak grew by about two token states per layer (measured at d 2048, 6 W_O
        # variants: 2.22 GiB at 2 layers, 2.93 at 16; with the threshold 1.21 and 1.23)
        self._threshold_set = True
        set_mmap_threshold(STREAM_MMAP_THRESHOLD)
        self.resident: str | None = None
        #: the forwards running in lockstep, while :func:`forwards_in_lockstep` runs
        self.lockstep: _Lockstep | None = None
        self.loads = 0
        self.bytes_read = 0
        #: every parameter's full shape (a unit read in part is put back to it)
        self.shapes = {n: tuple(p.shape) for n, p in model.named_parameters(remove_duplicate=False)}
        # the vocabulary's units (module doc): the input embedding reads the rows of the
        # ids it is given, the output head stays in its stored dtype, applied in slices
        self.embedding_path = self._unit_of(_input_embeddings(model), "Embedding")
        self.head_path = self._unit_of(_output_embeddings(model), "Linear")
        #: unit -> the next unit in module order whose tensors are read whole (not the
        #: input embedding, whose rows are read by id, nor an initialised module)
        self._next_read: dict[str, str | None] = {}
        following = None
        for p in reversed(list(self.units)):
            self._next_read[p] = following
            if p != self.embedding_path and p not in self.initialised:
                following = p
        # the embedding's padding index, renumbered with the ids while its rows are in
        self.padding_idx = (
            model.get_submodule(self.embedding_path).padding_idx if self.embedding_path else None
        )
        for path in self.units:
            if path != self.embedding_path:
                self._hooks.append(
                    model.get_submodule(path).register_forward_pre_hook(
                        lambda m, a, path=path: self._enter(path, m)
                    )
                )
        if self.embedding_path is not None:
            self._hooks.append(
                model.get_submodule(self.embedding_path).register_forward_pre_hook(
                    self._enter_embedding, with_kwargs=True
                )
            )
        if self.head_path is not None:
            head = model.get_submodule(self.head_path)
            head.forward = self.unit_forward(self.head_path, head)
        self._hooks.append(model.register_forward_hook(lambda *a: self._end()))
        for module in model.modules():  # buffers (rotary tables, ids) on the device
            for name, buf in module._buffers.items():
                if buf is not None:
                    module._buffers[name] = buf.to(device)
        # every unit is freed with a full collection (release): the model's objects,
        # made, are set aside from then on, until close. Last, so that a stream that
        # fails to be made leaves nothing set aside
        self._set_aside.enter_context(heap_set_aside())

    # ------------------------------------------------------------------ the units
    def _relative(self, name: str) -> str | None:
        """The base-model-relative name, None for a head parameter outside the base."""
        if not self.base:
            return name
        prefix = f"{self.base}."
        return name[len(prefix) :] if name.startswith(prefix) else None

    def _candidates(self, name: str) -> Iterator[str]:
        rel = self._relative(name)
        stems = [self.ckpt_prefix + rel] if rel is not None else [name]
        if rel is not None and self.ckpt_prefix:
            stems.append(rel)
        for stem in stems:
            yield stem
            for new, old in ((".weight", ".gamma"), (".bias", ".beta")):
                if stem.endswith(new):
                    yield stem[: -len(new)] + old

    def _is_layer(self, path: str) -> bool:
        return path.rpartition(".")[2].isdigit()

    def _unit_of(self, module: Any, kind: str) -> str | None:
        """The path of ``module`` when it is a unit of its own, read from the
        checkpoint, and a plain ``torch.nn`` ``kind`` (Embedding, Linear; subclasses that
        keep its forward); None otherwise (held whole, as any unit: a head that a base
        model's checkpoint lacks is initialised whole in the compute dtype)."""
        import torch

        cls = getattr(torch.nn, kind)
        if module is None or not isinstance(module, cls):
            return None
        if kind == "Linear" and type(module).forward is not cls.forward:
            return None
        return next(
            (p for p in self.units if not self._is_layer(p) and p not in self.initialised
             and self.model.get_submodule(p) is module),
            None,
        )  # fmt: skip

    def unit_forward(self, path: str, module: Any) -> Callable[..., Any]:
        """The forward unit ``path`` computes with: the class's own, or for the output
        head its application in slices of the vocabulary (:data:`HEAD_SLICE_BYTES`)."""
        if path != self.head_path:
            return type(module).forward.__get__(module)
        import torch.nn.functional as F

        def forward(x: Any) -> Any:
            W, b = module.weight, module.bias
            V, d = W.shape
            step = max(1, HEAD_SLICE_BYTES // (d * x.element_size()))
            if step >= V:
                return F.linear(x, W.to(x.dtype), b)
            out = x.new_empty((*x.shape[:-1], V))
            for a in range(0, V, step):
                out[..., a : a + step] = F.linear(
                    x, W[a : a + step].to(x.dtype), None if b is None else b[a : a + step]
                )
            return out

        return forward

    def _enter_embedding(self, module: Any, args: tuple, kwargs: dict) -> Any:
        """The input embedding's pre-hook: the unit entered as any, then only the rows of
        the ids in its input read (cast to the compute dtype) and the ids renumbered
        into them; the row values and the lookup are those of the whole table."""
        import torch

        path = self.embedding_path
        self._enter(path, module)
        step = self.lockstep
        if step is not None and step.replays():
            return None
        ids = args[0] if args else next(iter(kwargs.values()))
        ids_cpu = ids.detach().to("cpu", torch.long)
        rows, inverse = torch.unique(ids_cpu, return_inverse=True)
        name = f"{path}.weight"
        key = self.keys[name]
        vocab = self.shapes[name][0]
        if rows.numel() and not (0 <= int(rows[0]) and int(rows[-1]) < vocab):
            raise IndexError(f"token ids outside the vocabulary of {vocab} rows")
        parts, first = [], 0
        values = rows.tolist()
        for i in range(1, len(values) + 1):  # consecutive ids in one read
            if i == len(values) or values[i] != values[i - 1] + 1:
                parts.append(self.ckpt.rows(key, values[first], values[i - 1] + 1))
                first = i
        table = torch.cat(parts) if parts else self.ckpt.rows(key, 0, 0)
        self.bytes_read += table.numel() * table.element_size()
        module._parameters["weight"] = torch.nn.Parameter(
            table.to(device=self.device, dtype=self.dtype), requires_grad=False
        )
        pad = self.padding_idx
        hit = (rows == pad).nonzero() if pad is not None else ()
        module.padding_idx = int(hit[0, 0]) if len(hit) else None
        new_ids = inverse.reshape(ids.shape).to(ids.device)
        if args:
            return (new_ids, *args[1:]), kwargs
        first_key = next(iter(kwargs))
        return args, {**kwargs, first_key: new_ids}

    def _has(self, name: str) -> bool:
        tied = self._tied.get(name, [name])
        return any(k in self._keys for t in tied for k in self._candidates(t))

    def _key(self, name: str) -> str:
        for tied in [name, *(n for n in self._tied.get(name, []) if n != name)]:
            for key in self._candidates(tied):
                if key in self._keys:
                    return key
        raise InputFileError(
            f"{self.model_dir}: the checkpoint has no tensor for parameter {name!r} of the "
            f"{self.adapter.model_type} model (looked for {next(self._candidates(name))!r}); "
            "fix: a complete checkpoint of the model"
        )

    @property
    def head_stored(self) -> bool:
        """Whether the model's output head is read from the checkpoint (stored, or tied
        to a stored input embedding). False for a causal LM over a base model's
        checkpoint: its head is drawn at random when it is materialised."""
        head = _output_embeddings(self.model)
        if head is None:
            return False
        path = next(p for p, m in self.model.named_modules() if m is head)
        return all(self._has(f"{path}.{n}") for n, _ in head.named_parameters())

    def unit_bytes(self, compute_bytes: int) -> dict[str, int]:
        """Unit path -> its resident bytes once materialised: its parameters in the
        compute dtype, except the vocabulary's (module doc): the input embedding's
        table not at all (the rows of the ids at hand are read), the head's as stored
        with one slice cast."""
        out = {}
        for path, names in self.units.items():
            total = 0
            for n in names:
                size = math.prod(self.shapes[n])
                if path == self.embedding_path and n == f"{path}.weight":
                    continue
                if path == self.head_path and n == f"{path}.weight":
                    entry = self.ckpt.entry(self.keys[n])
                    stored = checkpoint.DTYPE_BYTES[entry["dtype"]] if entry else compute_bytes
                    total += size * stored + min(HEAD_SLICE_BYTES, size * compute_bytes)
                    continue
                total += size * compute_bytes
            out[path] = total
        return out

    # ------------------------------------------------------------------ the hooks
    def _enter(self, path: str, module: Any) -> None:
        step = self.lockstep
        if step is not None and step.joins(path):
            step.advance(path)  # every forward reaches the unit, which is read once
            return
        if step is not None and step.replays():
            return  # a unit this forward replays: its output is recorded, not computed
        if self.resident == path:
            return  # ALBERT calls its one layer group for every layer
        self.release()
        self._materialise(path)
        self.resident = path

    def _materialise(self, path: str) -> None:
        self._load(path)
        self._read_ahead_after(path)

    def _read_ahead_after(self, path: str) -> None:
        """Have the unit after ``path`` read into the page cache while ``path``
        computes (its tensors read by plain reads: safetensors, float)."""
        nxt = self._next_read.get(path)
        if nxt is None:
            return
        ranges = []
        for name in self.units[nxt]:
            key = self.keys[name]
            entry = self.ckpt.entry(key)
            if entry is not None:
                start, stop = entry["data_offsets"]
                ranges.append((self.ckpt.file_of(key), start, stop - start))
        self.read_ahead.want(ranges)

    def _load(self, path: str) -> None:
        import torch

        if path in self.initialised:
            module = self.model.get_submodule(path)
            module.to_empty(device=self.device)
            module.apply(self.model._init_weights)
            self.loads += 1
            return
        if path == self.embedding_path:
            self.loads += 1  # its rows are read by its hook, which knows the ids
            return
        for name in self.units[path]:
            owner_path, _, leaf = name.rpartition(".")
            owner = self.model.get_submodule(owner_path)
            want = self.shapes[name]
            key = self.keys[name]
            t = self.ckpt.tensor(key)
            self.bytes_read += t.numel() * t.element_size()
            if tuple(t.shape) != want:
                raise InputFileError(
                    f"{self.ckpt.file_of(key)}: tensor {key!r} has shape {tuple(t.shape)}, "
                    f"the model's {name} {want}"
                )
            # the head's weight stays as stored; its forward casts a slice at a time
            dtype = t.dtype if name == f"{self.head_path}.weight" else self.dtype
            owner._parameters[leaf] = torch.nn.Parameter(
                t.to(device=self.device, dtype=dtype), requires_grad=False
            )
        self.loads += 1

    def release(self) -> None:
        """Free the resident unit (its parameters back to meta)."""
        import torch

        if self.resident is None:
            return
        for name in self.units[self.resident]:
            owner_path, _, leaf = name.rpartition(".")
            owner = self.model.get_submodule(owner_path)
            owner._parameters[leaf] = torch.nn.Parameter(
                torch.empty(self.shapes[name], dtype=self.dtype, device="meta"),
                requires_grad=False,
            )
        if self.resident == self.embedding_path:
            self.model.get_submodule(self.resident).padding_idx = self.padding_idx
        self.resident = None
        gc.collect()

    def _end(self) -> None:
        """A forward of the whole model ended: its last unit is freed (in lockstep once
        every forward has ended)."""
        step = self.lockstep
        if step is not None and step.stepping():
            step.advance(None)
        else:
            self.release()

    def parameter_path(self, path: str) -> str:
        """The full parameter name of a module path's weight (``{path}.weight``)."""
        return f"{path}.weight"

    def embedding_row(self, token_id: int) -> Any:
        """The stored input embedding of ``token_id`` (one row read from the checkpoint)."""
        emb = self.model.get_input_embeddings()
        name = next(n for n, m in self.model.named_modules() if m is emb) + ".weight"
        return self.ckpt.row(self.keys[name], token_id)

    def close(self) -> None:
        self.release()
        self._detach()

    def _detach(self) -> None:
        """Undo what the stream changed: its hooks, the head's sliced forward, the open
        checkpoint, the heap set aside, glibc's threshold (each only where it was made)."""
        ahead = getattr(self, "read_ahead", None)
        if ahead is not None:
            ahead.close()
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        if self.head_path is not None:
            self.model.get_submodule(self.head_path).__dict__.pop("forward", None)
        self.ckpt.close()
        self._set_aside.close()
        if self._threshold_set:
            # the float64 work that follows reuses its heap blocks again: glibc's
            # threshold as it stands after a model's large frees (mapping every
            # temporary anew page-faults each of its pages in)
            set_mmap_threshold(HEAP_CEILING)
            self._threshold_set = False


def memory_limit_bytes() -> int | None:
    """The memory this process may use: the cgroup's limit, else the machine's memory,
    else the ``SPECALIGN_MEM_LIMIT_MB`` environment variable when set (the smallest)."""
    limits = []
    env = os.environ.get("SPECALIGN_MEM_LIMIT_MB")
    if env:
        limits.append(int(float(env) * 1e6))
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        with contextlib.suppress(OSError, ValueError):
            value = Path(path).read_text().strip()
            if value != "max" and int(value) < 2**60:
                limits.append(int(value))
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                limits.append(int(line.split()[1]) * 1024)
    return min(limits) if limits else None


def check_units_fit(stream: LayerStream, compute_bytes: int, limit: int | None, where: str) -> None:
    """Refuse a model one of whose units (a decoder layer, the embeddings, the LM head)
    would not fit ``limit`` even alone, naming the unit's size and the limit."""
    if limit is None:
        return
    sizes = stream.unit_bytes(compute_bytes)
    path = max(sizes, key=sizes.__getitem__)
    if sizes[path] > limit:
        raise LayerTooLargeError(
            f"{where}: its largest unit {path!r} needs {sizes[path] / 2**30:.1f} GiB in "
            f"{compute_bytes * 8}-bit floats streamed one at a time, over the memory limit "
            f"of {limit / 2**30:.1f} GiB; fix: a machine or job with more memory"
        )


def streamed_model(
    model_dir: str | os.PathLike[str],
    kind: str = "base",
    device: str = "cpu",
    dtype: Any = None,
    mem_limit: int | None = None,
) -> Any:
    """The family's ``transformers`` model of a local folder, streamed (module doc):
    ``kind`` "base" (``AutoModel``) or "causal_lm" (``AutoModelForCausalLM``), eager
    attention, eval mode, computing in ``dtype`` (:data:`COMPUTE_DTYPE` by default) on ``device``.

    Every parameter's checkpoint tensor is located before it returns (a missing one is
    an InputFileError naming it), and a model with a unit larger than ``mem_limit``
    (default :func:`memory_limit_bytes`) is refused before any weight is read. The
    stream is ``model.specalign_stream``; ``close_stream(model)`` removes the hooks.
    """
    import torch
    from transformers import AutoConfig

    model_dir = Path(model_dir)
    dtype = dtype or getattr(torch, COMPUTE_DTYPE)
    config = read_config(model_dir)
    adapter = adapter_for(config)
    hf = AutoConfig.from_pretrained(str(model_dir), local_files_only=True, trust_remote_code=False)
    with parameters_on_meta():
        model = _head_class(kind).from_config(hf, attn_implementation="eager", dtype=dtype)
    model.eval()
    stream = LayerStream(model, model_dir, adapter, device, dtype)
    limit = memory_limit_bytes() if mem_limit is None else mem_limit
    try:
        check_units_fit(stream, torch.empty((), dtype=dtype).element_size(), limit, str(model_dir))
    except BaseException:
        # a refused model gives back what its stream holds (the heap set aside, the
        # hooks, the open checkpoint): the process may go on, as the API's callers do
        stream.close()
        raise
    model.specalign_stream = stream
    return model


def check_against_model(model_dir: str | os.PathLike[str]) -> int | None:
    """A checkpoint checked against its model when it arrives (extract_weights, the
    first job that reads it): every parameter of the family's model, built on the meta
    device from config.json, has its tensor in the checkpoint (:class:`LayerStream`
    resolves each key) with that parameter's shape (from the safetensors headers; no
    weight is read). InputFileError naming the file, the tensor and both shapes: a
    checkpoint that does not fit its configuration would otherwise fail, or be misread,
    in a later job. Returns the input embedding's rows (None without one), which the
    tokenizer's ids must fit (:func:`specalign.transformers.load.hf.check_checkpoint_fits`)."""
    model_dir = Path(model_dir)
    model = streamed_model(model_dir, "base", mem_limit=1 << 62)  # no memory refusal here
    stream = model.specalign_stream
    try:
        for name, key in stream.keys.items():
            header = stream.ckpt.header(key)
            if header is None:
                continue  # a pickled checkpoint's shapes are read with its tensors
            stored = tuple(header["shape"])
            if stored != stream.shapes[name]:
                raise InputFileError(
                    f"{stream.ckpt.file_of(key)}: tensor {key!r} has shape {stored}, but "
                    f"the model that config.json describes has {stream.shapes[name]} for "
                    f"{name}; fix: the checkpoint and config.json of one model"
                )
        embedding = f"{stream.embedding_path}.weight" if stream.embedding_path else None
        return stream.shapes[embedding][0] if embedding in stream.shapes else None
    finally:
        close_stream(model)


def output_head_stored(model_dir: str | os.PathLike[str]) -> bool:
    """Whether the checkpoint in ``model_dir`` holds its causal LM's output head
    (:attr:`LayerStream.head_stored`), from the model's skeleton and the checkpoint's
    tensor names; no weight is read. A base model's weights (a Pythia-style repository
    of ``GPTNeoXModel``) hold none: next-token probabilities through the head that
    ``from_pretrained`` would draw at random, unseeded, are no model's."""
    model = streamed_model(model_dir, "causal_lm")
    try:
        return model.specalign_stream.head_stored
    finally:
        close_stream(model)


def stream_of(model: Any) -> LayerStream | None:
    """The stream of a model from :func:`streamed_model`, None for a loaded model."""
    return getattr(model, "specalign_stream", None)


def model_device(model: Any) -> Any:
    """Where a model computes: the stream's device, else its first parameter's."""
    stream = stream_of(model)
    if stream is not None:
        import torch

        return torch.device(stream.device)
    return next(model.parameters()).device


def close_stream(model: Any) -> None:
    stream = stream_of(model)
    if stream is not None:
        stream.close()


class _StopForward(Exception):
    """Raised by the first layer's hook once its input is recorded."""


def first_layer_input(model: Any, input_ids: Any) -> Any:
    """The input of the first decoder layer (the embedding output, after ALBERT's
    projection, Gemma's scale, OPT-350m's ``project_in``) for ``input_ids``, from a
    forward stopped there: one unit (the embeddings) is read, not the model."""
    import torch

    stream = stream_of(model)
    adapter = stream.adapter if stream else _adapter_of(model)
    first = model.get_submodule(layers_path(model, adapter))[0]
    seen: list[Any] = []

    def hook(_m: Any, args: tuple, kwargs: Mapping[str, Any]) -> None:
        x = args[0] if args else kwargs.get("hidden_states")
        seen.append(x.detach())
        raise _StopForward

    handle = first.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad(), contextlib.suppress(_StopForward):
            model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids))
    finally:
        handle.remove()
        if stream is not None:
            stream.release()
    if not seen:
        raise RuntimeError(f"{type(model).__name__} never called its first layer")
    return seen[0]


def _adapter_of(model: Any) -> FamilyAdapter:
    return adapter_for(model.config.to_dict())


def accepts_logits_to_keep(model: Any) -> bool:
    """Whether the causal LM's forward can compute the logits of the last position only."""
    return "logits_to_keep" in inspect.signature(model.forward).parameters


# --------------------------------------------------------------------------- lockstep


class _Lockstep:
    """Forwards of one streamed model, each in a thread, advanced through the units
    together from the unit ``start`` on (see :func:`forwards_in_lockstep`).

    Forward 0 runs alone up to ``start``, recording the outputs of the units it passes
    (of the decoder layers only the last: the earlier ones feed layers that are replayed
    too and ignore their input); the others then replay those outputs. From ``start`` on
    every forward waits for the others at each unit (a barrier whose action frees the
    resident unit and reads the next), and the threads take turns (one lock), so that
    the forwards compute one at a time, each exactly as it would alone.
    """

    def __init__(self, stream: LayerStream, start: str, n: int) -> None:
        self.stream, self.start = stream, start
        self.local = threading.local()
        self.turn = threading.Lock()
        self.barrier = threading.Barrier(n, action=self._step)
        self.recorded = threading.Event()
        self.arrivals: dict[int, str | None] = {}
        self.outputs: dict[str, list[Any]] = {}
        self.layer_output: Any = None

    # ---------------------------------------------------------------- per thread
    def run(self) -> int | None:
        """The index of the forward the calling thread runs (None: not one of them)."""
        return getattr(self.local, "run", None)

    def stepping(self) -> bool:
        return bool(getattr(self.local, "stepping", False))

    def replays(self) -> bool:
        """Whether the calling thread replays the units it enters (a forward other than
        the first, before ``start``)."""
        return bool(self.run()) and not self.stepping()

    def joins(self, path: str) -> bool:
        """Whether the calling thread advances with the others at unit ``path``."""
        if self.run() is None:
            return False
        if path == self.start:
            self.local.stepping = True
        return self.stepping()

    def advance(self, path: str | None) -> None:
        """Wait until every forward has reached unit ``path`` (None: the end), then go on
        with it resident; the turn passes to the others meanwhile."""
        if self.run() == 0 and path == self.start:
            self.recorded.set()  # the units before start have run: the others may replay
        self.arrivals[threading.get_ident()] = path
        self.turn.release()
        try:
            self.barrier.wait()
        finally:
            self.turn.acquire()

    def _step(self) -> None:
        """The barrier's action (one thread, the others waiting): the next unit in."""
        paths = set(self.arrivals.values())
        self.arrivals.clear()
        if len(paths) != 1:
            raise RuntimeError(f"forwards in lockstep reached different units: {paths}")
        (path,) = paths
        if path is not None and path == self.stream.resident:
            return  # a unit called again (ALBERT's layer group): still resident
        self.stream.release()
        if path is not None:
            self.stream._materialise(path)
            self.stream.resident = path

    # ---------------------------------------------------------------- the units' forwards
    def forward(self, path: str, module: Any) -> Callable[..., Any]:
        """Unit ``path``'s forward in lockstep: computed (and recorded by forward 0 before
        ``start``), or replayed by the other forwards before ``start``."""
        compute = self.stream.unit_forward(path, module)
        is_layer = self.stream._is_layer(path)

        def forward(*args: Any, **kwargs: Any) -> Any:
            if self.replays():
                if is_layer:
                    return clone_output(self.layer_output)
                calls = self.local.calls
                calls[path] += 1
                return clone_output(self.outputs[path][calls[path] - 1])
            out = compute(*args, **kwargs)
            if self.run() == 0 and not self.stepping():
                if is_layer:
                    self.layer_output = clone_output(out)
                else:
                    self.outputs.setdefault(path, []).append(clone_output(out))
            return out

        return forward

    def thread(self, k: int, call: Callable[[], Any], results: list[Any], errors: list) -> None:
        self.local.run, self.local.stepping, self.local.calls = k, False, Counter()
        try:
            if k:
                self.recorded.wait()
            with self.turn:
                results[k] = call()
            if k == 0 and not self.recorded.is_set():
                raise RuntimeError(f"the forward never reached unit {self.start!r}")
        except BaseException as exc:  # every thread must learn that the others stop
            errors.append(exc)
            self.barrier.abort()
            self.recorded.set()


def clone_output(out: Any) -> Any:
    """A copy of a module's output (tensors, and tuples of them), so that no forward sees
    another's in-place changes."""
    import torch

    if isinstance(out, torch.Tensor):
        return out.detach().clone()
    if isinstance(out, tuple):
        return type(out)(clone_output(o) for o in out)
    return out


def current_run(model: Any) -> int | None:
    """The index, in :func:`forwards_in_lockstep`'s ``calls``, of the forward the calling
    thread runs (None outside lockstep)."""
    stream = stream_of(model)
    step = stream.lockstep if stream is not None else None
    return step.run() if step is not None else None


def forwards_in_lockstep(model: Any, start: Any, calls: Sequence[Callable[[], Any]]) -> list[Any]:
    """Run ``calls`` (each a whole forward of the streamed ``model``, returning what it
    wants kept) so that every unit is read from the checkpoint once for all of them.

    The forwards must compute the same up to module ``start`` (a unit, such as the
    decoder layer whose weights one forward changes) and enter the same units, in the
    same order, from there on. ``calls[0]`` runs alone up to ``start``; the others
    replay the outputs it recorded there (each unit's, in call order), and from
    ``start`` on all advance together, a unit at a time, taking turns (:class:`_Lockstep`):
    one unit's weights resident at any moment, plus the forwards' own states. A forward
    tells which one it is by :func:`current_run` (to put in its own weights, say).
    Returns the calls' results in order; each equals that of the call run alone.
    """
    stream = stream_of(model)
    if stream is None:
        raise ValueError("forwards in lockstep need a streamed model (streamed_model)")
    path = next((p for p in stream.units if model.get_submodule(p) is start), None)
    if path is None:
        raise ValueError(f"{type(start).__name__} is not a unit of the streamed model")
    step = _Lockstep(stream, path, len(calls))
    modules = {p: model.get_submodule(p) for p in stream.units}
    own = {p: m.__dict__["forward"] for p, m in modules.items() if "forward" in m.__dict__}
    for p, module in modules.items():
        module.forward = step.forward(p, module)
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []
    threads = [
        threading.Thread(target=step.thread, args=(k, call, results, errors), daemon=True)
        for k, call in enumerate(calls)
    ]
    stream.lockstep = step
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        stream.lockstep = None
        for p, module in modules.items():
            module.__dict__.pop("forward", None)
            if p in own:  # the stream's own forward (the sliced head)
                module.forward = own[p]
        stream.release()
    if errors:
        first = next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), None)
        raise first or errors[0]
    return results
