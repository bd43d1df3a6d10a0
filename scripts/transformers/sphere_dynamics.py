"""The supplement's self-attention dynamics on the sphere (Figures 13, 14) and Jacobians."""

from specalign.io import write_netcdf
from specalign.transformers.measure import sphere
from specalign.workflow import log, param_json, run_script


def main(smk):
    ds = sphere.sphere_dataset(param_json(smk, "settings"))
    log.info(
        "Jacobian |numeric - closed form| max per consensus point: %s",
        ds["jacobian_max_abs_diff"].values,
    )
    log.info(
        "convergence rate measured %.4f, predicted %.4f",
        ds.attrs["rate_measured"],
        ds.attrs["rate_predicted"],
    )
    write_netcdf(smk.output[0], ds)


run_script(snakemake, main)  # noqa: F821
