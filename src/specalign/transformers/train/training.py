"""Small transformers trained here, offline: the checkpoint series of issue 15.

The paper (Li & Altafini, arXiv:2605.25619, Section 4) compares ALBERT, whose layers
share one set of weights so that depth is literally repeated power-method steps, with
BERT; the two differ in far more than sharing. Here three families are trained from one
configuration on one corpus with one seed:

* ``albert``: an ALBERT encoder with every layer's weights shared (one hidden group,
  embedding size = hidden size), masked-LM objective;
* ``bert``: a BERT encoder of the same width, depth, heads and FFN without sharing,
  masked-LM objective (what is left different: ALBERT's embedding-to-hidden linear map,
  which at embedding size = hidden size is one extra d x d matrix, and its MLM head's
  extra dense layer; both are outside the blocks whose spectra the study reads);
* ``gpt2``: a GPT-2 decoder, causal-LM objective.

Corpus: the Python standard library's ``pydoc_data.topics`` (the text of ``help()``'s
topics, 79 documents, about 465 k characters). It ships with every CPython, so the run
needs no download and no extra package, it is English prose with code, large enough for
a tokenizer of a few thousand pieces and a tiny model to learn visibly, and small enough
to train on in minutes on two cores. A UTF-8 text file (documents separated by blank
lines) can be given instead.

Everything is deterministic: documents are split into train and held-out by a seeded
permutation (the held-out part is fixed by ``split_seed``), the tokenizer is trained on
the training documents only, the batches and masks are drawn from generators seeded by
``seed``, and torch runs its deterministic algorithms. Checkpoints at ``step`` 0 (the
initialisation) and at log-spaced steps (:func:`checkpoint_steps`) are written in the
``save_pretrained`` layout (safetensors, config.json, tokenizer files).

That the result is a trained model and not noise is measured, not assumed: the held-out
loss (nats per predicted token, at tokens the model cannot see: a masked-LM's held-out
targets are all [MASK], :func:`mlm_mask`) is set beside the unigram entropy of the
held-out tokens, ``H = -sum_t p(t) log p(t)`` over the held-out token frequencies,
the cross-entropy of the best context-free predictor of exactly those tokens. A loss
well below H means the model uses context. A run whose loss turns NaN or infinite stops
there: the step is recorded (``diverged_step``) and no later checkpoint is written.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specalign.config import read_text_setting
from specalign.io import OWNER_MARKER, is_owned, mark_owned, new_partial, swap_folder

#: Families that can be trained, with their objective.
FAMILIES = {"albert": "masked_lm", "bert": "masked_lm", "gpt2": "causal_lm"}
#: Special tokens of the encoders' word-level tokenizer (BERT's names and order).
ENCODER_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
#: GPT-2's single special token (beginning/end of text, also the padding id).
DECODER_SPECIAL = "<|endoftext|>"
#: A run counts as trained when its final held-out loss is at most this fraction of the
#: held-out unigram entropy (20 % below the best context-free predictor).
WELL_BELOW = 0.8
#: Whether deterministic mode fills new tensors with NaN during training (see train_run).
_FILL_NEW_TENSORS = False


class TrainingError(ValueError):
    """A training run cannot be set up (corpus, tokenizer, sizes); the message names the key."""


class VocabularyError(TrainingError):
    """``vocab_size`` is more than the tokenizer learns from the corpus (``limit``)."""

    def __init__(self, vocab_size: int, limit: int, what: str = "") -> None:
        self.limit = limit
        super().__init__(
            f"vocab_size: {vocab_size}, but the corpus yields only {limit} pieces{what}; "
            f"fix: vocab_size <= {limit}"
        )


# --------------------------------------------------------------------------- corpus


def corpus_documents(corpus: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The corpus as ``(name, text)`` of its non-empty documents, in a fixed order.

    ``pydoc_topics``: the standard library's help topics, sorted by topic name (the text
    differs between Python versions: :func:`corpus_identity`); ``shakespeare``: the 38
    plays shipped with specalign (:mod:`specalign.transformers.train.corpora`), one play a
    document; ``file``: a UTF-8 text file split at blank lines.
    """
    kind = corpus.get("kind", "pydoc_topics")
    if kind == "pydoc_topics":
        from pydoc_data.topics import topics

        docs = [(k, topics[k]) for k in sorted(topics)]
    elif kind == "shakespeare":
        from specalign.transformers.train.corpora import CorpusError, shakespeare_plays

        try:
            docs = shakespeare_plays()
        except CorpusError as exc:
            raise TrainingError(str(exc)) from None
    elif kind == "file":
        path = Path(str(corpus.get("path") or ""))
        given = corpus.get("path")
        text, problem = read_text_setting(path) if given else (None, "is not given")
        if problem:
            raise TrainingError(f"corpus.path: {str(given)!r} {problem}")
        if not text.strip():
            raise TrainingError(f"corpus.path: {str(given)!r} is empty")
        # line ends as text mode reads them (CRLF and CR as LF): the documents, and so the
        # corpus' digest and the trained weights, do not depend on the file's line ends
        text = text.replace("\r\n", "\n").replace("\r", "\n")
        parts = re.split(r"\n\s*\n", text)
        docs = [(f"paragraph {i + 1}", d) for i, d in enumerate(p for p in parts if p.strip())]
    else:
        raise TrainingError(
            f"corpus.kind: unknown kind {kind!r} (pydoc_topics, shakespeare or file)"
        )
    docs = [(name, d.strip()) for name, d in docs if d.strip()]
    if not docs:
        raise TrainingError(f"corpus: the {kind} corpus is empty")
    return docs


def documents_sha256(docs: Sequence[str]) -> str:
    """sha256 of the documents' UTF-8 bytes, a NUL between two (:func:`corpus_identity`)."""
    return hashlib.sha256("\0".join(docs).encode("utf-8")).hexdigest()


def load_corpus(corpus: Mapping[str, Any]) -> list[str]:
    """The texts of :func:`corpus_documents`."""
    return [text for _, text in corpus_documents(corpus)]


def corpus_identity(corpus: Mapping[str, Any]) -> dict[str, Any]:
    """What the training reads, by content: the sha256 of the documents (each one's UTF-8
    bytes, a NUL between two), their number and characters. It enters the training
    rule's parameters and ``run.nc``, so that a corpus that changes (the pydoc topics
    differ between Python versions: 458,917 characters in 3.10.13, 464,970 in 3.11.7)
    retrains rather than mixing checkpoints of two texts. Computed once per process for
    each corpus (a corpus file: each version of it): validation and every training job
    of a ``snakemake`` call ask for it."""
    kind, path = corpus.get("kind", "pydoc_topics"), corpus.get("path")
    version = None
    if kind == "file" and path and Path(str(path)).is_file():
        st = Path(str(path)).stat()
        version = (st.st_mtime_ns, st.st_size)
    key = (kind, str(path), version)
    if key not in _IDENTITIES:
        docs = load_corpus(corpus)
        _IDENTITIES[key] = {
            "sha256": documents_sha256(docs),
            "documents": len(docs),
            "characters": sum(len(d) for d in docs),
        }
    return dict(_IDENTITIES[key])


_IDENTITIES: dict[tuple, dict[str, Any]] = {}


def vocabulary_limit(train_docs: Sequence[str], family: str, vocab_size: int) -> int | None:
    """None when the tokenizer of ``family`` learns ``vocab_size`` pieces from
    ``train_docs``, else the most it can learn: the word-level vocabulary's distinct
    words and specials for the encoders, the pieces byte-level BPE ends with for GPT-2.
    It trains that tokenizer, so it is the check :func:`train_tokenizer` makes."""
    try:
        train_tokenizer(train_docs, family, vocab_size)
    except VocabularyError as exc:
        return exc.limit
    return None


def split_documents(
    docs: Sequence[str], heldout_fraction: float, split_seed: int
) -> tuple[list[str], list[str]]:
    """Fixed train / held-out split by whole documents (:func:`heldout_indices`)."""
    held = set(heldout_indices([len(d) for d in docs], heldout_fraction, split_seed))
    train = [d for i, d in enumerate(docs) if i not in held]
    return train, [docs[i] for i in sorted(held)]


def heldout_indices(lengths: Sequence[int], heldout_fraction: float, split_seed: int) -> list[int]:
    """The held-out documents, sorted: documents in a permutation seeded by
    ``split_seed`` are held out until they hold ``heldout_fraction`` of the characters.
    At least one document on each side."""
    if len(lengths) < 2:
        raise TrainingError("corpus: at least two documents are needed for a held-out split")
    order = np.random.default_rng(split_seed).permutation(len(lengths))
    total = sum(lengths)
    held: list[int] = []
    size = 0
    for i in order[:-1]:
        if size >= heldout_fraction * total:
            break
        held.append(int(i))
        size += lengths[i]
    return sorted(held)


# --------------------------------------------------------------------------- tokenizer


def train_tokenizer(docs: Sequence[str], family: str, vocab_size: int) -> Any:
    """A ``tokenizers`` tokenizer trained on ``docs``: a word-level vocabulary of the most
    frequent words with BERT's normalisation and specials for the encoders, byte-level
    BPE for GPT-2.

    Raises TrainingError when the corpus cannot fill ``vocab_size`` pieces.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from tokenizers.processors import TemplateProcessing

    if FAMILIES[family] == "masked_lm":
        # A word-level vocabulary counted here, ties broken by the word itself: the
        # tokenizers trainers (WordPiece, BPE) number and even choose pieces of equal
        # frequency in hash order, which differs from process to process, and a run must
        # be reproducible bit for bit. Words outside the vocabulary become [UNK].
        norm = normalizers.BertNormalizer(lowercase=True)
        pre = pre_tokenizers.BertPreTokenizer()
        counts: dict[str, int] = {}
        for d in docs:
            for word, _ in pre.pre_tokenize_str(norm.normalize_str(d)):
                counts[word] = counts.get(word, 0) + 1
        n_words = vocab_size - len(ENCODER_SPECIALS)
        if len(counts) < n_words:
            raise VocabularyError(
                vocab_size,
                len(counts) + len(ENCODER_SPECIALS),
                f" ({len(counts)} distinct words and {len(ENCODER_SPECIALS)} special tokens)",
            )
        words = sorted(counts, key=lambda w: (-counts[w], w))[:n_words]
        vocab = {t: i for i, t in enumerate([*ENCODER_SPECIALS, *words])}
        tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
        tok.normalizer = norm
        tok.pre_tokenizer = pre
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        tok.post_processor = TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
        )
    else:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[DECODER_SPECIAL],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(list(docs), trainer=trainer)
    if tok.get_vocab_size() < vocab_size:
        raise VocabularyError(vocab_size, tok.get_vocab_size())
    return tok


def hf_tokenizer(tok: Any, family: str) -> Any:
    """The ``transformers`` fast tokenizer wrapping ``tok`` (saved beside the weights)."""
    from transformers import PreTrainedTokenizerFast

    if FAMILIES[family] == "masked_lm":
        return PreTrainedTokenizerFast(
            tokenizer_object=tok,
            unk_token="[UNK]",
            pad_token="[PAD]",
            cls_token="[CLS]",
            sep_token="[SEP]",
            mask_token="[MASK]",
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=DECODER_SPECIAL,
        eos_token=DECODER_SPECIAL,
        unk_token=DECODER_SPECIAL,
        pad_token=DECODER_SPECIAL,
    )


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Blocks:
    """Token blocks of one split: ``ids`` (n, seq_len) int64 and ``special`` (n,
    seq_len) bool marking positions that are never targets."""

    ids: np.ndarray
    special: np.ndarray


def make_blocks(tok: Any, docs: Sequence[str], family: str, seq_len: int) -> Blocks:
    """Documents tokenized, joined by a separator and cut into blocks of ``seq_len``:
    ``[CLS] t ... t [SEP]`` for the encoders, plain token runs for GPT-2. The tail that
    does not fill a block is dropped."""
    if FAMILIES[family] == "masked_lm":
        sep, cls = tok.token_to_id("[SEP]"), tok.token_to_id("[CLS]")
        stream: list[int] = []
        for d in docs:
            stream += tok.encode(d, add_special_tokens=False).ids + [sep]
        body = seq_len - 2
        n = len(stream) // body
        arr = np.asarray(stream[: n * body], dtype=np.int64).reshape(n, body)
        ids = np.concatenate([np.full((n, 1), cls), arr, np.full((n, 1), sep)], axis=1).astype(
            np.int64
        )
        specials = {tok.token_to_id(s) for s in ENCODER_SPECIALS} - {tok.token_to_id("[UNK]")}
    else:
        eot = tok.token_to_id(DECODER_SPECIAL)
        stream = []
        for d in docs:
            stream += tok.encode(d).ids + [eot]
        n = len(stream) // seq_len
        ids = np.asarray(stream[: n * seq_len], dtype=np.int64).reshape(n, seq_len)
        specials = set()
    special = np.isin(ids, sorted(specials)) if specials else np.zeros(ids.shape, dtype=bool)
    return Blocks(ids=ids, special=special)


def unigram_entropy(ids: np.ndarray, exclude: np.ndarray | None = None) -> float:
    """``-sum p log p`` (nats) of the token frequencies in ``ids`` (positions where
    ``exclude`` is True left out): the loss of the best context-free predictor."""
    flat = ids[~exclude] if exclude is not None else ids.ravel()
    _, counts = np.unique(flat, return_counts=True)
    p = counts / counts.sum()
    return float(-(p * np.log(p)).sum())


def mlm_mask(
    blocks: Blocks,
    rows: np.ndarray,
    mask_prob: float,
    mask_id: int,
    vocab: int,
    gen: Any,
    hide_all: bool = False,
) -> tuple[Any, Any]:
    """BERT's masking of the blocks ``rows``: each non-special position is a target with
    probability ``mask_prob`` (at least one per block); of the targets 80 % become
    [MASK], 10 % a random token, 10 % stay. Returns (input_ids, labels with -100 off
    target), torch tensors, drawn from the torch generator ``gen``.

    ``hide_all``: every target becomes [MASK] (the same targets, the same draws): the
    held-out measure, on tokens the model cannot see. Under BERT's 80/10/10 a tenth of
    the targets stay in the input, and predicting a token that is in view is copying,
    not use of context: on the shipped plays that tenth alone took the encoders' held-out
    loss from 5.60 to 5.26 nats in 256 steps while their loss at hidden tokens did not
    move (5.60)."""
    import torch

    ids = torch.from_numpy(blocks.ids[rows]).clone()
    special = torch.from_numpy(blocks.special[rows])
    u = torch.rand(ids.shape, generator=gen, dtype=torch.float64)
    u[special] = 2.0
    target = u < mask_prob
    first = torch.argmin(u, dim=1)  # the smallest draw: always a non-special position
    target[torch.arange(ids.shape[0]), first] = True
    labels = torch.where(target, ids, torch.full_like(ids, -100))
    kind = torch.rand(ids.shape, generator=gen, dtype=torch.float64)
    rand_tok = torch.randint(0, vocab, ids.shape, generator=gen)
    if hide_all:
        return torch.where(target, torch.full_like(ids, mask_id), ids), labels
    ids = torch.where(target & (kind < 0.8), torch.full_like(ids, mask_id), ids)
    ids = torch.where(target & (kind >= 0.8) & (kind < 0.9), rand_tok, ids)
    return ids, labels


# --------------------------------------------------------------------------- models


def checkpoint_steps(steps: int) -> list[int]:
    """The steps a run saves: 0 (the initialisation), the powers of two below ``steps``,
    and ``steps`` itself."""
    out = {0, int(steps)}
    k = 1
    while k < steps:
        out.add(k)
        k *= 2
    return sorted(out)


def step_flops(run: Mapping[str, Any], vocab_size: int) -> float:
    """FLOPs of one optimiser step by the compute model (forward and backward, 3x the
    forward's multiply-adds x 2):
    ``3 B T [L (8 d^2 + 4 d d_ff + 4 T d) + 2 d V f + 2 d^2]``, B the batch, T the block,
    L the layers, d the width, V the vocabulary, f the share of positions the vocabulary
    head runs at (the masked-LM's ``mask_prob``, :func:`masked_logits`; 1 for causal-LM).
    Shared weights (ALBERT) change the parameters, not the FLOPs."""
    B, T, L = run["batch_size"], run["seq_len"], run["n_layers"]
    d, d_ff = run["d_model"], run["d_ff"]
    f = 1.0 if FAMILIES[run["family"]] == "causal_lm" else float(run["mask_prob"])
    per_token = L * (8 * d * d + 4 * d * d_ff + 4 * T * d) + 2 * d * vocab_size * f + 2 * d * d
    return 3.0 * B * T * per_token


def projected_seconds(
    runs: Mapping[str, Mapping[str, Any]], measured: Mapping[str, Any], cores: int = 2
) -> dict[str, float]:
    """The wall time a configuration's series take on ``cores`` cores, projected from
    ``measured`` (bench/training_projection.json, bench/bench_training.py): each run's
    steps at its family's measured fraction of the GEMM rate (so that a changed width or
    step count is projected, not only the measured settings), the runs side by side on
    the cores, then every point's analysis at its measured CPU seconds. Also the passes
    each run makes over its training tokens."""
    out: dict[str, float] = {}
    train = []
    for name, run in runs.items():
        fam = measured["families"][run["family"]]
        rate = measured["gemm_gflops"][str(int(run["threads"]))] * 1e9
        seconds = (
            run["steps"]
            * step_flops(run, fam["vocab_size"])
            / (fam["fraction_of_gemm_rate"] * rate)
        )
        train.append((seconds, int(run["threads"])))
        out[f"passes:{name}"] = (
            run["steps"] * run["batch_size"] * run["seq_len"] / fam["train_tokens"]
        )
    out["training"] = max(max(s for s, _ in train), sum(s * t for s, t in train) / cores)
    points = sum(len(run.get("points") or checkpoint_steps(run["steps"])) for run in runs.values())
    per_point = measured["analysis"]["cpu_seconds"] / measured["analysis"]["points"]
    out["analysis"] = points * per_point / cores
    out["total"] = out["training"] + out["analysis"]
    return out


def model_config(run: Mapping[str, Any], vocab_size: int, special_ids: Mapping[str, int]) -> Any:
    """The ``transformers`` configuration of a run: the same width, depth, heads, FFN,
    positions and (zero by default) dropout for every family."""
    from transformers import AlbertConfig, BertConfig, GPT2Config

    fam = run["family"]
    drop = float(run["dropout"])
    # the shape, in the names every family's config reads (GPT2Config maps hidden_size,
    # num_hidden_layers, num_attention_heads and max_position_embeddings to its n_* keys)
    shape = dict(
        vocab_size=vocab_size,
        hidden_size=run["d_model"],
        num_hidden_layers=run["n_layers"],
        num_attention_heads=run["n_heads"],
        max_position_embeddings=run["seq_len"],
    )
    if fam == "gpt2":
        return GPT2Config(
            **shape,
            n_inner=run["d_ff"],
            activation_function="gelu",
            resid_pdrop=drop,
            embd_pdrop=drop,
            attn_pdrop=drop,
            bos_token_id=special_ids["eot"],
            eos_token_id=special_ids["eot"],
            tie_word_embeddings=True,
        )
    kwargs = dict(
        **shape,
        intermediate_size=run["d_ff"],
        hidden_act="gelu",
        hidden_dropout_prob=drop,
        attention_probs_dropout_prob=drop,
        type_vocab_size=2,
        pad_token_id=special_ids["pad"],
    )
    if fam == "albert":
        return AlbertConfig(
            embedding_size=run["d_model"],
            num_hidden_groups=1,
            inner_group_num=1,
            classifier_dropout_prob=drop,
            bos_token_id=special_ids["cls"],
            eos_token_id=special_ids["sep"],
            **kwargs,
        )
    return BertConfig(**kwargs)


def init_output_bias(model: Any, blocks: Blocks, vocab: int) -> bool:
    """Start the output layer's bias at the log unigram frequencies of the training
    targets (add-one smoothed, centred), where the model has one (the encoders' masked-LM
    heads; GPT-2's tied head has none). Returns whether it did.

    Why: BERT and ALBERT put LayerNorm after each residual sum (post-LN) and train only
    at small learning rates (here, on pydoc_data, 5e-3 and 1e-2 stall on a plateau where
    3e-3 does not); Adam moves a bias by about the learning rate per step, so a zero bias
    needs thousands of steps just to reach the log-frequencies, which span ~10 nats. A
    512-step run spent all its steps on that context-free part: it ended at the
    cross-entropy of the training unigram on the held-out tokens. Starting at the log
    prior (Karpathy 2019, "A recipe for training neural networks": "init well") leaves
    the steps to what needs context. The blocks, whose spectra the study reads, keep the
    family's initialisation, so step 0 stays the null of every claim.
    """
    import torch

    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is None:
        return False
    counts = np.bincount(blocks.ids[~blocks.special], minlength=vocab).astype(float) + 1.0
    logp = np.log(counts / counts.sum())
    with torch.no_grad():
        head.bias.copy_(torch.from_numpy(logp - logp.mean()).to(head.bias.dtype))
    return True


def _model_class(family: str) -> Any:
    from transformers import AlbertForMaskedLM, BertForMaskedLM, GPT2LMHeadModel

    return {"albert": AlbertForMaskedLM, "bert": BertForMaskedLM, "gpt2": GPT2LMHeadModel}[family]


# --------------------------------------------------------------------------- training


@dataclass
class RunResult:
    """What a run measured: per optimiser step (1..steps) the training loss, learning
    rate and gradient norm; per checkpoint step the held-out loss; the held-out unigram
    entropy; the first step whose loss was not finite (or None)."""

    steps: np.ndarray
    train_loss: np.ndarray
    lr: np.ndarray
    grad_norm: np.ndarray
    checkpoint_steps: np.ndarray
    heldout_loss: np.ndarray
    train_loss_at_checkpoint: np.ndarray
    heldout_unigram_entropy: float
    diverged_step: int | None
    n_params: int
    n_train_tokens: int
    n_heldout_tokens: int
    n_heldout_targets: int
    vocab_size: int
    corpus_chars: int
    corpus_sha256: str
    heldout_documents: list[str]
    device: str = "cpu"


def masked_logits(model: Any, ids: Any, labels: Any) -> tuple[Any, Any]:
    """A masked-LM's logits at its targets only, and those targets: the encoder runs over
    every position, the vocabulary head (d x V, a quarter of a small model's forward
    FLOPs at V = 4096, d = 128) only where ``labels`` names a target (15 % of the
    positions); its logits elsewhere are never read. The same loss as the model's own
    forward with ``labels`` (tested)."""
    base, head = (
        (model.albert, model.predictions) if hasattr(model, "albert") else (model.bert, model.cls)
    )
    hidden = base(input_ids=ids).last_hidden_state
    where = labels != -100
    return head(hidden[where]), labels[where]


def _heldout_loss(model: Any, batches: Sequence[tuple[Any, Any]]) -> float:
    """Token-weighted mean cross-entropy (nats) over the fixed held-out batches."""
    import torch

    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for ids, labels in batches:
            if labels is None:  # causal: predict token t+1 from tokens <= t
                logits, labels = model(input_ids=ids).logits[:, :-1].double(), ids[:, 1:]
            else:
                logits, labels = masked_logits(model, ids, labels)
                logits = logits.double()
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]),
                labels.reshape(-1),
                ignore_index=-100,
                reduction="sum",
            )
            total += float(loss)
            count += int((labels != -100).sum())
    model.train()
    return total / count


def _save(model: Any, hf_tok: Any, folder: Path, info: Mapping[str, Any]) -> None:
    import json

    tmp = new_partial(folder, folder=True)  # and a killed run's partials go
    try:
        mark_owned(tmp, f"checkpoint at step {info['step']} of a training run")
        model.save_pretrained(str(tmp))
        hf_tok.save_pretrained(str(tmp))
        (tmp / "trained_model.json").write_text(json.dumps(dict(info), indent=2) + "\n")
        swap_folder(tmp, folder)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(tmp)
        raise


def _written_here(folder: Path) -> bool:
    """Whether a ``step{N}`` folder is a checkpoint this workflow wrote: it holds the
    ownership marker, or (written before step folders were marked) its parent does and
    it holds the record :func:`_save` writes, of step N."""
    import json

    if is_owned(folder):
        return True
    if folder.is_symlink() or not is_owned(folder.parent):
        return False
    try:
        info = json.loads((folder / "trained_model.json").read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(info, dict)
        and set(info) == {"family", "step", "seed"}
        and f"step{info['step']}" == folder.name
    )


def checkpoint_conflicts(out_dir: str | Path, steps: int) -> list[Path]:
    """The folders in ``out_dir`` where a run of ``steps`` steps writes a checkpoint
    that this workflow did not write (a person's): checked before any job, and again
    by :func:`clear_checkpoints`."""
    out_dir = Path(out_dir)
    return [
        folder
        for folder in (out_dir / f"step{step}" for step in checkpoint_steps(steps))
        if (folder.exists() or folder.is_symlink()) and not _written_here(folder)
    ]


def checkpoint_conflict_message(conflicts: Sequence[Path]) -> str:
    """The one-line refusal of :func:`checkpoint_conflicts`' folders."""
    return (
        f"{', '.join(map(str, conflicts))}: not written by this workflow (no "
        f"{OWNER_MARKER}), where the training run writes its checkpoints; fix: move "
        f"{'it' if len(conflicts) == 1 else 'them'} elsewhere"
    )


def clear_checkpoints(out_dir: str | Path, steps: int) -> list[Path]:
    """Make way for a run's checkpoints in ``out_dir``: remove the ``step{N}`` folders
    an earlier run wrote there (any N: the points may have changed), and nothing else.
    A folder of a person's where a checkpoint goes is an error naming it, before any
    training; every other file in ``out_dir`` is kept. Returns what was removed."""
    out_dir = Path(out_dir)
    conflicts = checkpoint_conflicts(out_dir, steps)
    if conflicts:
        raise TrainingError(checkpoint_conflict_message(conflicts))
    removed = []
    for folder in sorted(out_dir.glob("step*")):
        if re.fullmatch(r"step\d+", folder.name) and _written_here(folder):
            shutil.rmtree(folder)
            removed.append(folder)
    return removed


def train_run(
    run: Mapping[str, Any], out_dir: str | Path, log: Any = None, device: str = "cpu"
) -> RunResult:
    """Train one run of the config (``transformers.series.<name>`` with ``source:
    trained``) and write its checkpoints to ``out_dir/step{N}``. Returns the record.

    On ``run["threads"]`` torch threads (default 1), whatever the caller was granted: the
    weights depend on the thread count, so it is one of the run's settings. Both settings
    are the process's, and are given back on return: left on, deterministic mode fills
    every later ``torch.empty`` with NaN (87 s to lay out a Llama-3-70B on the meta device
    in a process that had trained a model, instead of 1.4 s).

    Deterministic mode is on for its choice of kernels, without its filling of new
    tensors with NaN: every tensor a step makes is written before it is read, so the
    weights are the same bytes either way (tested), and the filling cost 5 % of a step.

    ``device`` (``"cuda"`` where the job was granted a GPU,
    :func:`specalign.runtime.torch_device`): where the model and its batches live. The
    data order and the masks are drawn on the CPU either way, so a GPU run sees the same
    batches; its weights differ from a CPU run's in the last bits (other kernels)."""
    import torch
    import torch.utils.deterministic
    from transformers.utils import logging as hf_logging

    # what the run changes in the process, kept first and given back in any case
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    bars = hf_logging.is_progress_bar_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    try:
        # save_pretrained draws a progress bar per checkpoint: dozens of bars in the log
        hf_logging.disable_progress_bar()
        torch.set_num_threads(max(1, int(run.get("threads", 1))))
        torch.use_deterministic_algorithms(True)
        torch.utils.deterministic.fill_uninitialized_memory = _FILL_NEW_TENSORS  # type: ignore[attr-defined]
        if device.startswith("cuda"):
            # deterministic cuBLAS needs a fixed workspace, set before CUDA starts
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        return _train(run, Path(out_dir), log, device)
    finally:
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = fill  # type: ignore[attr-defined]
        torch.set_num_threads(threads)
        if bars:
            hf_logging.enable_progress_bar()


def _train(run: Mapping[str, Any], out_dir: Path, log: Any, device: str = "cpu") -> RunResult:
    import torch

    fam = run["family"]
    if fam not in FAMILIES:
        raise TrainingError(f"family: {fam!r} is not one of {sorted(FAMILIES)}")
    out_dir.mkdir(parents=True, exist_ok=True)

    named = corpus_documents(run["corpus"])
    docs = [text for _, text in named]
    held = heldout_indices([len(d) for d in docs], run["heldout_fraction"], run["split_seed"])
    held_set = set(held)
    train_docs = [d for i, d in enumerate(docs) if i not in held_set]
    held_docs = [docs[i] for i in held]
    tok = train_tokenizer(train_docs, fam, run["vocab_size"])
    vocab = tok.get_vocab_size()
    train_b = make_blocks(tok, train_docs, fam, run["seq_len"])
    held_b = make_blocks(tok, held_docs, fam, run["seq_len"])
    if len(train_b.ids) < 1 or len(held_b.ids) < 1:
        raise TrainingError(
            f"seq_len: {run['seq_len']} tokens per block leaves {len(train_b.ids)} training "
            f"and {len(held_b.ids)} held-out blocks; fix: a shorter seq_len or a larger corpus"
        )
    causal = FAMILIES[fam] == "causal_lm"
    specials = (
        {"eot": tok.token_to_id(DECODER_SPECIAL)}
        if causal
        else {k: tok.token_to_id(f"[{k.upper()}]") for k in ("pad", "cls", "sep", "mask")}
    )

    torch.manual_seed(run["seed"])
    model = _model_class(fam)(model_config(run, vocab, specials))
    init_output_bias(model, train_b, vocab)
    model.to(device)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    hf_tok = hf_tokenizer(tok, fam)

    # held-out batches, masks fixed once (a generator of their own, independent of steps)
    held_gen = torch.Generator().manual_seed(run["seed"] + 1)
    n_held = min(len(held_b.ids), run["heldout_blocks"])
    held_rows = np.arange(n_held)
    held_batches = []
    n_targets = 0
    for s in range(0, n_held, run["batch_size"]):
        rows = held_rows[s : s + run["batch_size"]]
        if causal:
            ids = torch.from_numpy(held_b.ids[rows])
            held_batches.append((ids.to(device), None))
            n_targets += ids[:, 1:].numel()
        else:
            ids, labels = mlm_mask(
                held_b, rows, run["mask_prob"], specials["mask"], vocab, held_gen, hide_all=True
            )
            held_batches.append((ids.to(device), labels.to(device)))
            n_targets += int((labels != -100).sum())
    held_ids = held_b.ids[:n_held]
    if causal:
        entropy = unigram_entropy(held_ids[:, 1:])
    else:
        entropy = unigram_entropy(held_ids, exclude=held_b.special[:n_held])

    # foreach: the same arithmetic per tensor as the default loop, in one call per step
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=run["lr"],
        weight_decay=run["weight_decay"],
        betas=(0.9, 0.98),
        foreach=True,
    )
    steps, warmup = int(run["steps"]), int(run["warmup"])

    def lr_at(step: int) -> float:  # linear warm-up, then linear decay to 10 %
        if step <= warmup:
            return run["lr"] * step / max(warmup, 1)
        frac = (step - warmup) / max(steps - warmup, 1)
        return run["lr"] * (1.0 - 0.9 * frac)

    saves = checkpoint_steps(steps)
    gen = torch.Generator().manual_seed(run["seed"])
    train_loss = np.full(steps, np.nan)
    lrs = np.full(steps, np.nan)
    gnorm = np.full(steps, np.nan)
    held_loss = np.full(len(saves), np.nan)
    train_at = np.full(len(saves), np.nan)
    diverged: int | None = None

    def checkpoint(step: int) -> None:
        i = saves.index(step)
        held_loss[i] = _heldout_loss(model, held_batches)
        if not math.isfinite(held_loss[i]):
            return
        _save(
            model,
            hf_tok,
            out_dir / f"step{step}",
            {"family": fam, "step": step, "seed": run["seed"]},
        )
        if log is not None:
            log.info(
                "step %d: train %.4f held-out %.4f (unigram entropy %.4f)",
                step,
                train_at[i],
                held_loss[i],
                entropy,
            )

    checkpoint(0)
    for step in range(1, steps + 1):
        rows = torch.randint(0, len(train_b.ids), (run["batch_size"],), generator=gen).numpy()
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        if causal:
            ids = torch.from_numpy(train_b.ids[rows]).to(device)
            loss = model(input_ids=ids, labels=ids).loss
        else:
            ids, labels = mlm_mask(train_b, rows, run["mask_prob"], specials["mask"], vocab, gen)
            logits, targets = masked_logits(model, ids.to(device), labels.to(device))
            loss = torch.nn.functional.cross_entropy(logits.float(), targets)
        train_loss[step - 1] = float(loss.detach())
        lrs[step - 1] = lr_at(step)
        if not math.isfinite(train_loss[step - 1]):
            diverged = step
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm[step - 1] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), run["clip"]))
        opt.step()
        if step in saves:
            train_at[saves.index(step)] = train_loss[step - 1]
            checkpoint(step)
            if not math.isfinite(held_loss[saves.index(step)]):
                diverged = step
                break
    if diverged is not None and log is not None:
        log.warning("run diverged at step %d (loss not finite); no later checkpoint", diverged)
    return RunResult(
        steps=np.arange(1, steps + 1),
        train_loss=train_loss,
        lr=lrs,
        grad_norm=gnorm,
        checkpoint_steps=np.asarray(saves),
        heldout_loss=held_loss,
        train_loss_at_checkpoint=train_at,
        heldout_unigram_entropy=entropy,
        diverged_step=diverged,
        n_params=int(n_params),
        n_train_tokens=int(train_b.ids.size),
        n_heldout_tokens=int(held_ids.size),
        n_heldout_targets=int(n_targets),
        vocab_size=int(vocab),
        corpus_chars=int(sum(len(d) for d in docs)),
        corpus_sha256=documents_sha256(docs),
        heldout_documents=[named[i][0] for i in held],
        device=device,
    )


def history_dataset(result: RunResult, series: str, run: Mapping[str, Any]) -> Any:
    """The run's record as an xarray Dataset (``run.nc``): every variable described."""
    import json

    import xarray as xr

    ds = xr.Dataset(
        {
            "train_loss": (
                "step",
                result.train_loss,
                {
                    "description": "training loss of the batch of this optimiser step (nats per "
                    "target token; masked tokens for masked-LM, next tokens for "
                    "causal-LM), before the update; NaN after divergence",
                    "units": "nats/token",
                },
            ),
            "lr": ("step", result.lr, {"description": "learning rate of this step"}),
            "grad_norm": (
                "step",
                result.grad_norm,
                {"description": "global gradient norm before clipping"},
            ),
            "heldout_loss": (
                "checkpoint",
                result.heldout_loss,
                {
                    "description": "mean cross-entropy over the fixed held-out targets at this "
                    "checkpoint (nats per target token), each target a token the model cannot "
                    "see (masked-LM: every target replaced by [MASK]; causal-LM: the next "
                    "token); NaN where not reached",
                    "units": "nats/token",
                },
            ),
            "train_loss_at_checkpoint": (
                "checkpoint",
                result.train_loss_at_checkpoint,
                {
                    "description": "train_loss of the step the checkpoint was taken after (NaN "
                    "at step 0, before any step)",
                    "units": "nats/token",
                },
            ),
            "heldout_unigram_entropy": (
                (),
                result.heldout_unigram_entropy,
                {
                    "description": "-sum p log p of the held-out token frequencies: the loss of "
                    "the best context-free predictor of those tokens",
                    "units": "nats/token",
                },
            ),
        },
        coords={
            "step": ("step", result.steps, {"description": "optimiser step (1-based)"}),
            "checkpoint": (
                "checkpoint",
                result.checkpoint_steps,
                {"description": "step after which a checkpoint was taken (0: initialisation)"},
            ),
        },
        attrs={
            "series": series,
            "family": run["family"],
            "diverged_step": -1 if result.diverged_step is None else int(result.diverged_step),
            "n_params": result.n_params,
            "n_train_tokens": result.n_train_tokens,
            "n_heldout_tokens": result.n_heldout_tokens,
            "n_heldout_targets": result.n_heldout_targets,
            "vocab_size": result.vocab_size,
            "corpus_chars": result.corpus_chars,
            "corpus_sha256": result.corpus_sha256,
            "heldout_documents": json.dumps(result.heldout_documents),
            "device": result.device,
            "run": json.dumps(dict(run), sort_keys=True),
            "description": "A training run made here (specalign.transformers.train.training); "
            "diverged_step -1: the loss stayed finite",
        },
    )
    return ds
