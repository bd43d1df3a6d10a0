"""What a checkpoint folder holds, read from its safetensors headers alone.

A safetensors file is 8 bytes of little-endian header length N, N bytes of JSON naming
every tensor (``dtype``, ``shape``, ``data_offsets`` into the data that follows), then
the data. Everything here reads only the headers, so it is cheap enough for the
Snakemake process itself (the resource estimate counts parameters from them) and for
the first seconds of a job, before any long work:

* :func:`read_header` parses one header defensively: the length is bounded by
  :data:`MAX_HEADER_BYTES` (the safetensors library's own bound) and by the file's size,
  the JSON must be an object of well-formed entries whose data lie inside the file. A
  truncated file or a 2^40-byte length is one :class:`CheckpointError` naming the file,
  never a ``MemoryError`` or a traceback.
* :func:`safetensors_files` picks *one* checkpoint in a folder: the shards a
  ``model.safetensors.index.json`` names (a missing shard is an error naming it), else
  ``model.safetensors``, else the other ``*.safetensors`` files. Mistral's repositories
  ship the same weights twice, as Hugging Face shards and as ``consolidated.safetensors``
  (Mistral's own format, which transformers does not read): it is never counted.
* :func:`check_checkpoint` refuses what the study cannot compute with, one line naming
  the file and the tensor: a weight or bias tensor that is not floating point (int8,
  int4 packed into integers, uint8 ...), float8 codes without the block scales of the
  one quantization scheme read here, a quantization scheme other than that one
  (``quantization_config.quant_method``), and a layer stack in which one layer lacks a
  tensor that the others have (a damaged or partial conversion).

The quantization scheme read here is the block-wise FP8 of DeepSeek-V3 and Qwen3's
``-FP8`` releases (``quant_method: fp8``, ``weight_block_size: [b_out, b_in]``): every
``<name>.weight`` holds float8 codes q and ``<name>.weight_scale_inv`` one float per
b_out x b_in block, and the weight is W[i, j] = q[i, j] * s[i // b_out, j // b_in]
(:func:`dequantize_fp8_blocks`, the ``weight_dequant`` of DeepSeek-V3's inference code
and of transformers' ``FineGrainedFP8`` integration).

What identifies a model folder's content: :func:`model_files` (config.json, the
tokenizer's data files, :data:`TOKENIZER_PATTERNS`, the one checkpoint's weights and
index) and :func:`model_digest`, one digest over them by name and bytes
(:func:`specalign.contents.file_digest`), recorded in every manifest.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from specalign.contents import digest_of, file_digest
from specalign.io import InputFileError

#: The tokenizer's data files, by name: never a pattern such as ``tokenizer*`` or
#: ``vocab*``, which would also fetch a repository's ``tokenizer.py``/``vocab.py`` (code
#: that an ``auto_map`` asks transformers to run; the workflow never runs it).
TOKENIZER_PATTERNS = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",  # sentencepiece (Llama, Mistral, Gemma)
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "special_tokens_map.json",
    # ALBERT's slow tokenizer is a sentencepiece model; harmless elsewhere.
    "spiece.model",
    "sentencepiece.bpe.model",
    "spm.model",  # DeBERTa-v2/v3's sentencepiece model
    "added_tokens.json",
)


#: The largest header accepted: safetensors itself refuses headers above 100 MB.
MAX_HEADER_BYTES = 100_000_000
#: Bytes per element of the safetensors dtypes (sub-byte types are not checked by size).
DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2,
    "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "I64": 8, "U64": 8, "I32": 4, "U32": 4, "I16": 2, "U16": 2, "I8": 1, "U8": 1, "BOOL": 1,
}  # fmt: skip
#: The dtypes a weight may be stored in and computed with as published, by torch's name.
TORCH_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}
FLOAT_DTYPES = frozenset(TORCH_DTYPES)
FP8_DTYPES = frozenset({"F8_E4M3", "F8_E5M2"})
#: ``quantization_config.quant_method`` values whose weights are dequantized here.
SUPPORTED_QUANTIZATION = ("fp8",)
#: Checkpoints in Mistral's own format, shipped beside the Hugging Face shards.
CONSOLIDATED_RE = re.compile(r"^consolidated(\.\d+)?\.safetensors$")
_LAYER_RE = re.compile(r"^(.*?\.)(\d+)(\..+)$")


class CheckpointError(InputFileError):
    """A checkpoint file is damaged or holds what the study cannot compute with."""


def read_header(path: str | Path) -> dict[str, dict[str, Any]]:
    """The tensor entries of a safetensors file's header (``__metadata__`` left out).

    Bounded and checked (see the module doc); CheckpointError naming the file otherwise.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(
                    f"{path}: not a safetensors file ({size} bytes, shorter than the 8-byte "
                    "header length); fix: download or convert the checkpoint again"
                )
            (length,) = struct.unpack("<Q", head)
            if length > MAX_HEADER_BYTES or length > size - 8:
                raise CheckpointError(
                    f"{path}: damaged safetensors header: it declares {length} header bytes "
                    f"but the file has {size} bytes (at most {MAX_HEADER_BYTES} accepted); "
                    "fix: download or convert the checkpoint again"
                )
            raw = f.read(length)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc})") from exc
    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(
            f"{path}: damaged safetensors header (not JSON: {exc}); fix: download or "
            "convert the checkpoint again"
        ) from exc
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: damaged safetensors header (not a JSON object)")
    data_bytes = size - 8 - length
    entries: dict[str, dict[str, Any]] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        entries[name] = _check_entry(path, name, entry, data_bytes)
    return entries


def data_start(fd: int) -> int:
    """Where the data section of the open safetensors file ``fd`` starts: after the
    8-byte header length and the header (unchecked: :func:`read_header` checks it)."""
    (length,) = struct.unpack("<Q", os.pread(fd, 8, 0))
    return 8 + length


def _read_raw(
    path: str | Path, entry: Mapping[str, Any], start: int = 0, stop: int | None = None
) -> tuple[np.ndarray, list[int]]:
    """The bytes of rows ``[start, stop)`` of the float tensor ``entry`` of ``path`` by
    plain reads into a buffer of their own, and the rows' shape."""
    path = Path(path)
    dtype, shape = entry["dtype"], list(entry["shape"])
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"{path}: reads float tensors, not {dtype}")
    n_rows = shape[0] if shape else 1
    stop = n_rows if stop is None else min(int(stop), n_rows)
    start = max(int(start), 0)
    width = DTYPE_BYTES[dtype] * math.prod(shape[1:])
    rows = max(stop - start, 0)
    buf = np.empty(rows * width, dtype=np.uint8)
    view = memoryview(buf)
    try:
        with open(path, "rb") as f:
            f.seek(data_start(f.fileno()) + entry["data_offsets"][0] + start * width)
            done = 0
            while done < len(view):
                got = f.readinto(view[done:])
                if not got:
                    raise CheckpointError(f"{path}: file ends inside tensor data (truncated)")
                done += got
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc})") from exc
    return buf, [rows, *shape[1:]] if shape else []


class ReadAhead:
    """Reads byte ranges of safetensors files ahead of their use, in a thread, into the
    system's page cache: a streamed model's next unit while the current one computes, so
    that its reads (:func:`read_rows`) copy from memory instead of waiting on the disk.

    The bytes pass through a small buffer and are dropped: nothing is held by this
    process (the page cache is the kernel's, given back under memory pressure). A newer
    request replaces one not yet finished; errors are left to the real read to report.
    At the Mistral-7B shape the streamed passes read 14.5 GB at the disk's 1.2-2 GB/s
    (cold), and the forwards waited on every unit's read (bench/README.md).
    """

    #: bytes read at a time (the buffer the data pass through)
    CHUNK = 8 << 20

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._want: list[tuple[Path, int, int]] | None = None
        self._generation = 0
        self._closed = False
        self._thread: threading.Thread | None = None
        self._data_start: dict[Path, int] = {}
        #: bytes read ahead so far
        self.bytes = 0

    def want(self, ranges: list[tuple[Path, int, int]]) -> None:
        """Read ``(file, offset in the data section, length)`` ranges next, dropping
        what is left of the previous request."""
        with self._cond:
            if self._closed:
                return
            self._want, self._generation = list(ranges), self._generation + 1
            self._cond.notify()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="specalign-read-ahead", daemon=True
                )
                self._thread.start()

    def close(self) -> None:
        """Stop (at the next chunk) and wait for the thread."""
        with self._cond:
            self._closed, self._want = True, None
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()

    def _current(self, generation: int) -> bool:
        return self._generation == generation and not self._closed

    def _run(self) -> None:
        view = memoryview(bytearray(self.CHUNK))
        while True:
            with self._cond:
                while self._want is None and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                ranges, generation, self._want = self._want, self._generation, None
            for file, offset, length in ranges:
                if not self._current(generation):
                    break
                try:
                    self._read(file, offset, length, view, generation)
                except (OSError, ValueError, struct.error):
                    pass  # the real read says what is wrong with the file

    def _read(
        self, file: Path, offset: int, length: int, view: memoryview, generation: int
    ) -> None:
        fd = os.open(file, os.O_RDONLY)
        try:
            if file not in self._data_start:
                self._data_start[file] = data_start(fd)
            pos = self._data_start[file] + offset
            end = pos + length
            while pos < end and self._current(generation):
                got = os.preadv(fd, [view[: min(self.CHUNK, end - pos)]], pos)
                if not got:
                    return
                pos += got
                self.bytes += got
        finally:
            os.close(fd)


def read_rows(
    path: str | Path,
    entry: Mapping[str, Any],
    start: int = 0,
    stop: int | None = None,
) -> Any:
    """Rows ``[start, stop)`` along the first axis of the tensor ``entry`` (an entry of
    :func:`read_header` for ``path``) as a torch tensor in its stored dtype, by plain
    reads of just those bytes.

    Nothing is memory-mapped: a mapped read counts every page it touched towards the
    process's resident memory until the mapping goes, so reading a 2.1 GB embedding
    through a mapping and copying it out held 4.2 GB at once; here the copy is all.
    Float dtypes only (:data:`FLOAT_DTYPES`).
    """
    import torch

    buf, shape = _read_raw(path, entry, start, stop)
    dtype = getattr(torch, TORCH_DTYPES[entry["dtype"]])
    if not buf.size:  # torch gives an empty array stride 0, which no view accepts
        return torch.empty(shape, dtype=dtype)
    return torch.from_numpy(buf).view(dtype).reshape(shape)


#: Values widened at a time by :func:`read_float64` (bf16 passes through uint32).
_WIDEN_CHUNK = 1 << 22


def read_float64(path: str | Path, entry: Mapping[str, Any]) -> np.ndarray:
    """The float tensor ``entry`` of ``path`` as a float64 array, read as
    :func:`read_rows` reads (plain reads, nothing mapped) and widened by numpy, without
    torch: a job that only extracts weights needs none (torch's import is about a
    second of such a job).

    Widening is exact for every float dtype, so the values are torch's conversion's to
    the bit (test): bf16 is the upper half of a float32's bits, so its 16 bits shifted
    up are that float32. Peak memory: the stored bytes and the float64 result, with
    :data:`_WIDEN_CHUNK` values in float32 while bf16 is widened.
    """
    buf, shape = _read_raw(path, entry)
    dtype = entry["dtype"]
    if dtype == "BF16":
        bits = buf.view("<u2")
        out = np.empty(bits.size, dtype=np.float64)
        for i in range(0, bits.size, _WIDEN_CHUNK):
            wide = bits[i : i + _WIDEN_CHUNK].astype(np.uint32) << 16
            out[i : i + _WIDEN_CHUNK] = wide.view(np.float32)
    else:
        stored = buf.view({"F64": "<f8", "F32": "<f4", "F16": "<f2"}[dtype])
        out = stored.astype(np.float64, copy=False)  # F64: the buffer itself
    return out.reshape(shape)


def _check_entry(path: Path, name: str, entry: Any, data_bytes: int) -> dict[str, Any]:
    def bad(why: str) -> CheckpointError:
        return CheckpointError(f"{path}: damaged safetensors header, tensor {name!r} {why}")

    if not isinstance(entry, dict):
        raise bad("is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str):
        raise bad("has no dtype")
    if not (isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)):
        raise bad(f"has shape {shape!r}")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(type(o) is int for o in offsets)
        and 0 <= offsets[0] <= offsets[1] <= data_bytes
    ):
        raise bad(f"has data_offsets {offsets!r} outside the file's {data_bytes} data bytes")
    width = DTYPE_BYTES.get(dtype)
    if width is not None and offsets[1] - offsets[0] != math.prod(shape) * width:
        raise bad(
            f"of shape {shape} and dtype {dtype} needs {math.prod(shape) * width} bytes, "
            f"its offsets span {offsets[1] - offsets[0]}"
        )
    return {"dtype": dtype, "shape": shape, "data_offsets": offsets}


def read_index(index: str | Path) -> dict[str, Path]:
    """``{tensor name: shard}`` of a shard index; a missing shard is one line naming it."""
    index = Path(index)
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{index}: not a readable shard index ({exc})") from exc
    missing = sorted({str(f) for f in weight_map.values() if not (index.parent / f).is_file()})
    if missing:
        raise CheckpointError(
            f"{index}: shard {missing[0]} is missing"
            + (f" (and {len(missing) - 1} more: {', '.join(missing[1:])})" if missing[1:] else "")
            + "; fix: download the checkpoint again (or copy the missing shard beside the index)"
        )
    return {str(k): index.parent / str(f) for k, f in weight_map.items()}


def safetensors_files(model_dir: str | Path) -> list[Path]:
    """The safetensors files of the folder's one checkpoint (see the module doc); [] when
    it has none (a ``pytorch_model.bin`` checkpoint)."""
    d = Path(model_dir)
    index = d / "model.safetensors.index.json"
    if index.exists():
        return sorted(set(read_index(index).values()))
    if (d / "model.safetensors").is_file():
        return [d / "model.safetensors"]
    files = sorted(p for p in d.glob("*.safetensors") if p.is_file())
    hf = [p for p in files if not CONSOLIDATED_RE.match(p.name)]
    return hf or files


def stored_parameters(model_dir: str | Path) -> int | None:
    """The number of stored values of the folder's one checkpoint, from its headers;
    None without safetensors. CheckpointError naming a damaged file."""
    files = safetensors_files(model_dir)
    if not files:
        return None
    return sum(math.prod(e["shape"]) for f in files for e in read_header(f).values())


def quantization(config: Mapping[str, Any], where: str | Path) -> dict[str, Any] | None:
    """The config's ``quantization_config`` when it is the supported block-wise FP8
    scheme, None without one; CheckpointError naming any other scheme."""
    q = config.get("quantization_config")
    if not q:
        return None
    method = q.get("quant_method") if isinstance(q, Mapping) else None
    block = q.get("weight_block_size") if isinstance(q, Mapping) else None
    if method in SUPPORTED_QUANTIZATION and (
        isinstance(block, list) and len(block) == 2 and all(type(b) is int and b > 0 for b in block)
    ):
        return {"quant_method": method, "weight_block_size": list(block)}
    scheme = method if method in SUPPORTED_QUANTIZATION else repr(method)
    detail = "" if method not in SUPPORTED_QUANTIZATION else f" with weight_block_size {block!r}"
    raise CheckpointError(
        f"{where}: quantization scheme {scheme}{detail} (quantization_config) is not "
        "supported: the study reads floating-point weights (f32, f16, bf16), and float8 "
        "weights with per-block scales (quant_method 'fp8', weight_block_size [b, b]); "
        "fix: use the model's unquantized release"
    )


def _is_weight(name: str) -> bool:
    """Whether a tensor is a learned weight or bias (buffers such as ``position_ids``
    are integer by design)."""
    last = name.rsplit(".", 1)[-1]
    return last.endswith("weight") or last.endswith("bias")


def check_checkpoint(model_dir: str | Path, n_blocks: int | None = None) -> dict[str, str]:
    """Refuse a checkpoint the study cannot compute with (see the module doc); return
    ``{tensor name: dtype}`` of its safetensors tensors ({} for a ``.bin`` checkpoint).

    ``n_blocks``: the number of stored layers config.json implies; a layer stack with
    fewer is an error naming the first missing layer's tensor.
    """
    d = Path(model_dir)
    config_path = d / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{config_path}: not readable JSON ({exc})") from exc
    quant = quantization(config if isinstance(config, dict) else {}, config_path)
    dtypes: dict[str, str] = {}
    where: dict[str, Path] = {}
    for file in safetensors_files(d):
        for name, entry in read_header(file).items():
            dtypes[name], where[name] = entry["dtype"], file
    for name, dtype in dtypes.items():
        if dtype in FLOAT_DTYPES or not _is_weight(name):
            continue
        if dtype in FP8_DTYPES and quant is not None and f"{name}_scale_inv" in dtypes:
            continue
        if dtype in FP8_DTYPES:
            why = (
                f"float8 ({dtype}) without its block scales {name + '_scale_inv'!r}"
                if quant is not None
                else f"float8 ({dtype}) but config.json declares no quantization_config"
            )
        else:
            why = f"{dtype}, not floating point (a quantized or integer tensor)"
        raise CheckpointError(
            f"{where[name]}: tensor {name!r} is {why}; the study computes with floating-point "
            "weights only; fix: use the model's unquantized (f32, f16 or bf16) release"
        )
    index = d / "model.safetensors.index.json"
    missing = missing_layer_tensor(list(dtypes), n_blocks)
    if missing is not None:
        files = sorted({where[n].name for n in dtypes})
        named = index if index.exists() else d / files[0] if len(files) == 1 else d
        raise CheckpointError(
            f"{named}: tensor {missing!r} is missing (the other layers have theirs); fix: "
            "download or convert the checkpoint again"
        )
    return dtypes


def missing_layer_tensor(names: list[str], n_blocks: int | None = None) -> str | None:
    """The first tensor one layer of a stack lacks, or None.

    A stack is the tensors named ``<prefix>.<i>.<rest>`` with the same prefix; every
    layer i of it must have every ``<rest>`` some layer has, the indices must run from 0
    without gaps and, for the largest stack, reach ``n_blocks`` layers when given.
    """
    stacks: dict[str, dict[str, set[int]]] = {}
    for name in names:
        m = _LAYER_RE.match(name)
        if m:
            prefix, i, rest = m.groups()
            stacks.setdefault(prefix, {}).setdefault(rest, set()).add(int(i))
    largest = max(stacks, key=lambda p: len(set().union(*stacks[p].values())), default=None)
    for prefix in sorted(stacks):
        rests = stacks[prefix]
        layers = set().union(*rests.values())
        count = max(layers) + 1
        if prefix == largest and n_blocks is not None and count < n_blocks:
            count = n_blocks
        for i in range(count):
            for rest in sorted(rests):
                if i not in rests[rest]:
                    return f"{prefix}{i}{rest}"
    return None


def dequantize_fp8_blocks(
    codes: np.ndarray, scale_inv: np.ndarray, block: list[int] | tuple[int, int]
) -> np.ndarray:
    """W[i, j] = q[i, j] * s[i // b_out, j // b_in] (float64), the block-wise FP8 scheme
    of the module doc; ``codes`` already converted from float8 to a float array."""
    b_out, b_in = int(block[0]), int(block[1])
    q = np.asarray(codes, dtype=np.float64)
    s = np.asarray(scale_inv, dtype=np.float64)
    if q.ndim != 2 or s.ndim != 2:
        raise ValueError(f"block-wise FP8 needs 2-D codes and scales, got {q.shape}, {s.shape}")
    rows, cols = -(-q.shape[0] // b_out), -(-q.shape[1] // b_in)
    if s.shape != (rows, cols):
        raise ValueError(
            f"scales of shape {s.shape} do not match codes {q.shape} in blocks of "
            f"{b_out} x {b_in} (expected {(rows, cols)})"
        )
    full = np.repeat(np.repeat(s, b_out, axis=0), b_in, axis=1)[: q.shape[0], : q.shape[1]]
    return q * full


def check_transformers_can_load(config: Mapping[str, Any], where: str | Path) -> None:
    """The real-model passes (propagate, steer) stream the checkpoint's stored tensors
    layer by layer (:mod:`specalign.transformers.load.streaming`), which does not apply block
    scales: a quantized checkpoint would be run on its float8 codes. CheckpointError
    naming the scheme, before any long work; extraction itself dequantizes."""
    q = quantization(config, where)
    if q is not None:
        raise CheckpointError(
            f"{where}: quantization scheme {q['quant_method']!r} with weight_block_size "
            f"{q['weight_block_size']}: the real-model passes (propagate, steer) read the "
            "stored tensors layer by layer and do not dequantize them; fix: use the model's "
            "unquantized release"
        )


def tokenizer_files(folder: str | Path) -> list[Path]:
    """The tokenizer's data files in ``folder`` (:data:`TOKENIZER_PATTERNS`), sorted."""
    d = Path(folder)
    return sorted({f for p in TOKENIZER_PATTERNS for f in d.glob(p) if f.is_file()})


def model_files(model_dir: str | Path) -> list[Path]:
    """The files of a model folder that the workflow reads: config.json, the tokenizer's
    data files, the one checkpoint's weights (safetensors shards and their index, else
    pickled weights) and, for a random model, its seed record."""
    d = Path(model_dir)
    names = ["config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json",
             "random_model.json"]  # fmt: skip
    files = {d / n for n in names if (d / n).is_file()}
    files |= set(tokenizer_files(d))
    try:
        weights = safetensors_files(d)
    except CheckpointError:  # a shard missing: what is there is the content
        weights = sorted(d.glob("*.safetensors"))
    if not weights:
        weights = sorted(d.glob("pytorch_model*.bin"))
    files |= {f for f in weights if f.is_file()}
    return sorted(files)


def model_digest(model_dir: str | Path) -> str:
    """The content digest of a model folder (:func:`model_files`, by name and bytes)."""
    d = Path(model_dir)
    return digest_of((f.name, file_digest(f)) for f in model_files(d))
