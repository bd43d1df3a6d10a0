"""A pipeline run's files explain themselves and count layers one way (issue 17)."""

from __future__ import annotations

import h5py
import numpy as np
import pandas as pd
import pytest
import xarray as xr
import yaml

from specalign.transformers.variables import CONVENTIONS, undescribed

pytestmark = pytest.mark.pipeline


def test_every_file_the_run_wrote_is_a_declared_output(repo, finished_run):
    """A table format a script writes but its rule does not declare (layers.html was
    one) is never rerun, never in the report, and every later run names it as another
    configuration's file."""
    from snakemake_helpers import undeclared_results

    assert undeclared_results(repo, finished_run) == []


def test_every_netcdf_variable_has_a_description(finished_run):
    """Every variable, coordinates included, of every netCDF file the run wrote."""
    files = sorted((finished_run / "results").rglob("*.nc"))
    kinds = {p.name for p in files}
    assert {"diagnostics.nc", "spectra.nc", "propagation.nc", "steering.nc", "sphere.nc"} <= kinds
    for path in files:
        with xr.open_dataset(path) as ds:
            assert undescribed(ds) == [], path
            if path.parent.parent.name == "transformers" and path.name != "sphere.nc":
                assert {k: ds.attrs.get(k) for k in CONVENTIONS} == CONVENTIONS, path


def test_every_netcdf_file_reads_as_xarray_reads_it(finished_run):
    """specalign.io.read_netcdf, which every table, figure and report job uses, reads
    each file the run wrote as xarray's h5netcdf backend does."""
    from reading import assert_read_as_xarray_reads

    # one file of each kind (each model's files hold the same variables)
    files = list({p.name: p for p in sorted((finished_run / "results").rglob("*.nc"))}.values())
    assert len(files) >= 5
    for path in files:
        assert_read_as_xarray_reads(path)


def test_every_pair_of_a_models_files_lines_up_on_layer(finished_run):
    """spectra.nc, propagation.nc, steering.nc, eigenvalues.csv and propagation.csv of
    each model merged pairwise on ``layer``: the same layers 1..L, each with the block
    weights.h5 maps it to, and equal values where two files hold the same quantity."""
    from layer_views import check_layers_line_up, layer_views

    cfg = yaml.safe_load((finished_run / "config.yaml").read_text())
    results = finished_run / "results"
    for model in cfg["transformers"]["models"]:
        with h5py.File(results / "transformers" / model / "weights.h5") as f:
            layer_block = f["layer_block"][()]
        opened = {
            name: xr.load_dataset(results / "transformers" / model / f"{name}.nc")
            for name in ("spectra", "propagation", "steering")
        }
        tables = {
            name: pd.read_csv(results / "tables" / "transformers" / model / f"{name}.csv")
            for name in ("eigenvalues", "propagation")
        }
        views = layer_views(opened["spectra"], opened["propagation"], opened["steering"], tables)
        assert check_layers_line_up(views, layer_block, len(layer_block)) == 10
        assert np.array_equal(opened["spectra"]["layer"], np.arange(1, len(layer_block) + 1))
