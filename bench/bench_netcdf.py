#!/usr/bin/env python
"""What writing a result file costs: ``specalign.io.write_netcdf`` (netCDF-C, xarray's
netcdf4 engine) against the h5netcdf engine it replaced, and against reading the file.

For each netCDF file given (files or folders searched for ``*.nc``; by default the
``results/`` folder of the working directory, e.g. after ``snakemake --cores 2``), the
Dataset is read once with ``io.read_netcdf`` and then, each best of ``--repeats`` after a
warm-up call:

* read: ``io.read_netcdf`` of the file;
* h5netcdf: ``Dataset.to_netcdf(engine="h5netcdf")`` with write_netcdf's encoding (the
  writer before issue 31's change);
* write_netcdf: the project's writer.

Each written file is read back and compared with the other engine's (``identical``).
Prints the times per file and in total, the ratio h5netcdf / write_netcdf, and the
ratio of writing to reading against the target (writing at most twice reading: most
workflow jobs read one or two files and write one, so a writer far above its reader is
the part of a job's time that is not the work).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_metrics import _timed  # noqa: E402

TARGET_WRITE_OVER_READ = 2.0


def measure(path: Path, repeats: int, scratch: Path) -> dict[str, Any]:
    import xarray as xr

    from specalign import io

    ds = io.read_netcdf(path)
    encoding = {
        name: {"fletcher32": True}
        for name, var in {**ds.data_vars, **ds.coords}.items()
        if var.ndim > 0 and var.size > 0 and var.dtype.kind in "biuf"
    }
    old, new = scratch / "h5netcdf.nc", scratch / "write_netcdf.nc"
    row = {
        "file": str(path),
        "variables": len(ds.variables),
        "read_s": _timed(lambda: io.read_netcdf(path), repeats),
        "h5netcdf_s": _timed(
            lambda: ds.to_netcdf(old, engine="h5netcdf", encoding=encoding), repeats
        ),
        "write_netcdf_s": _timed(lambda: io.write_netcdf(new, ds), repeats),
    }
    row["identical"] = io.read_netcdf(new).identical(io.read_netcdf(old))
    with xr.open_dataset(new, engine="h5netcdf") as a, xr.open_dataset(old, engine="h5netcdf") as b:
        row["identical"] &= a.load().identical(b.load())
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, default=[Path("results")])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    files = sorted(f for p in args.paths for f in ([p] if p.is_file() else p.rglob("*.nc")))
    if not files:
        print(f"no netCDF files under {', '.join(map(str, args.paths))}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as scratch:
        rows = [measure(f, args.repeats, Path(scratch)) for f in files]
    print(f"{'file':60} {'vars':>4} {'read':>7} {'h5netcdf':>9} {'ours':>7}  same")
    for r in rows:
        name = r["file"][-60:]
        print(f"{name:60} {r['variables']:4d} {r['read_s']:7.3f} {r['h5netcdf_s']:9.3f} "
              f"{r['write_netcdf_s']:7.3f}  {r['identical']}")  # fmt: skip
    total = {k: sum(r[k] for r in rows) for k in ("read_s", "h5netcdf_s", "write_netcdf_s")}
    over_read = total["write_netcdf_s"] / total["read_s"]
    print(f"{len(rows)} files: read {total['read_s']:.2f} s, h5netcdf {total['h5netcdf_s']:.2f} s, "
          f"write_netcdf {total['write_netcdf_s']:.2f} s; h5netcdf / write_netcdf "
          f"{total['h5netcdf_s'] / total['write_netcdf_s']:.1f}x; write_netcdf / read "
          f"{over_read:.2f}x (target <= {TARGET_WRITE_OVER_READ}: "
          f"{'met' if over_read <= TARGET_WRITE_OVER_READ else 'NOT MET'}); "
          f"every pair read back identical: {all(r['identical'] for r in rows)}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "total": total}, indent=1))
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
