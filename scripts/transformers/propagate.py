"""Token propagation through the simplified and the real model, with null levels."""

from specalign.io import DiskStack, read_netcdf, write_netcdf
from specalign.runtime import torch_device
from specalign.transformers import lineage
from specalign.transformers.load import contracts, hf
from specalign.transformers.measure import propagate, spectra
from specalign.workflow import LogProgress, log, param_json, run_script


def nonfinite_hint(first_nonfinite, model_dir):
    """Where the token states first stop being finite, for the error message when every
    metric is NaN."""
    for mode, t in first_nonfinite.items():
        where = "the embedding output" if t == 0 else f"layer {t}"
        return (
            f"the {mode} token states are not finite from {where} on; fix: check "
            f"the embeddings and weights of {model_dir} for NaN or inf"
        )
    return f"every token state is finite: check the weights of {model_dir}"


def main(smk):
    settings = param_json(smk, "settings")
    manifest = contracts.read_manifest(smk.input.manifest)
    model_dir = manifest["path"]
    # before any work: weights.h5 and spectra.nc must be this model's
    lineage.check_model(smk.input.weights, smk.input.manifest, manifest)
    spectra_ds = read_netcdf(smk.input.spectra)
    lineage.check_model(smk.input.spectra, smk.input.manifest, manifest, spectra_ds.attrs)
    device = torch_device(smk.resources.get("gpu", 0))
    ids = hf.prompt_ids(model_dir, settings["prompts"])
    asked = int(settings["prompts"]["n_prompts"])
    log.info("%d prompts of %d tokens on %s", *ids.shape, device)
    if ids.shape[0] < asked:
        log.warning(
            "only %d of the %d prompts asked for (transformers.prompts.n_prompts) are usable "
            "(text lines with at least n_tokens = %d tokens)",
            ids.shape[0],
            asked,
            ids.shape[1],
        )
    cfg = settings["propagation"]
    # the real model first, its states kept in a temporary file as its layers produce
    # them (never all in memory beside the streamed layer); the model is freed before
    # the float64 weights are read
    with DiskStack() as hidden:
        hf.streamed_states(
            model_dir, ids, hidden, device=device, dtype=hf.torch_dtype(cfg["real_dtype"])
        )
        # a block at a time: each simplified run reads the blocks as it reaches them
        mw = contracts.read_weights_h5(smk.input.weights, lazy=True)
        directions = spectra.block_directions(spectra_ds, smk.input.spectra)
        # each state is reduced to its metrics as it is computed: the runs are never held
        run = propagate.propagation_run(
            mw,
            hidden,
            settings["eta"],
            cfg,
            seed=int(settings["prompts"]["seed"]),
            directions=directions,
            progress=LogProgress(1, "simplified runs' states", every=0.1),
            threads=smk.threads,
        )
    for mode, n in run.layers.items():
        log.info("mode %s: %d layers", mode, n)
    ds = run.dataset
    ds.attrs.update(
        model=smk.wildcards.model,
        eta=float(settings["eta"]),
        prompts_requested=asked,
        prompts_used=int(ids.shape[0]),
        **lineage.result_attrs(smk.input.manifest, manifest, settings=settings),
    )
    write_netcdf(
        smk.output[0],
        ds,
        headline=("gamma", "psi", "rho"),
        hint=nonfinite_hint(run.first_nonfinite, model_dir),
    )


run_script(snakemake, main)  # noqa: F821
