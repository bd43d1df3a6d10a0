"""A check shared by the I/O tests and the pipeline tests."""

import xarray as xr

from specalign import io


def assert_read_as_xarray_reads(path) -> None:
    """``io.read_netcdf`` gives what ``xr.open_dataset(engine="h5netcdf")`` gives: the
    same values, dtypes, coordinates, indexes and attributes (of the same Python types),
    in the same order."""
    ours = io.read_netcdf(path)
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        theirs = ds.load()
    xr.testing.assert_identical(ours, theirs)
    assert list(ours.variables) == list(theirs.variables)
    assert list(ours.coords) == list(theirs.coords)
    assert list(ours.xindexes) == list(theirs.xindexes)
    for name, var in theirs.variables.items():
        assert ours[name].dtype == var.dtype, name
        assert {k: type(v) for k, v in ours[name].attrs.items()} == {
            k: type(v) for k, v in var.attrs.items()
        }, name
    assert {k: type(v) for k, v in ours.attrs.items()} == {
        k: type(v) for k, v in theirs.attrs.items()
    }
