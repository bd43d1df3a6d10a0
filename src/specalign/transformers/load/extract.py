"""Lazy extraction of attention weights from a checkpoint folder, and ``weights.h5``.

``extract`` never instantiates the model: it parses config.json, picks the family
adapter (``families``) and reads the few attention tensors it needs one at a time
through memory-mapped safetensors (``safe_open``), so peak memory beyond the result is
about one tensor. Sharded checkpoints (``model.safetensors.index.json``) are read
shard by shard as names require. Only when a folder holds no safetensors at all does it
fall back to ``pytorch_model.bin`` (or its sharded index), loaded with
``torch.load(mmap=True, weights_only=True)`` so the pickle is neither executed nor read
into memory.

The ``weights.h5`` file it streams into is described in
:mod:`specalign.transformers.load.contracts`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from specalign.io import InputFileError, atomic_path, checksum_options
from specalign.runtime import release_freed_memory
from specalign.transformers.load import checkpoint
from specalign.transformers.load.contracts import (
    BIAS_KEYS,
    write_block,
    write_weights_attrs,
)
from specalign.transformers.load.families import FamilyAdapter, adapter_for
from specalign.transformers.weights import BlockWeights, ModelWeights

_SNAPSHOT_RE = re.compile(r"^[0-9a-f]{40}$")


# ----------------------------------------------------------------------------- reading


class CheckpointReader:
    """Lazy, one-tensor-at-a-time access to the tensors of a checkpoint folder.

    Use as a context manager; ``keys`` lists every tensor name, ``read(key)`` returns
    one tensor as float64 numpy (bf16/fp16 included), and refuses one holding NaN or inf
    (InputFileError naming the file and the tensor). Float safetensors are read without
    torch (:func:`~specalign.transformers.load.checkpoint.read_float64`); float8 codes
    and ``.bin`` checkpoints through torch.
    """

    def __init__(self, model_dir: str | Path) -> None:
        self.model_dir = Path(model_dir)
        self._where: dict[str, Path] = {}  # tensor name -> file holding it
        self._open: dict[Path, Any] = {}  # file -> open safe_open handle / mmap'd state dict
        self._dtypes: dict[str, str] = {}  # safetensors dtype of every tensor
        self._headers: dict[Path, dict[str, dict[str, Any]]] = {}  # file -> its entries
        self._quant: dict[str, Any] | None = None  # the block-wise FP8 scheme, if any
        self.format = self._index()

    def __enter__(self) -> CheckpointReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._open.clear()
        self._headers.clear()

    @property
    def keys(self) -> list[str]:
        return list(self._where)

    def _index(self) -> str:
        """Map every tensor name to its file; return "safetensors" or "bin"."""
        d = self.model_dir
        if not d.is_dir():
            raise InputFileError(f"{d}: model folder does not exist")
        st_index = d / "model.safetensors.index.json"
        if st_index.exists():
            self._where = self._read_index(st_index)
            self._check()
            return "safetensors"
        # one checkpoint: never Mistral's consolidated.safetensors beside the shards
        files = checkpoint.safetensors_files(d)
        if files:
            for file in files:
                for key in self._safetensors_keys(file):
                    if key in self._where:
                        raise InputFileError(
                            f"{d}: tensor {key!r} in both {self._where[key].name} and {file.name}"
                        )
                    self._where[key] = file
            self._check()
            return "safetensors"
        bin_index = d / "pytorch_model.bin.index.json"
        if bin_index.exists():
            self._where = self._read_index(bin_index)
            return "bin"
        if (d / "pytorch_model.bin").exists():
            file = d / "pytorch_model.bin"
            self._where = dict.fromkeys(self._handle(file), file)
            return "bin"
        raise InputFileError(
            f"{d}: no weights found (looked for model.safetensors, *.safetensors, "
            "model.safetensors.index.json, pytorch_model.bin[.index.json])"
        )

    def _read_index(self, index: Path) -> dict[str, Path]:
        return checkpoint.read_index(index)

    def _check(self) -> None:
        """Refuse, before any tensor is read, integer or unscaled float8 weights, an
        unsupported quantization scheme, and a layer lacking a tensor the others have
        (:func:`specalign.transformers.load.checkpoint.check_checkpoint`)."""
        config_path = self.model_dir / "config.json"
        try:
            config = json.loads(config_path.read_text())
            n_blocks = adapter_for(config).n_blocks
        except Exception:  # no usable config.json: check_checkpoint or the adapter names it
            config, n_blocks = {}, None
        self._dtypes = checkpoint.check_checkpoint(self.model_dir, n_blocks)
        self._quant = checkpoint.quantization(config, config_path)

    def _handle(self, file: Path) -> Any:
        """An mmap'd .bin state dict, opened once (the fallback format)."""
        if file not in self._open:
            try:
                self._open[file] = _load_bin(file)
            except InputFileError:
                raise
            except Exception as exc:  # torch raises assorted types on corrupt files
                raise InputFileError(f"{file}: cannot open checkpoint ({exc})") from exc
        return self._open[file]

    def _safetensors_keys(self, file: Path) -> list[str]:
        # the header alone, parsed with bounds (a damaged one is named, never a crash)
        return list(checkpoint.read_header(file))

    def _dequantize(self, key: str, codes: np.ndarray) -> np.ndarray:
        """Float8 codes times their block scales (``<key>_scale_inv``), the block-wise FP8
        scheme of :mod:`specalign.transformers.load.checkpoint` (checked by ``_check``)."""
        assert self._quant is not None  # _check refused float8 without the scheme
        scale = self.read(f"{key}_scale_inv")
        try:
            return checkpoint.dequantize_fp8_blocks(codes, scale, self._quant["weight_block_size"])
        except ValueError as exc:
            raise InputFileError(f"{self._where[key]}: tensor {key!r}: {exc}") from exc

    def read(self, key: str) -> np.ndarray:
        """One tensor as a float64 array (a copy: nothing stays mapped afterwards).

        A float safetensors tensor is read by plain reads of its bytes; a float8 one
        through a file handle opened for the tensor and closed right after: the pages of
        a memory-mapped file that a read touched count towards the process's resident
        memory until the mapping goes, so keeping one handle open for the whole
        checkpoint would make the peak grow to the size of every tensor read.
        """
        if key not in self._where:
            raise KeyError(key)
        file = self._where[key]
        try:
            if file.suffix == ".safetensors" and self._dtypes.get(key) in checkpoint.FLOAT_DTYPES:
                if file not in self._headers:
                    self._headers[file] = checkpoint.read_header(file)
                arr = checkpoint.read_float64(file, self._headers[file][key])
            elif file.suffix == ".safetensors":  # float8 codes, decoded by torch
                import torch
                from safetensors import safe_open

                with safe_open(file, framework="pt") as handle:
                    tensor = handle.get_tensor(key)
                    arr = tensor.detach().to(torch.float64, copy=True).numpy()
                if self._dtypes.get(key) in checkpoint.FP8_DTYPES:
                    arr = self._dequantize(key, arr)
            else:
                import torch

                arr = self._handle(file)[key].detach().to(torch.float64, copy=True).numpy()
        except InputFileError:
            raise
        except Exception as exc:
            raise InputFileError(f"{file}: cannot read tensor {key!r} ({exc})") from exc
        # A NaN or inf weight makes every F, eigenvalue and token state after it NaN, and
        # the first step to notice would fail far from the cause.
        finite = np.isfinite(arr)
        if not finite.all():
            raise InputFileError(
                f"{file}: tensor {key!r} holds {arr.size - int(finite.sum())} non-finite "
                f"value(s) (NaN or inf) of {arr.size}; fix: use an intact checkpoint of the model"
            )
        return arr


def _load_bin(file: Path) -> dict[str, Any]:
    import torch

    try:
        return torch.load(file, map_location="cpu", mmap=True, weights_only=True)
    except RuntimeError:
        # Pre-1.6 (non-zip) pickles cannot be memory-mapped; they are small old models.
        return torch.load(file, map_location="cpu", weights_only=True)


class _PrefixedReader:
    """``TensorReader`` over a checkpoint: adds the checkpoint's name prefix and maps
    the TF-port LayerNorm names ``gamma``/``beta`` to ``weight``/``bias``."""

    _ALIASES = ((".weight", ".gamma"), (".bias", ".beta"))

    def __init__(self, ckpt: CheckpointReader, prefix: str) -> None:
        self.ckpt = ckpt
        self.prefix = prefix
        self._keys = set(ckpt.keys)

    def _resolve(self, name: str) -> str | None:
        full = self.prefix + name
        if full in self._keys:
            return full
        for new, old in self._ALIASES:
            if full.endswith(new) and full[: -len(new)] + old in self._keys:
                return full[: -len(new)] + old
        return None

    def has(self, name: str) -> bool:
        return self._resolve(name) is not None

    def get(self, name: str) -> np.ndarray:
        key = self._resolve(name)
        if key is None:
            raise InputFileError(
                f"{self.ckpt.model_dir}: tensor {self.prefix + name!r} not in checkpoint"
            )
        return self.ckpt.read(key)


def find_prefix(keys: list[str], adapter: FamilyAdapter, where: Path | str = "") -> str:
    """The name prefix a checkpoint puts before the family's relative names.

    Located by the family's probe tensor, so any prefix works; when several match
    (a model wrapping another), the family's known prefixes win, then the shortest.
    """
    probe = adapter.probe
    found = sorted(
        {
            k[: -len(probe)]
            for k in keys
            if k.endswith(probe) and (len(k) == len(probe) or k[-len(probe) - 1] == ".")
        },
        key=len,
    )
    if not found:
        raise InputFileError(
            f"{where}: no tensor named like {probe!r}: not a {adapter.model_type} checkpoint "
            f"(expected prefixes: {', '.join(repr(p) for p in adapter.prefixes)})"
        )
    for known in adapter.prefixes:
        if known in found:
            return known
    return found[0]


def read_config(model_dir: str | Path) -> dict[str, Any]:
    """Parse ``config.json`` of a model folder (InputFileError naming it otherwise)."""
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise InputFileError(f"{path}: file does not exist (not a model folder?)") from exc
    except (OSError, ValueError) as exc:
        raise InputFileError(f"{path}: not readable JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise InputFileError(f"{path}: expected a JSON object")
    return config


def _snapshot_revision(model_dir: Path) -> str:
    """The commit hash when ``model_dir`` is a Hugging Face cache snapshot, else ""."""
    resolved = model_dir.resolve()
    if resolved.parent.name == "snapshots" and _SNAPSHOT_RE.match(resolved.name):
        return resolved.name
    return ""


def _adapter(model_dir: Path) -> tuple[dict[str, Any], FamilyAdapter]:
    config = read_config(model_dir)
    try:
        return config, adapter_for(config)
    except ValueError as exc:
        if type(exc) is not ValueError:  # UnknownFamilyError: not a file problem
            raise type(exc)(f"{model_dir}: {exc}") from exc
        raise InputFileError(f"{model_dir / 'config.json'}: {exc}") from exc


def _model_weights(
    model_dir: Path,
    config: Mapping[str, Any],
    adapter: FamilyAdapter,
    blocks: list[BlockWeights],
    extras: Mapping[str, Any],
    source: str | None,
    revision: str | None,
) -> ModelWeights:
    try:
        rotary = adapter.rotary()
    except ValueError as exc:
        raise InputFileError(f"{model_dir / 'config.json'}: {exc}") from exc
    return ModelWeights(
        family=adapter.model_type,
        d_model=adapter.d_model,
        n_heads=adapter.n_heads,
        n_layers=adapter.n_layers,
        blocks=blocks,
        layer_block=adapter.layer_block(),
        ln_position=adapter.ln_position,
        causal=bool(adapter.causal or config.get("is_decoder", False)),
        attn_scale=adapter.attn_scale,
        layer_attention=adapter.layer_attention(),
        window_size=adapter.window_size,
        ln_eps=adapter.ln_eps,
        source=str(model_dir) if source is None else source,
        revision=_snapshot_revision(model_dir) if revision is None else revision,
        norm=adapter.norm,
        n_kv_heads=adapter.n_kv_heads,
        attn_softcap=adapter.attn_softcap,
        residual=adapter.residual,
        rotary=adapter.rotary_style if rotary is not None else None,
        rotary_inv_freq=None if rotary is None else rotary[0],
        rotary_scaling=None if rotary is None else rotary[1],
        **extras,
    )


@contextmanager
def _shut_down_after(pool: ThreadPoolExecutor | None) -> Iterator[None]:
    try:
        yield
    finally:
        if pool is not None:
            pool.shutdown(wait=True)


def _stream_blocks(
    model_dir: Path,
    adapter: FamilyAdapter,
    on_block: Callable[[int, BlockWeights], None],
    overlap: bool = False,
) -> dict[str, Any]:
    """Read the distinct blocks one at a time, hand each to ``on_block``, return extras.

    ``overlap``: ``on_block`` runs in a second thread, on block b while block b + 1 is
    read, so at most two blocks are held. An extraction spends about as long reading
    and widening the checkpoint's tensors as writing them (HDF5's checksum filter and the
    page cache's copy), and h5py lets go of the GIL while it writes: one after the other
    the job takes the sum of the two, side by side about the larger. The blocks are
    still handed over in order, one at a time, so the file is the same."""
    # the writer is waited for before the checkpoint (and the caller's file) is closed,
    # whatever the way out
    pool = ThreadPoolExecutor(1, thread_name_prefix="extract-writer") if overlap else None
    with CheckpointReader(model_dir) as ckpt, _shut_down_after(pool):
        reader = _PrefixedReader(ckpt, find_prefix(ckpt.keys, adapter, model_dir))
        pending: Future[None] | None = None
        try:
            for b in range(adapter.n_blocks):
                blk = adapter.read_block(b, reader)
                if pending is not None:
                    pending.result()  # the previous block written (its error raised here)
                    release_freed_memory()
                if pool is not None:
                    pending = pool.submit(on_block, b, blk)
                else:
                    on_block(b, blk)
                    release_freed_memory()
                del blk
            if pending is not None:
                pending.result()
                release_freed_memory()
            return adapter.read_extras(reader)
        except ValueError as exc:  # shape or config inconsistencies found by the adapter
            raise InputFileError(f"{model_dir}: {exc}") from exc


def extract(
    model_dir: str | Path, *, source: str | None = None, revision: str | None = None
) -> ModelWeights:
    """Read the attention weights of the checkpoint in ``model_dir`` (lazily).

    ``source``/``revision`` are provenance recorded in the result (default: the folder
    and, for a hub-cache snapshot, its commit hash). Raises ``UnknownFamilyError`` for
    an unsupported ``model_type`` and ``InputFileError`` naming the file for a missing,
    corrupt or config-inconsistent checkpoint. Holds every block in memory; for large
    checkpoints :func:`extract_to_h5` streams them to disk instead.
    """
    model_dir = Path(model_dir)
    config, adapter = _adapter(model_dir)
    blocks: list[BlockWeights] = []
    extras = _stream_blocks(model_dir, adapter, lambda b, blk: blocks.append(blk))
    return _model_weights(model_dir, config, adapter, blocks, extras, source, revision)


def extract_to_h5(
    model_dir: str | Path,
    path: str | Path,
    *,
    source: str | None = None,
    revision: str | None = None,
    made_from: str | None = None,
    threads: int = 1,
) -> ModelWeights:
    """Extract straight into ``weights.h5``, one block at a time (atomic write).
    ``made_from``: the file's record of its model (:mod:`specalign.transformers.lineage`).
    ``threads``: the job's cores; with two or more, block b is written while block b + 1
    is read (the same file, in about the larger of the two times rather than their sum).

    Peak memory is of the order of one layer (its float64 W_Q, W_K, W_V, W_O and F;
    two with ``threads`` > 1), whatever the depth, so that GPT-Neo 2.7B extracts on a
    laptop. With grouped-query attention and r = n_kv_heads * d_head < d no d x d F is
    formed or stored (the factors are; ``contracts`` module doc). Returns the model's metadata as a
    ``ModelWeights`` with an empty ``blocks`` list.
    """
    import h5py

    model_dir = Path(model_dir)
    config, adapter = _adapter(model_dir)
    d = adapter.d_model
    n_heads, kv = adapter.n_heads, int(adapter.n_kv_heads or adapter.n_heads)
    # r < d: no F is stored and K, V are stored at the key/value heads, so they are read
    # so (block_factored of a block read with them expanded)
    factored = kv * adapter.d_head < d
    adapter.kv_expanded = not factored
    has_bias: list[dict[str, bool]] = []
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:

        def on_block(b: int, blk: BlockWeights) -> None:
            if not factored:
                if "F" not in f:
                    shape = (adapter.n_blocks, d, d)
                    f.create_dataset(
                        "F", shape=shape, dtype=np.float64,
                        **checksum_options(shape, np.float64),
                    )  # fmt: skip
                f["F"][b] = blk.F
            try:
                write_block(f, b, blk, n_heads, kv, kv_grouped=factored)
            except ValueError as exc:
                raise InputFileError(f"{model_dir}: block {b}: {exc}") from exc
            has_bias.append({k: bool(blk.has_bias.get(k, True)) for k in BIAS_KEYS})

        extras = _stream_blocks(model_dir, adapter, on_block, overlap=int(threads) > 1)
        mw = _model_weights(model_dir, config, adapter, [], extras, source, revision)
        d_head = f["blocks/0/W_Q"].shape[0] // mw.n_heads
        write_weights_attrs(f, mw, has_bias, d_head)
        if made_from is not None:
            f.attrs["made_from"] = made_from
    return mw
