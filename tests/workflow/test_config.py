"""Schema validation: every bad config fails before any job runs, naming the key."""

import copy

import pytest

from specalign.commutators.settings import experiment_config
from specalign.config import (
    ConfigError,
    load_schema,
    load_yaml,
    validate_config,
)


@pytest.fixture
def base(repo):
    return load_yaml(repo / "config" / "test.yaml")


@pytest.mark.parametrize(
    "name", ["config.yaml", "paper.yaml", "test.yaml", "modern.yaml", "modern_test.yaml"]
)
def test_shipped_configs_validate(repo, name):
    cfg = validate_config(load_yaml(repo / "config" / name))
    assert cfg["commutators"]["experiments"] or cfg["transformers"]["models"]


def test_modern_config_has_a_random_twin_of_each_checkpoint(repo):
    """config/modern.yaml: hub checkpoints, each beside a random twin of its own."""
    models = validate_config(load_yaml(repo / "config" / "modern.yaml"))["transformers"]["models"]
    hub = {name for name, spec in models.items() if spec["source"] == "hub"}
    twins = {spec["like"] for spec in models.values() if spec["source"] == "random"}
    assert hub and twins == hub
    assert all(f"{name}_random" in models for name in hub)


def _walk(schema, root, path=""):
    if "$ref" in schema:
        schema = root["$defs"][schema["$ref"].split("/")[-1]]
    for key, sub in schema.get("properties", {}).items():
        yield f"{path}.{key}".lstrip("."), sub
        yield from _walk(sub, root, f"{path}.{key}")
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        yield from _walk(extra, root, f"{path}.<name>")


def test_every_schema_key_has_description_and_default():
    schema = load_schema()
    for key, sub in _walk(schema, schema):
        assert sub.get("description"), f"{key} has no description"
        required = {
            "commutators.experiments.<name>.kind",
            "transformers.models.<name>.source",
            "transformers.series.<name>.source",
        }
        if key not in required:
            assert "default" in sub, f"{key} has no default"


def test_schema_model_keys_are_the_sources_keys():
    """config/schema.yaml (static YAML, read without the package) says what
    ``transformers.sources.SOURCES`` says: the same sources, and each model key described
    as "(kind) ..." is a key of that source, and of no other."""
    from specalign.transformers.load.sources import SOURCES, SPEC_KINDS

    model = load_schema()["$defs"]["model"]
    assert model["properties"]["source"]["enum"] == list(SOURCES)
    described = {
        key: sub["description"].strip()[1:].split(")")[0]
        for key, sub in model["properties"].items()
        if sub["description"].strip().startswith("(")
    }
    read = {f: kind for kind, source in SOURCES.items() for f in source.fields}
    assert described == read
    assert sum(f in source.fields for source in SOURCES.values() for f in read) == len(read)
    assert SPEC_KINDS == ("hub", "local", "package")


def test_defaults_filled(base):
    cfg = validate_config(base)
    assert cfg["commutators"]["diagnostics"]["gap_threshold"] == 1e-3
    assert cfg["resources"]["gpu"] == 0
    exp = experiment_config(cfg, "tiny_rescale")
    assert exp["training"]["times"] == [0, 5, 15]  # override
    assert exp["training"]["lr"] == 0.05  # inherited
    assert exp["seed_start"] == 0


BAD = [
    (lambda c: c.update(bogus=1), "unknown key bogus"),
    (
        lambda c: c["commutators"]["experiments"]["tiny_synthetic"].update(width=0),
        "commutators.experiments.tiny_synthetic.width",
    ),
    (
        lambda c: c["commutators"]["experiments"]["tiny_synthetic"].update(seeds=-3),
        "commutators.experiments.tiny_synthetic.seeds",
    ),
    (
        lambda c: c["commutators"]["experiments"]["tiny_synthetic"].update(kind="transformer"),
        "commutators.experiments.tiny_synthetic.kind",
    ),
    (
        lambda c: c["commutators"]["experiments"]["tiny_synthetic"].update(hidden="four"),
        "commutators.experiments.tiny_synthetic.hidden",
    ),
    (
        lambda c: c["commutators"]["experiments"]["tiny_synthetic"].update(widht=3),
        "commutators.experiments.tiny_synthetic.widht",
    ),
    (lambda c: c["commutators"]["training"].update(lr=-1), "commutators.training.lr"),
    (lambda c: c.update(threads=0), "threads"),
    (lambda c: c["commutators"]["training"].update(times=[1000]), "commutators.experiments"),
    (
        lambda c: c["commutators"]["experiments"]["tiny_concrete"].update(dataset="energy"),
        "commutators.experiments.tiny_concrete.source",
    ),
    (
        lambda c: c["commutators"]["experiments"]["tiny_rescale"]["rescale"].update(layer=3),
        "commutators.experiments.tiny_rescale.rescale.layer",
    ),
    (
        lambda c: c["commutators"]["experiments"].update({"bad name!": {"kind": "synthetic"}}),
        "bad name!",
    ),
    (lambda c: c.setdefault("plots", {}).update(formats=["gif"]), "plots.formats[0]"),
    (
        lambda c: c["transformers"]["models"]["minilm_random"].update(config={"model_type": "x"}),
        "minilm_random: a random model needs exactly one of like, config_file, config (got "
        "like, config)",
    ),
    (
        lambda c: c["transformers"]["models"].update(twin={"source": "random"}),
        "transformers.models.twin: a random model needs exactly one of",
    ),
    (
        lambda c: c["transformers"]["models"].update(twin={"source": "random", "config": {}}),
        "transformers.models.twin.config: 'model_type' is a required property",
    ),
    (
        lambda c: c["transformers"]["models"]["minilm"].update(config_file="c.json"),
        "transformers.models.minilm: config_file only applies to source 'random'",
    ),
    (
        lambda c: c["transformers"]["models"]["minilm"].update(config_file="c.json", seed=3),
        "transformers.models.minilm: config_file/seed only apply to source 'random'",
    ),
    (
        lambda c: c["transformers"]["models"]["minilm_random"].update(revision="v1"),
        "transformers.models.minilm_random: revision only applies to source 'hub'",
    ),
    # issue 29 (6): the hub library's rule for ids, for models and series alike
    (
        lambda c: c["transformers"]["models"].update(h={"source": "hub", "id": "o/bad..x"}),
        "transformers.models.h.id: 'o/bad..x' is not a valid hub repository id",
    ),
    (
        lambda c: (
            c["transformers"]
            .setdefault("series", {})
            .update(p={"source": "hub", "id": "o/-x", "revisions": ["step1"]})
        ),
        "transformers.series.p.id: 'o/-x' is not a valid hub repository id",
    ),
]


def test_random_model_from_a_written_configuration(base, tmp_path, monkeypatch):
    """A random model may be declared from its configuration alone (offline twins): a
    configuration written in the config, or a config.json file (which must exist)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "twin").mkdir()
    (tmp_path / "twin" / "config.json").write_text('{"model_type": "llama"}')
    base["transformers"]["models"] = {
        "twin": {"source": "random", "config": {"model_type": "llama", "hidden_size": 32}},
        "twin_file": {"source": "random", "config_file": "twin/config.json", "seed": 2},
    }
    # a model without a folder has no tokenizer for the default target_text (issue 17)
    base["transformers"]["steering"]["target_id"] = 3
    cfg = validate_config(base)
    assert cfg["transformers"]["models"]["twin"]["config"]["hidden_size"] == 32
    assert cfg["transformers"]["models"]["twin"]["like"] == ""
    assert cfg["transformers"]["models"]["twin_file"]["config"] is None


@pytest.mark.parametrize("mutate,key", BAD)
def test_bad_config_names_the_key(base, mutate, key):
    cfg = copy.deepcopy(base)
    mutate(cfg)
    with pytest.raises(ConfigError) as err:
        validate_config(cfg)
    assert key in str(err.value)


def test_modern_test_config_twins_checkpoints_of_modern(repo):
    """config/modern_test.yaml (CI) holds tiny twins `<m>_tiny` of checkpoints `<m>` of
    config/modern.yaml, built from a configuration (the pipeline test checks that they
    cover every family)."""
    modern = load_yaml(repo / "config" / "modern.yaml")["transformers"]["models"]
    tiny = load_yaml(repo / "config" / "modern_test.yaml")["transformers"]["models"]
    twins = [name for name in tiny if name.endswith("_tiny")]
    assert twins
    for name in twins:
        assert modern[name.removesuffix("_tiny")]["source"] == "hub", name
        assert tiny[name]["source"] == "random" and tiny[name]["config"]["model_type"], name


# --------------------------------------------------------------------------- series


def _with_series(cfg, **series):
    cfg = dict(cfg)
    cfg["transformers"] = {**cfg.get("transformers", {}), "series": series}
    return cfg


def test_series_points_are_derived_models(base):
    cfg = _with_series(
        base,
        run=dict(source="trained", family="albert", steps=16, points=[0, 4, 16]),
        py=dict(source="hub", id="EleutherAI/pythia-160m", revisions=["step8", "step0"]),
    )
    v = validate_config(cfg)
    models = v["transformers"]["models"]
    assert {m for m in models if models[m]["series"]} == {
        "run_step0",
        "run_step4",
        "run_step16",
        "py_step0",
        "py_step8",
    }
    assert models["py_step8"]["revision"] == "step8" and models["py_step8"]["step"] == 8
    assert models["run_step4"]["source"] == "trained"
    assert validate_config(v) == v  # idempotent


@pytest.mark.parametrize(
    ("series", "match"),
    [
        (
            dict(source="trained", corpus={"kind": "file", "path": "/no/such/file"}),
            r"transformers\.series\.s\.corpus\.path: .* does not exist",
        ),
        (
            dict(source="trained", vocab_size=10**6),
            r"transformers\.series\.s\.vocab_size: 1000000 pieces, but the tokenizer of "
            r"bert learns at most \d+ from the training split",
        ),
        (dict(source="trained", steps=16, points=[3]), r"transformers\.series\.s\.points: step 3"),
        (dict(source="trained", d_model=30, n_heads=4), r"transformers\.series\.s\.n_heads"),
        (dict(source="hub", id="x/y", revisions=["main"]), r"transformers\.series\.s\.revisions"),
        (dict(source="hub", revisions=["step0"]), r"transformers\.series\.s\.id: required"),
    ],
)
def test_series_bad_input_names_the_key(base, series, match):
    with pytest.raises(ConfigError, match=match):
        validate_config(_with_series(base, s=series))


def test_series_vocabulary_limit_is_the_tokenizers_own(base):
    """The check trains the run's tokenizer on the run's training split: a word-level
    vocabulary for the encoders (lower-cased words of the training documents only), byte-
    level BPE for gpt2, which ends with more pieces than the corpus has distinct words."""
    from specalign.transformers.train import training

    docs = training.load_corpus({"kind": "pydoc_topics"})
    train_docs, _ = training.split_documents(docs, 0.1, 0)
    words = training.vocabulary_limit(train_docs, "bert", 10**6)
    pieces = training.vocabulary_limit(train_docs, "gpt2", 10**6)
    assert words is not None and pieces is not None and words < pieces
    assert training.vocabulary_limit(train_docs, "bert", words) is None
    assert training.vocabulary_limit(train_docs, "gpt2", pieces) is None
    assert training.vocabulary_limit(train_docs, "gpt2", pieces + 1) == pieces
    run = dict(source="trained", family="albert", heldout_fraction=0.1, split_seed=0)
    validate_config(_with_series(base, s=dict(run, vocab_size=words)))
    with pytest.raises(ConfigError, match=rf"s\.vocab_size: {words + 1} .* at most {words}"):
        validate_config(_with_series(base, s=dict(run, vocab_size=words + 1)))
    # more BPE pieces than the encoders' words: a limit the gpt2 run may use
    validate_config(_with_series(base, s=dict(run, family="gpt2", vocab_size=words + 1)))


def test_series_vocabulary_limit_is_kept_by_the_corpus_content(base, tmp_path, monkeypatch):
    """Found once per corpus text and settings, then read from the kept facts: a second
    process (here: the in-process memo emptied) trains no tokenizer; another text is
    another key, so an edited corpus file is checked again."""
    from specalign.transformers import settings
    from specalign.transformers.train import training

    monkeypatch.setenv("SPECALIGN_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("alpha beta gamma\n\ndelta epsilon\n\nzeta eta theta iota\n")
    run = dict(source="trained", family="bert", vocab_size=40, split_seed=0,
               corpus={"kind": "file", "path": str(corpus)})  # fmt: skip
    with pytest.raises(ConfigError, match="vocab_size: 40 .* at most") as first:
        validate_config(_with_series(base, s=run))
    trained = []
    original = training.vocabulary_limit
    monkeypatch.setattr(training, "vocabulary_limit", lambda *a: trained.append(a) or original(*a))
    monkeypatch.setattr(settings, "_LIMITS", {})
    with pytest.raises(ConfigError, match="vocab_size: 40 .* at most") as second:
        validate_config(_with_series(base, s=run))
    assert trained == [] and str(second.value) == str(first.value)
    corpus.write_text(corpus.read_text() + "\nkappa lambda mu nu xi omicron pi rho\n")
    monkeypatch.setattr(settings, "_LIMITS", {})
    with pytest.raises(ConfigError, match="vocab_size: 40 .* at most"):
        validate_config(_with_series(base, s=run))
    assert len(trained) == 1  # the edited text is another key
    assert len(list((tmp_path / "cache" / "vocabulary-limits").glob("*.json"))) == 2


def test_series_empty_corpus_file(base, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    series = dict(source="trained", corpus={"kind": "file", "path": str(empty)})
    with pytest.raises(ConfigError, match=r"transformers\.series\.s\.corpus\.path: .* is empty"):
        validate_config(_with_series(base, s=series))


@pytest.mark.parametrize("kind", ["empty", "blank", "missing", "latin1", "folder", "unset"])
def test_series_corpus_file_is_refused_at_validation_as_the_job_would(base, tmp_path, kind):
    """Validation reads a corpus file with the job's own reader: each file the job would
    refuse is refused before any job, in the job's words under the series' key."""
    from specalign.transformers.train import training

    path = tmp_path / "corpus.txt"
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "blank":
        path.write_text("  \n\n \n")
    elif kind == "latin1":
        path.write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    elif kind == "folder":
        path.mkdir()
    corpus = {"kind": "file", "path": None if kind == "unset" else str(path)}
    with pytest.raises(training.TrainingError) as job:
        training.corpus_documents(corpus)
    series = dict(source="trained", corpus=corpus)
    with pytest.raises(ConfigError) as checked:
        validate_config(_with_series(base, s=series))
    assert f"transformers.series.s.{job.value}" in str(checked.value)


# ------------------------------------------------------------------ --config overrides


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"threads": 2}, {"threads": 2}),
        # Snakemake's base YAML loader leaves every nested scalar a string
        ({"plots": {"dpi": "100", "formats": ["png"]}},
         {"plots": {"dpi": 100, "formats": ["png"]}}),
        ({"transformers": {"eta": "0.5", "propagation": {"null_draws": "4"}}},
         {"transformers": {"eta": 0.5, "propagation": {"null_draws": 4}}}),
        ({"transformers": {"eta": "1e-3"}}, {"transformers": {"eta": 1e-3}}),  # YAML 1.1: a str
        ({"data": {"mirror": "null"}}, {"data": {"mirror": None}}),
        ({"data": {"mirror": "/srv/uci"}}, {"data": {"mirror": "/srv/uci"}}),
        ({"resources": {"gpu_model": "100"}}, {"resources": {"gpu_model": "100"}}),  # a string
        ({"commutators": {"diagnostics": {"localize": [["2", "1"]]}}},
         {"commutators": {"diagnostics": {"localize": [[2, 1]]}}}),
        # a whole mapping given as one string, and an experiment's own keys ($ref)
        ({"plots": "{dpi: 72}"}, {"plots": {"dpi": 72}}),
        ({"commutators": {"experiments": {"x": {"kind": "synthetic", "hidden": "2",
                                                 "rescale": {"c": "2"}}}}},
         {"commutators": {"experiments": {"x": {"kind": "synthetic", "hidden": 2,
                                                 "rescale": {"c": 2}}}}}),
        ({"steps": "5"}, {"steps": "5"}),  # unknown key: left for validate_config to name
        ({"plots": {"dpi": "abc"}}, {"plots": {"dpi": "abc"}}),  # still wrong: named later
    ],
)  # fmt: skip
def test_command_line_overrides_typed_by_schema(given, expected):
    from specalign.config import coerce_overrides

    got = coerce_overrides(given)
    assert got == expected
    assert [type(v) for v in _leaves(got)] == [type(v) for v in _leaves(expected)]


def _leaves(value):
    if isinstance(value, dict):
        return [x for k in sorted(value) for x in _leaves(value[k])]
    if isinstance(value, list):
        return [x for v in value for x in _leaves(v)]
    return [value]


@pytest.mark.pipeline  # a Snakemake dry run
def test_config_without_configfile_runs_the_default(repo, tmp_path):
    """`--config key=value` alone changes one key of config/config.yaml: it must plan the
    default study, not only `all` (the Snakefile once skipped the default config)."""
    from snakemake_helpers import dry_run, job_stats

    default = job_stats(dry_run(repo, tmp_path))
    assert default.get("train_ensemble", 0) > 0 and default.get("spectra", 0) > 0
    # a plain key and a nested one (typed by the schema) in one call
    out = dry_run(repo, tmp_path, "--config", "threads=1", "plots={formats: [svg], dpi: 100}")
    assert job_stats(out) == default and "figure1.svg" in out and "figure1.png" not in out


@pytest.mark.pipeline  # a Snakemake dry run
def test_configfile_replaces_the_default_and_config_applies_on_top(repo, tmp_path):
    """A --configfile runs exactly its own experiments and models (paper.yaml adds none of
    the default's), and --config values, nested ones typed by the schema, apply to it."""
    from snakemake_helpers import dry_run, job_stats

    paper = validate_config(load_yaml(repo / "config" / "paper.yaml"))
    out = dry_run(repo, tmp_path, "--configfile", str(repo / "config" / "paper.yaml"))
    jobs = job_stats(out)
    assert jobs["train_ensemble"] == len(paper["commutators"]["experiments"])
    assert jobs["extract_weights"] == len(paper["transformers"]["models"])
    out = dry_run(
        repo, tmp_path, "--configfile", str(repo / "config" / "test.yaml"),
        "--config", "plots={dpi: 100, formats: [pdf]}", "threads=1",
    )  # fmt: skip
    test = validate_config(load_yaml(repo / "config" / "test.yaml"))
    assert job_stats(out)["train_ensemble"] == len(test["commutators"]["experiments"])
    assert "figure1.pdf" in out and "figure1.png" not in out


@pytest.mark.pipeline  # a Snakemake dry run
def test_bad_command_line_value_says_how_to_pass_it(repo, tmp_path):
    from snakemake_helpers import dry_run

    out = dry_run(repo, tmp_path, "--config", "plots={dpi: abc}", check=False)
    assert "plots.dpi: 'abc' is not of type 'integer'" in out
    assert "--config plots='{dpi: 100}'" in out


def _key_lines(text: str) -> list[int]:
    """Indices of the lines of ``text`` that hold a mapping key with a scalar value."""
    import re

    return [
        i
        for i, line in enumerate(text.splitlines())
        if re.match(r"^\s*[A-Za-z_][\w-]*: \S", line) and not line.strip().startswith("-")
    ]


@pytest.mark.parametrize("name", ["test.yaml", "modern_test.yaml", "paper.yaml"])
def test_a_key_given_twice_is_refused_naming_both_lines(repo, tmp_path, name):
    """Every key of a full configuration (the file with its defaults filled, written
    out), given a second time in its own mapping, is refused in one line naming the key,
    the file and both lines; a merge key's keys may still be overridden."""
    import yaml

    full = validate_config(load_yaml(repo / "config" / name))
    text = yaml.safe_dump(full, sort_keys=False)
    lines = text.splitlines()
    checked = 0
    for i in _key_lines(text):
        key = lines[i].strip().split(":")[0]
        twice = [*lines[: i + 1], lines[i], *lines[i + 1 :]]
        path = tmp_path / "config.yaml"
        path.write_text("\n".join(twice) + "\n")
        with pytest.raises(ConfigError) as err:
            load_yaml(path)
        msg = str(err.value)
        assert "\n" not in msg
        assert f"key {key!r} given twice" in msg and f"lines {i + 1} and {i + 2}" in msg, msg
        assert str(path) in msg
        checked += 1
    assert checked > 50
    (tmp_path / "merge.yaml").write_text("a: &a {x: 1, y: 2}\nb:\n  <<: *a\n  x: 3\n")
    assert load_yaml(tmp_path / "merge.yaml")["b"] == {"x": 3, "y": 2}


@pytest.mark.pipeline  # a Snakemake dry run
def test_a_key_given_twice_in_a_configfile_stops_snakemake(repo, tmp_path):
    from snakemake_helpers import dry_run

    text = (repo / "config" / "test.yaml").read_text()
    path = tmp_path / "twice.yaml"
    path.write_text(text.replace("threads: 1\n", "threads: 1\nthreads: 2\n", 1))
    out = dry_run(repo, tmp_path, "--configfile", str(path), check=False)
    assert "key 'threads' given twice in one mapping, at lines" in out, out[-3000:]
    assert "Job stats" not in out


@pytest.mark.parametrize(
    "likes, cycle",
    [
        ({"a": "a"}, "a -> a"),
        ({"a": "b", "b": "a"}, "a -> b -> a"),
        ({"b": "c", "c": "a", "a": "b", "x": "a"}, "a -> b -> c -> a"),
    ],
)
def test_like_references_in_a_cycle_are_refused_naming_it(base, likes, cycle):
    """``like:`` references are followed with the models seen so far: a cycle (a model
    copying itself, two copying each other, a longer ring, and a model copying a member
    of one) is one line naming the cycle once, not a RecursionError."""
    base["transformers"]["models"] = {
        name: {"source": "random", "like": like, "seed": 0} for name, like in likes.items()
    }
    with pytest.raises(ConfigError) as err:
        validate_config(base)
    msg = str(err.value)
    assert msg.count("form a cycle") == 1, msg
    assert f"transformers.models.a.like: the like: references form a cycle, {cycle};" in msg
