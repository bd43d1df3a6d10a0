#!/usr/bin/env python
"""What propagate's per-state metrics cost, as matrix products and as the reductions
they replaced.

Per state and correlation, ``MetricsStream.add`` dots 19 directions (v1, v_neg, the null
draws and v2) with the unit rows of the layer's input and output states and projects the
state on the top-2 basis. Until issue 33 each direction was an ``np.einsum`` reduction
(20-45x below the GEMM rate); now they are one matrix product per state, and the
projection two. This benchmark measures both forms in one run, on random states and
directions of the given width (100 prompts of 10 tokens and 16 null draws, as
config/paper.yaml):

* ``add``: ``MetricsStream.add`` per state, both correlations, as ``propagate`` calls it
  (the product form);
* ``align``: one correlation's 18 alignments as the einsum reductions computed them,
  and as the two GEMMs of the stream;
* ``projection``: the top-2 projection as two einsums and as two GEMMs;
* the largest difference between the two forms, and how many psi signs differ;
* the float64 GEMM rate, and the ideal time of these parts' flops at that rate.

Prints, per width, the measured time of ``add`` and the time it would take with the
einsum forms (``add`` plus the difference of the parts, both correlations: a difference
of best-of-``repeats`` times), and each part's ratio to its ideal.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

N_DIRECTIONS_FIXED = 2  # v1 and v_neg beside the null draws


def _timed(fn: Any, repeats: int) -> float:
    """Best wall time of ``repeats`` calls, after one warm-up call."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _align_einsum(Su: tuple[np.ndarray, np.ndarray], Mu: tuple[np.ndarray, np.ndarray],
                  v: np.ndarray) -> dict[str, np.ndarray]:  # fmt: skip
    """gamma and psi against one direction v (d,) as the reductions before issue 33."""
    after = np.abs(np.einsum("pnd,d->pn", Su[1], v))
    before = np.abs(np.einsum("pnd,d->pn", Su[0], v))
    m_after = np.abs(np.einsum("pd,d->p", Mu[1], v))
    m_before = np.abs(np.einsum("pd,d->p", Mu[0], v))
    return {"gamma": after.reshape(-1), "psi": (after - before).reshape(-1),
            "gamma_mean": m_after, "psi_mean": m_after - m_before}  # fmt: skip


def _align_gemm(Su: tuple[np.ndarray, np.ndarray], Mu: tuple[np.ndarray, np.ndarray],
                dirs: np.ndarray) -> dict[str, np.ndarray]:  # fmt: skip
    """gamma and psi as the stream computes them, for all ``dirs`` (k, d) at once, by GEMM:
    (k, P * N) arrays, directions first as the per-direction calls stack them."""
    d = dirs.shape[1]
    after = np.abs(Su[1].reshape(-1, d) @ dirs.T).T
    before = np.abs(Su[0].reshape(-1, d) @ dirs.T).T
    m_after = np.abs(Mu[1].reshape(-1, d) @ dirs.T).T
    m_before = np.abs(Mu[0].reshape(-1, d) @ dirs.T).T
    return {"gamma": after, "psi": after - before, "gamma_mean": m_after,
            "psi_mean": m_after - m_before}  # fmt: skip


def measure(
    d: int, prompts: int, tokens: int, null_draws: int, repeats: int, threads: int
) -> dict:
    from bench_paper_scale import gemm_rate

    from specalign.transformers.measure import metrics as M

    rng = np.random.default_rng(1)
    P, N, L = prompts, tokens, 2
    k = N_DIRECTIONS_FIXED + null_draws

    def unit(x: np.ndarray) -> np.ndarray:
        return x / np.linalg.norm(x)

    blocks = []
    for _ in range(L):
        basis = np.linalg.qr(rng.standard_normal((d, 3)))[0]
        v1, v2, v_neg = (unit(rng.standard_normal(d)) for _ in range(3))
        blocks.append(
            dict(v1=v1, v2=v2, v_neg=v_neg, lambda_v1=1.0, lambda_v2=0.5, lambda_neg=-0.5,
                 lambda1_is_complex=False, top2_basis=basis)
        )  # fmt: skip
    mw = SimpleNamespace(d_model=d, n_layers=L, layer_block=np.arange(L),
                         layer_attention=None, blocks=[None] * L)  # fmt: skip
    states = rng.standard_normal((L + 1, P, N, d))

    def stream_pass() -> None:
        stream = M.MetricsStream(mw, {"real_model": L}, P, N, corrs=("cosine", "pearson"),
                                 n_null_draws=null_draws, seed=0, directions=blocks)  # fmt: skip
        for X in states:
            stream.add("real_model", X)

    add = _timed(stream_pass, repeats) / (L + 1)

    # one layer of one correlation, as MetricsStream._layer computes it
    corr = "cosine"
    Su = tuple(M._unit_rows(s[None], corr) for s in states[:2])
    Mu = tuple(M._unit_rows(s[None].mean(axis=2), corr) for s in states[:2])
    dirs = M._unit_rows(np.vstack([blocks[0]["v1"], blocks[0]["v_neg"],
                                   rng.standard_normal((null_draws, d))]), corr)  # fmt: skip

    def align_einsum() -> list[dict[str, np.ndarray]]:
        pair_s, pair_m = (Su[0][0], Su[1][0]), (Mu[0][0], Mu[1][0])
        return [_align_einsum(pair_s, pair_m, dirs[j]) for j in range(k)]

    def align_gemm() -> dict[str, np.ndarray]:
        return _align_gemm((Su[0][0], Su[1][0]), (Mu[0][0], Mu[1][0]), dirs)

    ein, gem = align_einsum(), align_gemm()
    gamma_e = np.vstack([r["gamma"] for r in ein])
    psi_e = np.vstack([r["psi"] for r in ein])
    gamma_diff = float(np.abs(gamma_e - gem["gamma"]).max())
    psi_flips = int((np.sign(psi_e) != np.sign(gem["psi"])).sum())
    t_align_e, t_align_g = _timed(align_einsum, repeats), _timed(align_gemm, repeats)

    basis, S = blocks[0]["top2_basis"], states[1]

    def projection_einsum() -> np.ndarray:
        return np.einsum("dk,pnk->pnd", basis, np.einsum("dk,pnd->pnk", basis, S))

    def projection_gemm() -> np.ndarray:
        return ((S.reshape(-1, d) @ basis) @ basis.T).reshape(S.shape)

    pe, pg = projection_einsum(), projection_gemm()
    proj_diff = float(np.abs(pe - pg).max() / np.abs(pe).max())
    t_proj_e, t_proj_g = _timed(projection_einsum, repeats), _timed(projection_gemm, repeats)

    rate = gemm_rate(threads)["wall"]
    rows = P * N + P  # tokens and mean tokens
    align_flops = 2.0 * 2 * rows * d * k  # before and after, 2 flops per multiply-add
    proj_flops = 2.0 * 2 * P * N * d * 3
    # the stream pays both per correlation; its other work (norms, unit rows, the token
    # distance, the projection's correlation) is left as measured
    add_einsum = add + 2 * ((t_align_e - t_align_g) + (t_proj_e - t_proj_g))
    return {
        "d": d, "prompts": P, "tokens": N, "directions": k,
        "gemm_float64": rate,
        "add_s": add, "add_with_einsum_s": add_einsum,
        "align_einsum_s": t_align_e, "align_gemm_s": t_align_g,
        "align_ideal_s": align_flops / rate,
        "projection_einsum_s": t_proj_e, "projection_gemm_s": t_proj_g,
        "projection_ideal_s": proj_flops / rate,
        "gamma_max_abs_diff": gamma_diff, "psi_sign_flips": psi_flips,
        "psi_values": int(psi_e.size), "projection_max_rel_diff": proj_diff,
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--d", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--prompts", type=int, default=100)
    parser.add_argument("--tokens", type=int, default=10)
    parser.add_argument("--null-draws", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads (pinned)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="d 1024 only, one repeat")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from specalign.runtime import pin_threads

    pin_threads(args.threads)
    widths = [1024] if args.quick else args.d
    repeats = 1 if args.quick else args.repeats
    results = [
        measure(d, args.prompts, args.tokens, args.null_draws, repeats, args.threads)
        for d in widths
    ]
    print(f"threads {args.threads}; {args.prompts} prompts x {args.tokens} tokens, "
          f"{args.null_draws} null draws")  # fmt: skip
    for r in results:
        ms = {k: v * 1e3 for k, v in r.items() if k.endswith("_s")}
        print(f"d {r['d']} (float64 GEMM {r['gemm_float64'] / 1e9:.1f} GFLOP/s):")
        print(f"  MetricsStream.add, both correlations: {ms['add_s']:.1f} ms per state; "
              f"with the einsum forms about {ms['add_with_einsum_s']:.1f} ms "
              f"({r['add_with_einsum_s'] / r['add_s']:.2f}x slower)")  # fmt: skip
        for part in ("align", "projection"):
            e, g, ideal = ms[f"{part}_einsum_s"], ms[f"{part}_gemm_s"], ms[f"{part}_ideal_s"]
            print(f"  {part} (one correlation): einsum {e:.1f} ms ({e / ideal:.0f}x its "
                  f"ideal {ideal:.2f} ms), GEMM {g:.1f} ms ({g / ideal:.1f}x)")  # fmt: skip
        print(f"  GEMM against einsum: gamma max |diff| {r['gamma_max_abs_diff']:.1e}, "
              f"{r['psi_sign_flips']} of {r['psi_values']} psi signs differ; projection "
              f"max relative diff {r['projection_max_rel_diff']:.1e}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"threads": args.threads, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
