"""Commutator diagnostics of every stored checkpoint of one ensemble."""

from specalign.commutators import contracts
from specalign.commutators.measure import diagnostics
from specalign.io import write_netcdf
from specalign.workflow import log, param_json, run_script


def main(smk):
    settings = param_json(smk, "diagnostics")
    traj = contracts.read_trajectories(smk.input[0])
    # before any work: the ensemble must be the one the configuration asks for
    contracts.check_trajectories_config(traj, param_json(smk, "experiment"))
    ds = diagnostics.diagnostics_dataset(traj, settings, progress=log.info)
    log.info(
        "max residuals: recursion %.3e, transport %.3e over %d evaluations",
        float(ds["res_recursion"].max()),
        float(ds["res_transport"].max()),
        int(ds["res_recursion"].count()),
    )
    write_netcdf(smk.output[0], ds)


run_script(snakemake, main)  # noqa: F821
