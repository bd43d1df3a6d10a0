"""The data contracts of the transformer study: what each model's files hold.

The files the workflow writes for every configured model, and who computes them:

* ``resources/models/{model}/manifest.json``: where the model folder is and where it
  came from (hub id and resolved commit, local folder, package, or random weights);
* ``results/transformers/{model}/weights.h5``: the attention weights of every distinct
  layer and F (below), streamed into the file block by block by
  :func:`specalign.transformers.load.extract.extract_to_h5` and read back by
  :func:`read_weights_h5` (the spectra rule lazily, one block at a time);
* ``results/transformers/{model}/spectra.nc``: eigenvalues, eigenvectors and gaps of
  every distinct F (:func:`specalign.transformers.measure.spectra.spectra_dataset`);
* ``results/transformers/{model}/propagation.nc``: token metrics per mode, layer, token
  (:func:`specalign.transformers.measure.propagate.propagation_dataset`);
* ``results/transformers/{model}/steering.nc``: the last-layer W_O change and its effect
  (:func:`specalign.transformers.measure.steer.steering_dataset`);
* ``results/transformers/sphere/sphere.nc``: the supplement's sphere dynamics
  (:func:`specalign.transformers.measure.sphere.sphere_dataset`).

This module reads and writes; the kernels that compute what goes in live beside it, so
that a rule that only reads a file does not depend on the code that made it.

``weights.h5`` contract (``results/transformers/{model}/weights.h5``; all float64,
y = W x + b with W stored (out, in)); format_version 3:

* ``F`` (block, d, d): F_b = W_O W_V of each distinct block; only when the rank bound
  r = n_kv_heads * d_head is not below d (v3; every block of a version 1 or 2 file has
  it). With grouped-query attention and r < d (Mistral-7B: r = 1024, d = 4096) F has rank
  at most r and is kept as its factors instead: ``blocks/{b}/W_O_grouped`` and W_V.
* ``layer_block`` (layer,) int64: block index used by each layer.
* ``blocks/{b}/W_Q`` (n_heads*d_head, d), ``W_K``, ``W_V`` (n_kv_heads*d_head, d),
  ``W_O`` (d, n_heads*d_head), ``b_Q`` (n_heads*d_head,), ``b_K``, ``b_V``
  (n_kv_heads*d_head,), ``b_O`` (d,), ``ln_weight``, ``ln_bias`` (d,): the effective gain
  and bias of the norm of the simplified update (Gemma's stored w as the gain 1 + w;
  zeros for an RMSNorm's bias). Query head h reads key/value head
  h // (n_heads / n_kv_heads); version 1 and 2 files store W_K, W_V, b_K, b_V expanded
  to n_heads heads instead, and :func:`read_weights_h5` expands a v3 file's the same way,
  so a ``BlockWeights`` always holds them expanded (F = W_O W_V holds as written).
* ``blocks/{b}/W_O_grouped`` (d, n_kv_heads*d_head) (v3, only where ``F`` is absent):
  W_O' of F = W_O' W_V, the sum of the output columns of the query heads that share a
  key/value head (:meth:`specalign.transformers.weights.ModelWeights.ov_factors`);
  checked against W_O on reading.
* optional per block (v2): ``blocks/{b}/q_norm``, ``k_norm`` (d_head,), the gains of
  the per-head RMSNorms on queries and keys (Qwen3, Gemma 3); ``blocks/{b}/post_norm``
  (d,), the gain of the RMSNorm on the attention output (Gemma 2/3).
* ``embedding_projection/W`` (d, embedding_size) and ``embedding_projection/b`` (d,):
  ALBERT and OPT-350m (``project_in``) only.
* ``rotary/inv_freq`` (layer, rotated_dims / 2) and ``rotary/scaling`` (layer,) (v2): the
  inverse frequencies of each layer's rotary position embedding, and the factor on its
  cos/sin; only when attribute ``rotary`` is not "none".
* root attributes (:data:`FIELD_ATTRS`, each a ``ModelWeights`` field of its name, and
  :data:`FILE_ATTRS`): ``source``, ``revision``, ``family``, ``d_model``, ``n_heads``,
  ``d_head``, ``n_layers``, ``n_blocks``, ``shared``, ``ln_position``, ``causal``,
  ``attn_scale``, ``layer_attention`` (JSON list), ``window_size`` (int or "null"),
  ``ln_eps``, ``has_bias`` (JSON list of {"Q","K","V","O": bool} per block),
  ``convention``, ``format_version``; since v2 also ``norm`` ("layernorm" or
  "rmsnorm"), ``n_kv_heads``, ``attn_softcap`` (float or "null"), ``residual``
  ("sequential" or "parallel") and ``rotary`` ("none", "half" or "interleaved").

Version 2 files (K, V expanded, F of every block) are read as they are; version 1 files
(the four families of the paper, before the newer ones) are read with
the version 1 meaning of the absent keys (LayerNorm, no grouped K/V, no rotary, no
softcap, sequential residual); files of a newer version are refused with the fix.

Modes of ``propagation.nc`` (Section 3 of Li & Altafini and its supplement):

* ``simplified_real``: the paper's simplified model (no FFN, LayerNorm as normalisation
  onto the sphere) from the embedding output, with each layer's real attention weights;
* ``simplified_full``: the same with full attention A = 1/n, the exact power-method step
  on I + eta F;
* ``real_model``: the real model's hidden states (embeddings, FFN, affine LayerNorm;
  Figures 11, 12);
* ``prolonged_real`` / ``prolonged_full``: the simplified model run for
  ``prolonged_layers`` layers, repeating the shared (ALBERT) or last layer (Figure 6).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specalign import io
from specalign.io import InputFileError, atomic_path, checksummed, read_h5
from specalign.transformers.weights import (
    SHARED,
    BlockWeights,
    ModelWeights,
    expand_rows,
    group_rows,
    grouped_output,
    ov_factors,
)

FORMAT_VERSION = 3
BLOCK_FIELDS = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O", "ln_weight", "ln_bias")
#: Block datasets written only for the families that have them (v2).
OPTIONAL_BLOCK_FIELDS = ("q_norm", "k_norm", "post_norm")
#: Block datasets stored at n_kv_heads heads since v3 (expanded to n_heads in memory).
KV_FIELDS = ("W_K", "W_V", "b_K", "b_V")
BIAS_KEYS = ("Q", "K", "V", "O")


def _json_value(value: Any) -> Any:
    """A JSON-encoded attribute's value (written as a string; None stays None)."""
    return json.loads(value) if isinstance(value, str) else value


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def _null_or(value: Any, convert: Callable[[Any], Any]) -> Any:
    """``value`` converted, or the string "null" for None (HDF5 attributes hold no None)."""
    return "null" if value is None else convert(value)


@dataclass(frozen=True)
class FieldAttr:
    """How the ``ModelWeights`` field of the same name is a root attribute of weights.h5."""

    #: the format version that added it; an older file lacks it and means ``absent``
    since: int
    #: the attribute's value back to the field's (str, int, JSON, ...)
    decode: Callable[[Any], Any]
    #: (the field's value, the model) -> the attribute's value; the decoder by default
    encode: Callable[[Any, ModelWeights], Any] | None = None
    absent: Any = None

    def written(self, value: Any, mw: ModelWeights) -> Any:
        """The attribute's value for the field's ``value`` in model ``mw``."""
        return self.decode(value) if self.encode is None else self.encode(value, mw)


#: The root attributes of weights.h5 that hold a ``ModelWeights`` field, each named by
#: the field: the one list the writer, the reader and the check of a file's attributes
#: follow. The others are :data:`FILE_ATTRS`.
FIELD_ATTRS: dict[str, FieldAttr] = {
    "source": FieldAttr(1, str),
    "revision": FieldAttr(1, str),
    "family": FieldAttr(1, str),
    "d_model": FieldAttr(1, int),
    "n_heads": FieldAttr(1, int),
    "n_layers": FieldAttr(1, int),
    "ln_position": FieldAttr(1, str),
    "causal": FieldAttr(1, bool),
    "attn_scale": FieldAttr(1, float),
    "layer_attention": FieldAttr(
        1, lambda v: list(_json_value(v)), lambda v, mw: json.dumps(list(v))
    ),
    "window_size": FieldAttr(
        1, lambda v: _int_or_none(_json_value(v)), lambda v, mw: _null_or(v, int)
    ),
    "ln_eps": FieldAttr(1, float),
    # v2, with the meaning of their absence in a version 1 file
    "norm": FieldAttr(2, str, absent="layernorm"),
    "n_kv_heads": FieldAttr(2, _int_or_none, lambda v, mw: int(mw.kv_heads)),
    "attn_softcap": FieldAttr(
        2, lambda v: _float_or_none(_json_value(v)), lambda v, mw: _null_or(v, float)
    ),
    "residual": FieldAttr(2, str, absent="sequential"),
    "rotary": FieldAttr(
        2, lambda v: None if v == "none" else str(v), lambda v, mw: v or "none", absent="none"
    ),
}
#: The root attributes of weights.h5 that are not ``ModelWeights`` fields.
D_HEAD = "d_head"
N_BLOCKS = "n_blocks"
HAS_BIAS = "has_bias"  # JSON list of {"Q","K","V","O": bool} per block
CONVENTION = "convention"
FORMAT_VERSION_ATTR = "format_version"
FILE_ATTRS = (D_HEAD, N_BLOCKS, SHARED, HAS_BIAS, CONVENTION, FORMAT_VERSION_ATTR)

#: The modes of ``propagation.nc``, in the order of its ``mode`` coordinate (the
#: prolonged ones only when ``prolonged_layers`` exceeds the model's depth).
MODES: tuple[str, ...] = (
    "simplified_real",
    "simplified_full",
    "real_model",
    "prolonged_real",
    "prolonged_full",
)

# --------------------------------------------------------------------------- manifests


def manifest_path_value(model_dir: str | Path) -> str:
    """How a manifest records a model folder: relative to the working directory when it
    lies inside it (a random model, a hub snapshot in ``transformers.cache``), so that a
    copied working directory reads its own files; absolute otherwise."""
    resolved = Path(model_dir).resolve()
    try:
        return str(resolved.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(resolved)


def write_manifest(path: str | Path, model_dir: str | Path, info: Mapping[str, Any]) -> None:
    """Record where a model folder is (:func:`manifest_path_value`), its provenance and
    ``content``, the digest of its files
    (:func:`specalign.transformers.load.checkpoint.model_digest`)."""
    from specalign.transformers.load.checkpoint import model_digest

    record = {"path": manifest_path_value(model_dir), "content": model_digest(model_dir)}
    io.write_json(path, {**record, **dict(info)})


def read_manifest(path: str | Path) -> dict[str, Any]:
    """Read a manifest; the model folder it names must still exist and hold what was
    recorded (its ``content`` digest: a checkpoint, tokenizer or configuration changed
    since, in the workflow's hub cache or anywhere else, is an error naming both, never
    read as the recorded model). The digests are cached by file identity
    (:mod:`specalign.contents`): an unchanged folder costs a ``stat`` per file. A relative
    ``path`` is resolved against the working directory."""
    path = Path(path)
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise io.InputFileError(f"{path}: file does not exist") from exc
    except json.JSONDecodeError as exc:
        raise io.InputFileError(f"{path}: not valid JSON ({exc})") from exc
    model_dir = Path(manifest.get("path", ""))
    if not (model_dir / "config.json").exists():
        raise io.InputFileError(
            f"{path}: the model folder {model_dir} it names has no config.json any more; "
            "delete the manifest and rerun the workflow to fetch the model again"
        )
    recorded = manifest.get("content")
    if recorded:
        from specalign.transformers.load.checkpoint import model_digest

        found = model_digest(model_dir)
        if found != recorded:
            raise io.InputFileError(
                f"{path}: the model folder {model_dir} is not what it records (content "
                f"{found}, recorded {recorded}): a file in it changed since; fix: restore "
                f"the folder, or make the manifest again (snakemake --force {path})"
            )
    return manifest


# ----------------------------------------------------------------------------- weights.h5


def write_weights_h5(path: str | Path, mw: ModelWeights) -> None:
    """Write ``mw`` to ``path`` atomically in the ``weights.h5`` contract (module doc)."""
    import h5py

    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        if not mw.factored:
            F = np.stack([blk.F for blk in mw.blocks]).astype(np.float64)
            f.create_dataset("F", data=F, **checksummed(F))
        for b, blk in enumerate(mw.blocks):
            write_block(f, b, blk, mw.n_heads, mw.kv_heads)
        has_bias = [{k: bool(blk.has_bias.get(k, True)) for k in BIAS_KEYS} for blk in mw.blocks]
        write_weights_attrs(f, mw, has_bias, mw.d_head)


def block_factored(blk: BlockWeights, n_heads: int, n_kv_heads: int) -> bool:
    """Whether ``blk`` is stored as factors, without F: r = n_kv_heads * d_head < d."""
    return n_kv_heads * (blk.W_V.shape[0] // n_heads) < blk.W_V.shape[1]


def write_block(
    f: Any,
    b: int,
    blk: BlockWeights,
    n_heads: int | None = None,
    n_kv_heads: int | None = None,
    kv_grouped: bool = False,
) -> None:
    """The datasets ``blocks/{b}/...`` of one block (the optional ones when present).

    ``n_heads``/``n_kv_heads`` (both or neither): with grouped-query attention the
    key/value rows are stored once per key/value head, and ``W_O_grouped`` where the block
    is factored (:func:`block_factored`); ValueError if ``blk``'s expanded rows are not
    copies of their key/value head's. ``kv_grouped``: ``blk`` holds K and V at the
    key/value heads already (a factored block read with ``FamilyAdapter.kv_expanded``
    False), stored as they are.
    """
    grouped = n_heads is not None and n_kv_heads is not None and n_kv_heads != n_heads
    for name in BLOCK_FIELDS + OPTIONAL_BLOCK_FIELDS:
        value = getattr(blk, name)
        if value is not None:
            arr = np.asarray(value, dtype=np.float64)
            if grouped and name in KV_FIELDS and not kv_grouped:
                arr = group_rows(arr, n_heads, n_kv_heads)  # type: ignore[arg-type]
            f.create_dataset(f"blocks/{b}/{name}", data=arr, **checksummed(arr))
    if grouped and (kv_grouped or block_factored(blk, n_heads, n_kv_heads)):  # type: ignore[arg-type]
        W_O = grouped_output(np.asarray(blk.W_O, np.float64), n_heads, n_kv_heads)  # type: ignore[arg-type]
        f.create_dataset(f"blocks/{b}/W_O_grouped", data=W_O, **checksummed(W_O))


def _write_array(f: Any, name: str, value: Any) -> None:
    arr = np.asarray(value, np.float64)
    f.create_dataset(name, data=arr, **checksummed(arr))


def write_weights_attrs(
    f: Any, mw: ModelWeights, has_bias: list[dict[str, bool]], d_head: int
) -> None:
    """The datasets and root attributes that do not depend on the blocks' contents."""
    layer_block = np.asarray(mw.layer_block, dtype=np.int64)
    f.create_dataset("layer_block", data=layer_block, **checksummed(layer_block))
    if mw.embedding_projection is not None:
        bias = mw.embedding_projection_bias
        _write_array(f, "embedding_projection/W", mw.embedding_projection)
        _write_array(f, "embedding_projection/b", np.zeros(mw.d_model) if bias is None else bias)
    if mw.rotary is not None:
        _write_array(f, "rotary/inv_freq", mw.rotary_inv_freq)
        _write_array(f, "rotary/scaling", mw.rotary_scaling)
    attrs: dict[str, Any] = {
        name: attr.written(getattr(mw, name), mw) for name, attr in FIELD_ATTRS.items()
    }
    attrs.update({
        D_HEAD: int(d_head),
        N_BLOCKS: len(has_bias),
        SHARED: bool(len(has_bias) == 1 and mw.n_layers > 1),
        HAS_BIAS: json.dumps(has_bias),
        CONVENTION: "y = W x + b; W stored (out, in); F = W_O W_V = W_O_grouped W_V; "
        "K, V stored at n_kv_heads heads; F stored only when n_kv_heads * d_head >= d; "
        "float64",
        FORMAT_VERSION_ATTR: FORMAT_VERSION,
        **io.provenance_attrs(),  # the thread count F = W_O W_V was computed with
    })  # fmt: skip
    for key, value in attrs.items():
        f.attrs[key] = value


def read_weights_h5(path: str | Path, lazy: bool = False) -> ModelWeights:
    """Read a ``weights.h5`` back; InputFileError naming ``path`` if it breaks the contract.

    ``lazy``: ``blocks`` is a :class:`LazyBlocks` that reads a block from the file each
    time it is indexed (h5py per-dataset reads), so a job that visits the blocks one at a
    time holds one block's float64 weights, not the model's (issue 14: Mistral-7B's v3
    file is ~10.7 GB). Every dataset's shape and the F / factor layout are checked before
    returning, as for an eager read; the values of a block (W_O_grouped against W_O) when
    it is read. The blocks read are the same arrays an eager read gives.
    """
    path = Path(path)
    if lazy:
        data, attrs, shapes = _read_h5_meta(path)
    else:
        data, attrs = read_h5(path)  # InputFileError for missing/truncated/corrupt files
        shapes = {k: np.shape(v) for k, v in data.items()}

    def fail(msg: str) -> InputFileError:
        return InputFileError(f"{path}: {msg} (weights.h5 contract)")

    version = int(attrs.get(FORMAT_VERSION_ATTR, 1))
    if version > FORMAT_VERSION:
        raise InputFileError(
            f"{path}: format_version {version} is newer than this specalign reads "
            f"({FORMAT_VERSION}); fix: update specalign, or delete the file and rerun "
            "extract_weights"
        )
    required = [n for n, a in FIELD_ATTRS.items() if a.since <= version] + [SHARED]
    missing = [a for a in required if a not in attrs]
    if missing:
        raise fail(f"missing root attribute(s) {', '.join(missing)}")
    if "layer_block" not in data:
        raise fail("missing dataset layer_block")
    n_blocks = len({k.split("/")[1] for k in shapes if k.startswith("blocks/")})
    if "F" in shapes and shapes["F"][0] != n_blocks:
        raise fail(f"F holds {shapes['F'][0]} blocks, blocks/ holds {n_blocks}")
    try:
        has_bias = _json_attr(attrs.get(HAS_BIAS), [{}] * n_blocks)
        fields = {
            name: attr.decode(attrs.get(name, attr.absent)) for name, attr in FIELD_ATTRS.items()
        }
    except (ValueError, TypeError) as exc:
        raise fail(f"unparseable attribute ({exc})") from exc
    n_heads = fields["n_heads"]
    # before v3, K and V were stored expanded to n_heads heads whatever n_kv_heads says
    kv = n_heads if fields["n_kv_heads"] is None or version < 3 else fields["n_kv_heads"]
    if kv < 1 or n_heads % kv:
        raise fail(f"n_kv_heads {kv} does not divide n_heads {n_heads}")
    blocks: Any
    if lazy:
        block_shapes = [_block_shapes(shapes, b, fail, n_heads, kv) for b in range(n_blocks)]
        inner = block_shapes[0]["W_Q"][0] if block_shapes else 0
        blocks = LazyBlocks(path, has_bias, fail, n_heads, kv, inner // max(n_heads, 1))
    else:
        blocks = [_read_block(data, b, has_bias[b], fail, n_heads, kv) for b in range(n_blocks)]
        block_shapes = [
            {n: getattr(blk, n).shape for n in BLOCK_FIELDS + OPTIONAL_BLOCK_FIELDS
             if getattr(blk, n) is not None}  # fmt: skip
            for blk in blocks
        ]
    layer_block = np.asarray(data["layer_block"], dtype=np.int64)
    rotary = fields["rotary"]
    if rotary is not None and not {"rotary/inv_freq", "rotary/scaling"} <= set(data):
        raise fail(f"rotary {rotary!r} without the datasets rotary/inv_freq, rotary/scaling")
    mw = ModelWeights(
        **fields,
        blocks=blocks,
        layer_block=layer_block,
        embedding_projection=data.get("embedding_projection/W"),
        embedding_projection_bias=data.get("embedding_projection/b"),
        rotary_inv_freq=data.get("rotary/inv_freq") if rotary else None,
        rotary_scaling=data.get("rotary/scaling") if rotary else None,
    )
    _check_shapes(mw, shapes.get("F"), fail, block_shapes)
    if version >= 3:
        _check_factor_layout(mw, shapes, fail)
        if lazy:
            blocks.check_factors = mw.factored
        else:
            for b, blk in enumerate(mw.blocks):
                _check_block_factors(mw, b, blk, data, fail)
    return mw


def _read_h5_meta(
    path: Path,
) -> tuple[dict[str, np.ndarray], dict[str, Any], dict[str, tuple[int, ...]]]:
    """:func:`specalign.io.read_h5` without the blocks' datasets and F: the other
    datasets (small), the root attributes and every dataset's shape."""
    import h5py

    if not path.exists():
        raise InputFileError(f"{path}: file does not exist")
    data: dict[str, np.ndarray] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    try:
        with h5py.File(path, "r") as f:

            def visit(name: str, obj: Any) -> None:
                if isinstance(obj, h5py.Dataset):
                    shapes[name] = tuple(obj.shape)
                    if not (name.startswith("blocks/") or name == "F"):
                        data[name] = obj[()]

            f.visititems(visit)
            attrs = {k: io._decode_attr(v) for k, v in f.attrs.items()}
    except (OSError, KeyError, ValueError) as exc:
        raise InputFileError(f"{path}: not a readable HDF5 file ({exc})") from exc
    return data, attrs, shapes


def _block_shapes(
    shapes: Mapping[str, tuple[int, ...]],
    b: int,
    fail: Callable[[str], Any],
    n_heads: int,
    n_kv_heads: int,
) -> dict[str, tuple[int, ...]]:
    """The in-memory (K/V expanded) shapes of block ``b``'s fields, from the file's."""
    names = [f"blocks/{b}/{name}" for name in BLOCK_FIELDS]
    absent = [n for n in names if n not in shapes]
    if absent:
        raise fail(f"missing {', '.join(absent)}")
    out = {name: tuple(shapes[f"blocks/{b}/{name}"]) for name in BLOCK_FIELDS}
    if n_kv_heads != n_heads:
        rows = out["W_Q"][0] * n_kv_heads // n_heads
        for name in KV_FIELDS:
            if not out[name] or out[name][0] != rows:
                got = out[name][0] if out[name] else 0
                raise fail(
                    f"blocks/{b}/{name} has {got} rows, not {rows} (n_kv_heads={n_kv_heads} heads)"
                )
            out[name] = (out[name][0] * (n_heads // n_kv_heads), *out[name][1:])
    for name in OPTIONAL_BLOCK_FIELDS:
        if f"blocks/{b}/{name}" in shapes:
            out[name] = tuple(shapes[f"blocks/{b}/{name}"])
    return out


class LazyBlocks(Sequence[BlockWeights]):
    """The blocks of a ``weights.h5`` read on demand (:func:`read_weights_h5` ``lazy``).

    ``blocks[b]`` opens the file and reads block ``b`` (K, V expanded as an eager read
    does; W_O_grouped checked against W_O where the block is factored). The last block
    read is kept, so a run that repeats a layer (a prolonged run past the last layer,
    ALBERT's one shared block) reads it once: at most one block beyond those the callers
    hold. ``d_head`` is known from the shapes, without a read.
    """

    def __init__(
        self,
        path: Path,
        has_bias: list[Mapping[str, bool]],
        fail: Callable[[str], InputFileError],
        n_heads: int,
        n_kv_heads: int,
        d_head: int,
    ) -> None:
        self.path, self.has_bias, self.fail = path, has_bias, fail
        self.n_heads, self.n_kv_heads, self.d_head = n_heads, n_kv_heads, d_head
        self.check_factors = False
        self._last: tuple[int, BlockWeights] | None = None
        #: blocks read from the file so far (the cost of a pass over the model)
        self.reads = 0

    def __len__(self) -> int:
        return len(self.has_bias)

    def __getitem__(self, b: Any) -> Any:
        if isinstance(b, slice):
            return [self[i] for i in range(*b.indices(len(self)))]
        b = int(b)
        if not -len(self) <= b < len(self):
            raise IndexError(f"block {b} of {len(self)}")
        b %= len(self)
        if self._last is not None and self._last[0] == b:
            return self._last[1]
        self._last = None  # the previous block goes before the next one is read
        import h5py

        with h5py.File(self.path, "r") as f:
            blk = _read_block(f, b, self.has_bias[b], self.fail, self.n_heads, self.n_kv_heads)
            if self.check_factors:
                _check_block_factors_of(blk, b, f, self.fail, self.n_heads, self.n_kv_heads)
        self.reads += 1
        self._last = (b, blk)
        return blk

    def ov_fields(self, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(W_O', W_V', W_O) of block ``b`` read alone, or None where the file does not
        store K and V at the key/value heads (format_version < 3, or no grouped query).

        What the spectra of a factored block need (:func:`ov_factors` of the block read by
        ``blocks[b]``, and W_O for the per-head spectra), without reading W_Q, W_K, the
        biases and norms, or expanding V to the query heads and grouping it back (issue
        14: at Mistral-7B's width that was half the bytes and a third of the time of the
        spectra job). W_O' is the sum of W_O's query-head columns, checked against the
        stored W_O_grouped as ``blocks[b]`` checks it.
        """
        if self.n_kv_heads == self.n_heads:
            return None
        import h5py

        b = int(b) % len(self)
        with h5py.File(self.path, "r") as f:
            names = [f"blocks/{b}/{n}" for n in ("W_V", "W_O", "W_O_grouped")]
            absent = [n for n in names if n not in f]
            if absent:
                raise self.fail(f"missing {', '.join(absent)}")
            W_V, W_O = (np.asarray(f[n], np.float64) for n in names[:2])
            rows = self.n_kv_heads * self.d_head
            if W_V.shape[0] != rows:
                raise self.fail(
                    f"{names[0]} has {W_V.shape[0]} rows, not {rows} "
                    f"(n_kv_heads={self.n_kv_heads} heads)"
                )
            W_Og = grouped_output(W_O, self.n_heads, self.n_kv_heads)
            _check_grouped_output(np.asarray(f[names[2]], np.float64), W_Og, names[2], self.fail)
        self.reads += 1
        return W_Og, W_V, W_O


def _read_block(
    data: Mapping[str, Any],
    b: int,
    has_bias: Mapping[str, bool],
    fail: Callable[[str], Any],
    n_heads: int,
    n_kv_heads: int,
) -> BlockWeights:
    names = [f"blocks/{b}/{name}" for name in BLOCK_FIELDS]
    absent = [n for n in names if n not in data]
    if absent:
        raise fail(f"missing {', '.join(absent)}")
    pairs = zip(BLOCK_FIELDS, names, strict=True)
    fields = {name: np.asarray(data[n], np.float64) for name, n in pairs}
    if n_kv_heads != n_heads:
        rows = fields["W_Q"].shape[0] * n_kv_heads // n_heads
        for name in KV_FIELDS:
            if fields[name].shape[0] != rows:
                raise fail(
                    f"blocks/{b}/{name} has {fields[name].shape[0]} rows, not {rows} "
                    f"(n_kv_heads={n_kv_heads} heads)"
                )
            fields[name] = expand_rows(fields[name], n_heads, n_kv_heads)
    for name in OPTIONAL_BLOCK_FIELDS:
        if f"blocks/{b}/{name}" in data:
            fields[name] = np.asarray(data[f"blocks/{b}/{name}"], np.float64)
    return BlockWeights(**fields, has_bias=dict(has_bias))


def _json_attr(value: Any, default: Any) -> Any:
    if value is None:
        return default
    return json.loads(value) if isinstance(value, str) else value


def _check_factor_layout(
    mw: ModelWeights,
    shapes: Mapping[str, tuple[int, ...]],
    fail: Callable[[str], InputFileError],
) -> None:
    """A v3 file has F exactly where the block is not factored, W_O_grouped where it is."""
    if mw.factored == ("F" in shapes):
        raise fail(
            f"rank bound r = {mw.rank_bound}, d = {mw.d_model}: F must be "
            f"{'absent' if mw.factored else 'present'}"
        )
    if not mw.factored:
        return
    want = (mw.d_model, mw.rank_bound)
    for b in range(len(mw.blocks)):
        name = f"blocks/{b}/W_O_grouped"
        if name not in shapes:
            raise fail(f"missing {name} (a factored block without F)")
        if tuple(shapes[name]) != want:
            raise fail(f"{name} has shape {tuple(shapes[name])}, not {want}")


def _check_block_factors(
    mw: ModelWeights,
    b: int,
    blk: BlockWeights,
    data: Mapping[str, Any],
    fail: Callable[[str], InputFileError],
) -> None:
    """W_O_grouped of a factored block agrees with W_O (the sum of its query heads' columns)."""
    if mw.factored:
        _check_block_factors_of(blk, b, data, fail, mw.n_heads, mw.kv_heads)


def _check_block_factors_of(
    blk: BlockWeights,
    b: int,
    data: Mapping[str, Any],
    fail: Callable[[str], InputFileError],
    n_heads: int,
    n_kv_heads: int,
) -> None:
    name = f"blocks/{b}/W_O_grouped"
    W_O = np.asarray(data[name], np.float64)
    _check_grouped_output(W_O, ov_factors(blk, n_heads, n_kv_heads)[0], name, fail)


def _check_grouped_output(
    W_O: np.ndarray, want: np.ndarray, name: str, fail: Callable[[str], InputFileError]
) -> None:
    """The stored W_O_grouped ``W_O`` equals ``want``, W_O's query-head columns summed."""
    if W_O.shape != want.shape:
        raise fail(f"{name} has shape {W_O.shape}, not {want.shape}")
    scale = max(float(np.max(np.abs(want), initial=0.0)), np.finfo(float).tiny)
    err = float(np.max(np.abs(W_O - want), initial=0.0)) / scale
    if err > 1e-12:
        raise fail(f"{name} differs from the sum of W_O's query-head columns by {err:.2e}")


def _check_shapes(
    mw: ModelWeights,
    F_shape: tuple[int, ...] | None,
    fail: Callable[[str], InputFileError],
    block_shapes: list[dict[str, tuple[int, ...]]],
) -> None:
    """Consistency of a read-back ModelWeights, so a damaged file fails here, not later.

    ``block_shapes``: per block, the (K/V expanded) shape of each field present."""
    if not block_shapes:
        raise fail("no blocks/")
    d, inner = mw.d_model, block_shapes[0]["W_V"][0]
    if F_shape is None and not mw.factored:
        raise fail("missing dataset F")
    if F_shape is not None and tuple(F_shape) != (len(mw.blocks), d, d):
        raise fail(f"F has shape {tuple(F_shape)}, expected ({len(mw.blocks)}, {d}, {d})")
    if inner % mw.n_heads:
        raise fail(f"W_V has {inner} rows, not a multiple of n_heads={mw.n_heads}")
    expect = {
        "W_Q": (inner, d),
        "W_K": (inner, d),
        "W_V": (inner, d),
        "W_O": (d, inner),
        "b_Q": (inner,),
        "b_K": (inner,),
        "b_V": (inner,),
        "b_O": (d,),
        "ln_weight": (d,),
        "ln_bias": (d,),
    }
    expect_optional = {"q_norm": (inner // mw.n_heads,), "k_norm": (inner // mw.n_heads,),
                       "post_norm": (d,)}  # fmt: skip
    for b, got in enumerate(block_shapes):
        for name, shape in expect.items():
            if tuple(got[name]) != shape:
                raise fail(f"blocks/{b}/{name} has shape {tuple(got[name])}, not {shape}")
        for name, shape in expect_optional.items():
            if name in got and tuple(got[name]) != shape:
                raise fail(f"blocks/{b}/{name} has shape {tuple(got[name])}, not {shape}")
    if mw.norm not in ("layernorm", "rmsnorm") or mw.residual not in ("sequential", "parallel"):
        raise fail(f"norm {mw.norm!r} / residual {mw.residual!r} not understood")
    kv = mw.n_kv_heads or mw.n_heads
    if kv < 1 or mw.n_heads % kv:
        raise fail(f"n_kv_heads {kv} does not divide n_heads {mw.n_heads}")
    if mw.rotary is not None:
        freq, scale = mw.rotary_inv_freq, mw.rotary_scaling
        assert freq is not None and scale is not None
        if mw.rotary not in ("half", "interleaved") or freq.ndim != 2:
            raise fail(f"rotary {mw.rotary!r} with inv_freq of shape {freq.shape}")
        if freq.shape[0] != mw.n_layers or 2 * freq.shape[1] > inner // mw.n_heads:
            raise fail(f"rotary/inv_freq {freq.shape} does not fit {mw.n_layers} layers")
        if scale.shape != (mw.n_layers,):
            raise fail(f"rotary/scaling has shape {scale.shape}, not ({mw.n_layers},)")
    lb = mw.layer_block
    if lb.shape != (mw.n_layers,) or (lb.size and (lb.min() < 0 or lb.max() >= len(mw.blocks))):
        raise fail(f"layer_block {lb.tolist()} inconsistent with {len(mw.blocks)} block(s)")
    if len(mw.layer_attention) != mw.n_layers:
        raise fail(f"layer_attention has {len(mw.layer_attention)} entries, not {mw.n_layers}")
