"""The repository root as a Hub artifact: AutoModel loading, save/load round trip, error messages,
shared output projection, PEFT bases. Whisper parts run on transformers 5.x, MERaLiON-2 parts on 4.51."""

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import ROOT, requires_transformers5, transformers_below_452
from tiny_models import build_tiny_whisper, random_features

CODE_FILES = ["configuration_medusa.py", "modeling_medusa.py", "medusa_options.py", "base_loading.py",
              "generation_checks.py", "speech_io.py", "medusa_decoding.py", "medusa_fast.py", "medusa_heads.py",
              "draft_policy.py", "draft_timing.py", "draft_trees.py", "kv_cache.py", "logits_rules.py", "backbone.py",
              "cpu_kernels.py", "backbone_whisper.py", "backbone_meralion2.py", "asr_pipeline.py"]


def test_modeling_file_imports_every_code_file_itself():
    """transformers < 4.52 copies into its module cache only the files the modeling file itself imports (from a
    local folder): each code file it runs must be imported there, not only through another code file."""
    import re

    text = (ROOT / "modeling_medusa.py").read_text()
    imported = {f"{name}.py" for name in re.findall(r"^\s*from \.(\w+) import", text, flags=re.M)}
    assert imported == set(CODE_FILES) - {"modeling_medusa.py", "asr_pipeline.py"}  # (the pipeline loads its own)


def edited_copy(artifact: Path, folder: Path, **config_changes) -> Path:
    """A copy of the artifact with some config.json fields changed."""
    shutil.copytree(artifact, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(config_changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def make_artifact(folder: Path, base_folder: Path, family: str) -> Path:
    """A repo folder like the root, whose config points at a local base and holds trained-shape heads."""
    from modeling_medusa import MedusaForASR

    model = MedusaForASR.from_base(str(base_folder), family=family, trust_base_remote_code=True)
    with torch.no_grad():
        for p in model.medusa_heads.parameters():
            p.normal_(0, 0.1)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def base_folder(tmp_path_factory):
    if transformers_below_452():
        from standin import build_meralion2_standin

        return build_meralion2_standin(tmp_path_factory.mktemp("m2") / "standin", seed=1), "meralion2"
    return build_tiny_whisper(tmp_path_factory.mktemp("whisper"), seed=4), "whisper"


@pytest.fixture(scope="module")
def artifact(base_folder, tmp_path_factory):
    folder, family = base_folder
    return make_artifact(tmp_path_factory.mktemp("artifact") / "repo", folder, family)


def test_remote_code_imports_only_what_transformers_and_torch_bring():
    """transformers refuses to load remote code whose files import a package that is missing, imports inside
    try blocks excepted: optional packages (peft, accelerate) must not be among them."""
    import sys

    from transformers.dynamic_module_utils import get_imports

    from modeling_medusa import CODE_FILES

    for name in CODE_FILES:
        packages = set(get_imports(ROOT / name)) - set(sys.stdlib_module_names)
        assert packages <= {"torch", "transformers", "safetensors", "huggingface_hub"}, (name, packages)


def processor_files(processor, folder: Path) -> list[str]:
    """The names ``processor.save_pretrained`` writes (this transformers version's)."""
    processor.save_pretrained(folder)
    return sorted(p.name for p in folder.iterdir())


def test_save_pretrained_writes_config_heads_code_and_the_pipelines_processor(artifact, base_folder, tmp_path):
    """A Whisper artifact also ships its base's processor files (the ASR pipeline loads them) and names its class
    for ``AutoModelForSpeechSeq2Seq``; a MERaLiON-2 artifact neither (the pipeline refuses it in one line)."""
    from modeling_medusa import ASR_PIPELINE, MedusaForASR

    whisper = base_folder[1] == "whisper"
    shipped = processor_files(MedusaForASR.from_pretrained(str(artifact)).processor, tmp_path) if whisper else []
    names = sorted(p.name for p in artifact.iterdir())
    assert names == sorted(["config.json", "medusa_heads.safetensors", *CODE_FILES, *shipped])
    assert not whisper or {"tokenizer_config.json"} <= set(shipped)
    config = json.loads((artifact / "config.json").read_text())
    assert config["auto_map"]["AutoModel"] == "modeling_medusa.MedusaForASR"
    assert ("AutoModelForSpeechSeq2Seq" in config["auto_map"]) == whisper
    assert config["custom_pipelines"] == {"automatic-speech-recognition": ASR_PIPELINE}
    heads_bytes = (artifact / "medusa_heads.safetensors").stat().st_size
    hidden = config["hidden_size"]
    assert heads_bytes < 4 * (hidden * hidden + hidden) * 4 + 10_000  # heads only, no vocabulary matrix


def test_automodel_loads_the_artifact_with_trust_remote_code(artifact, base_folder):
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.from_pretrained(str(artifact), trust_remote_code=True)
    assert type(config).__name__ == "MedusaConfig" and config.base_family == base_folder[1]
    model = AutoModel.from_pretrained(str(artifact), trust_remote_code=True)
    assert type(model).__name__ == "MedusaForASR"
    assert model.config.medusa_num_heads == 4
    # the heads share the base output projection by reference: no copy of the vocabulary matrix
    projection = model.backbone.output_projection.weight
    assert all(p.shape[0] != projection.shape[0] for p in model.medusa_heads.parameters())
    assert model.backbone.output_projection is (model.base.proj_out if base_folder[1] == "whisper"
                                                else model.base.text_decoder.lm_head)


def test_the_api_and_the_command_line_find_the_same_kept_timings(artifact):
    """A model loaded through transformers (remote code copied into its module cache, which leaves out the ASR
    pipeline's file) and one the command line imports from the folder key their kept draft timings alike."""
    from transformers import AutoModel

    from modeling_medusa import MedusaForASR

    through_api = AutoModel.from_pretrained(str(artifact), trust_remote_code=True)
    assert type(through_api) is not MedusaForASR  # (the module cache's class, not this checkout's)
    assert through_api.timing_context() == MedusaForASR.from_pretrained(str(artifact)).timing_context()


def test_asr_pipeline_runs_whisper_artifacts_and_refuses_meralion2_in_one_line(artifact, base_folder):
    """``pipeline("automatic-speech-recognition", model=<artifact>, trust_remote_code=True)``: a Whisper artifact
    loads (through ``AutoModelForSpeechSeq2Seq`` too) and transcribes with the model's processor or, where the
    model has none, the processor files the artifact ships (the same text); MERaLiON-2's is refused, naming
    what to use instead."""
    from transformers import pipeline

    from asr_pipeline import MedusaSpeechRecognitionPipeline

    if base_folder[1] != "whisper":
        with pytest.raises(ValueError, match="runs Whisper-family artifacts.*use model.generate"):
            pipeline("automatic-speech-recognition", model=str(artifact), trust_remote_code=True)
        return
    from transformers import AutoModelForSpeechSeq2Seq

    model = AutoModelForSpeechSeq2Seq.from_pretrained(str(artifact), trust_remote_code=True)
    assert type(model).__name__ == "MedusaForASR"
    audio = {"raw": np.random.default_rng(3).standard_normal(16000).astype(np.float32) * 0.1, "sampling_rate": 16000}
    ours = pipeline("automatic-speech-recognition", model=str(artifact), trust_remote_code=True)
    assert type(ours).__name__ == "MedusaSpeechRecognitionPipeline"
    want = ours(dict(audio), generate_kwargs={"max_new_tokens": 8})
    model.processor = None
    shipped = MedusaSpeechRecognitionPipeline(model)
    assert shipped(dict(audio), generate_kwargs={"max_new_tokens": 8}) == want


def test_save_pretrained_folder_keeps_the_umask(artifact, tmp_path):
    import os

    from modeling_medusa import MedusaForASR

    model = MedusaForASR.from_pretrained(str(artifact))
    previous = os.umask(0o022)
    try:
        model.save_pretrained(tmp_path / "saved")
    finally:
        os.umask(previous)
    assert oct((tmp_path / "saved").stat().st_mode & 0o777) == "0o755"
    assert {oct(p.stat().st_mode & 0o777) for p in (tmp_path / "saved").iterdir()} == {"0o644"}


@pytest.mark.parametrize("device_map", [{"model.encoder": 0, "model.decoder": 1}, {"": "cpu", "lm_head": "disk"}])
def test_a_base_spread_over_devices_or_offloaded_is_refused(base_folder, device_map):
    from modeling_medusa import MedusaForASR, load_base_model

    base, processor = load_base_model(str(base_folder[0]), base_folder[1], trust_base_code=True)
    base.hf_device_map = device_map  # what accelerate's dispatch leaves on the model
    with pytest.raises(ValueError, match="one device"):
        MedusaForASR.from_base(str(base_folder[0]), base_model=base, processor=processor)
    base.hf_device_map = {"": "cpu"}
    assert MedusaForASR.from_base(str(base_folder[0]), base_model=base, processor=processor).base is base


@requires_transformers5
def test_a_processor_that_fails_to_load_is_a_warning_with_its_cause(base_folder, tmp_path):
    from modeling_medusa import MedusaForASR

    folder = shutil.copytree(base_folder[0], tmp_path / "no_processor")
    (folder / "preprocessor_config.json").unlink()
    with pytest.warns(UserWarning, match=r"without a processor \(\w+Error: "):
        model = MedusaForASR.from_base(str(folder))
    assert model.processor is None


def test_round_trip_keeps_the_heads(artifact, tmp_path):
    from modeling_medusa import MedusaForASR

    model = MedusaForASR.from_pretrained(str(artifact))
    model.save_pretrained(tmp_path / "again")
    again = MedusaForASR.from_pretrained(str(tmp_path / "again"))
    for (name, a), (_, b) in zip(model.medusa_heads.state_dict().items(), again.medusa_heads.state_dict().items()):
        assert torch.equal(a, b), name


def test_root_artifact_has_no_untrained_heads_and_says_how_to_train():
    from configuration_medusa import MedusaConfig
    from modeling_medusa import MedusaForASR

    config = MedusaConfig.from_pretrained(str(ROOT))
    assert config.base_model_name_or_path == "MERaLiON/MERaLiON-2-3B"
    assert (config.hidden_size, config.vocab_size, config.medusa_num_heads, config.medusa_num_layers) == (2304, 256000, 4, 1)
    assert not (ROOT / "medusa_heads.safetensors").exists()
    with pytest.raises(FileNotFoundError, match="pipeline.collect"):
        MedusaForASR.from_pretrained(str(ROOT))


def test_missing_heads_file_is_a_clear_error(artifact, tmp_path):
    from modeling_medusa import MedusaForASR

    broken = tmp_path / "no_heads"
    shutil.copytree(artifact, broken)
    (broken / "medusa_heads.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="medusa_heads.safetensors"):
        MedusaForASR.from_pretrained(str(broken))


def test_a_mistyped_artifact_path_says_it_is_no_folder_here(tmp_path, monkeypatch):
    """A name that is no folder is tried as a Hub repository id; offline that fails, and the error names both."""
    from modeling_medusa import MedusaForASR

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError, match=r"'heads/mistyped': there is no such folder here \(.*\), and as a Hub repository id"):
        MedusaForASR.from_pretrained("heads/mistyped")


def test_truncated_heads_file_is_one_line_naming_it(artifact, tmp_path, capsys):
    from tools import transcribe
    from modeling_medusa import MedusaForASR

    broken = tmp_path / "truncated"
    shutil.copytree(artifact, broken)
    heads = broken / "medusa_heads.safetensors"
    heads.write_bytes(heads.read_bytes()[:1000])
    with pytest.raises(ValueError, match="medusa_heads.safetensors is truncated or corrupt"):
        MedusaForASR.from_pretrained(str(broken))
    import numpy as np
    import soundfile as sf

    sf.write(tmp_path / "a.wav", np.zeros(1600, np.float32), 16000)
    capsys.readouterr()
    code = transcribe.main(["--model", str(broken), str(tmp_path / "a.wav"), "--quiet"])
    err = capsys.readouterr().err
    assert code == transcribe.EXIT_USER_ERROR and "truncated or corrupt" in err and "Traceback" not in err


def test_heads_of_the_wrong_shape_are_a_clear_error(artifact, tmp_path):
    from safetensors.torch import load_file, save_file

    from modeling_medusa import MedusaForASR

    broken = tmp_path / "bad_shape"
    shutil.copytree(artifact, broken)
    heads = load_file(str(broken / "medusa_heads.safetensors"))
    save_file({k: torch.zeros(v.shape[0] + 1, *v.shape[1:]) for k, v in heads.items()},
              str(broken / "medusa_heads.safetensors"))
    with pytest.raises(ValueError, match="trained for another base"):
        MedusaForASR.from_pretrained(str(broken))


def test_head_count_mismatch_is_a_clear_error(artifact, tmp_path):
    from modeling_medusa import MedusaForASR

    broken = edited_copy(artifact, tmp_path / "bad_count", medusa_num_heads=5)
    with pytest.raises(ValueError, match="missing"):
        MedusaForASR.from_pretrained(str(broken))


def test_hidden_size_mismatch_is_a_clear_error(artifact, tmp_path):
    from modeling_medusa import MedusaForASR

    hidden = json.loads((artifact / "config.json").read_text())["hidden_size"]
    broken = edited_copy(artifact, tmp_path / "bad_hidden", hidden_size=hidden + 8)
    with pytest.raises(ValueError, match="hidden size"):
        MedusaForASR.from_pretrained(str(broken))


def test_unresolvable_base_is_a_clear_error(artifact, tmp_path):
    from modeling_medusa import MedusaForASR

    broken = edited_copy(artifact, tmp_path / "bad_base", base_model_name_or_path="nobody/not-a-model-anywhere")
    with pytest.raises(OSError, match="nobody/not-a-model-anywhere"):
        MedusaForASR.from_pretrained(str(broken))


@requires_transformers5
def test_readme_automodel_finds_the_offline_converted_base(artifact, base_folder, tmp_path, monkeypatch, capsys):
    """An artifact naming a Whisper Hub id loads offline from the copy tools.real_whisper converted into the
    cache folder (checked before the Hub), through AutoModel as the README shows and through the CLI; without
    one the error names what was looked for, and the CLI's names --base, not a Python keyword."""
    from tools import transcribe
    import numpy as np
    import soundfile as sf
    from transformers import AutoModel

    monkeypatch.setenv("MEDUSA_ASR_CACHE", str(tmp_path / "cache"))
    hub_named = edited_copy(artifact, tmp_path / "hub_named", base_model_name_or_path="openai/whisper-tiny.en")
    noise = np.random.default_rng(5).normal(0, 0.1, 1600).astype(np.float32)  # (the CLI fails a silent file)
    sf.write(tmp_path / "a.wav", noise, 16000)
    cli = [str(tmp_path / "a.wav"), "--model", str(hub_named), "--max-new-tokens", "8", "--quiet"]

    def decodes(args) -> bool:
        """The CLI loaded the model and decoded the file: the tiny base's ids decode to no text, which the CLI
        counts as a failed file (exit 1, no output written), not as a user error."""
        capsys.readouterr()
        code = transcribe.main(args)
        err = capsys.readouterr().err
        return code == 0 or (code == 1 and "the model produced no text" in err and "Traceback" not in err)

    with pytest.raises(OSError, match="base_model_name_or_path"):
        AutoModel.from_pretrained(str(hub_named), trust_remote_code=True)
    from tools import real_whisper

    def no_pypi(name):  # the CLI would convert from PyPI: not in a test
        raise real_whisper.ConversionError("no PyPI here")

    monkeypatch.setattr(real_whisper, "resolve_whisper", no_pypi)
    capsys.readouterr()
    assert transcribe.main(cli) == transcribe.EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert "--base" in err and "base_model_name_or_path" not in err and "Traceback" not in err

    converted = shutil.copytree(base_folder[0], tmp_path / "cache" / "whisper-tiny.en")
    (converted / "conversion.json").write_text(json.dumps({"hub_id": "openai/whisper-tiny.en"}))
    model = AutoModel.from_pretrained(str(hub_named), trust_remote_code=True)
    assert Path(model.base.name_or_path) == converted
    assert decodes(cli)
    assert decodes(cli + ["--base", str(base_folder[0])])
    capsys.readouterr()
    assert transcribe.main(cli + ["--base", str(tmp_path / "elsewhere")]) == transcribe.EXIT_USER_ERROR
    assert "elsewhere" in capsys.readouterr().err


def test_example_inference_snippet_prints_the_bases_greedy_transcript(artifact, tmp_path, capsys):
    """The short example a Hub folder ships (``python example_inference.py speech.wav``): audio at any rate,
    the artifact loaded through AutoModel, the text of the base's own greedy ids."""
    import numpy as np
    import soundfile as sf
    from transformers import AutoModel

    import example_inference

    samples = np.random.default_rng(0).normal(0, 0.1, 22_050).astype(np.float32)
    sf.write(tmp_path / "a.wav", np.stack([samples, samples[::-1]], axis=1), 22_050)  # stereo, 22.05 kHz
    text = example_inference.transcribe(str(tmp_path / "a.wav"), str(artifact), max_new_tokens=20)  # (a tiny base)
    model = AutoModel.from_pretrained(str(artifact), trust_remote_code=True)
    inputs = model.prepare_audio_inputs([example_inference.load_audio(str(tmp_path / "a.wav"))])
    greedy = model.generate(**inputs, use_medusa=False, max_new_tokens=20)
    assert text == model.decode_text(greedy, inputs)[0]
    assert "tokens per decoder pass" in capsys.readouterr().err


@requires_transformers5
def test_a_plain_whisper_folder_as_the_model_names_what_is_missing(base_folder, tmp_path, capsys):
    from tools import transcribe
    import numpy as np
    import soundfile as sf

    sf.write(tmp_path / "a.wav", np.zeros(1600, np.float32), 16000)
    code = transcribe.main([str(tmp_path / "a.wav"), "--model", str(base_folder[0]), "--quiet"])
    err = capsys.readouterr().err
    assert code == transcribe.EXIT_USER_ERROR and "MERaLiON" not in err
    assert f"{base_folder[0]} is a 'whisper' model, not a Medusa artifact" in err and "medusa_heads.safetensors" in err


@requires_transformers5
def test_max_new_tokens_limit_is_exact(artifact, tmp_path_factory):
    """The limit the CLI checks up front is the one generate enforces, for each Whisper prompt shape."""
    from modeling_medusa import MedusaForASR

    multilingual = MedusaForASR.from_base(str(build_tiny_whisper(tmp_path_factory.mktemp("ml"), seed=6,
                                                                 multilingual=True)))
    features = random_features(1, 2)
    for model, options in ((MedusaForASR.from_pretrained(str(artifact)), {}), (multilingual, {}),
                           (multilingual, {"language": "fr"}), (multilingual, {"task": "translate"})):
        limit = model.max_new_tokens_limit(**options)
        model.generate(input_features=features, max_new_tokens=limit, **options)
        with pytest.raises(ValueError, match="max_target_positions"):
            model.generate(input_features=features, max_new_tokens=limit + 1, **options)


@requires_transformers5
def test_speculation_off_and_sampling_fall_back_to_the_base(artifact):
    from modeling_medusa import MedusaForASR

    model = MedusaForASR.from_pretrained(str(artifact))
    features = random_features(1, 3)
    plain = model.base.generate(input_features=features, max_new_tokens=6)
    assert torch.equal(model.generate(input_features=features, max_new_tokens=6, use_medusa=False), plain)
    assert torch.equal(model.generate_medusa(input_features=features, max_new_tokens=6), plain)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.generate(input_features=features, max_new_tokens=4, do_sample=True, top_k=5)
    assert any("sampling" in str(w.message) for w in caught)
    _, stats = model.generate(input_features=features, max_new_tokens=6, return_stats=True)
    assert set(stats) >= {"rounds", "drafted_tokens", "accepted_tokens", "mean_accepted_per_round"}
    with pytest.raises(ValueError, match="input_features"):
        model.generate(max_new_tokens=3)


@requires_transformers5
def test_peft_adapter_base_is_loaded_and_merged(base_folder, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import WhisperForConditionalGeneration

    from modeling_medusa import MedusaForASR

    folder, _ = base_folder
    base = WhisperForConditionalGeneration.from_pretrained(str(folder))
    lora = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    lora.save_pretrained(tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(folder)
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps(config))
    merged = lora.merge_and_unload()
    model = MedusaForASR.from_base(str(tmp_path / "adapter"), family="whisper")
    features = random_features(1, 8)
    expected = merged.generate(input_features=features, max_new_tokens=8)
    assert torch.equal(model.generate(input_features=features, max_new_tokens=8), expected)
    assert not any("lora" in name for name, _ in model.base.named_parameters())


def test_heads_add_under_one_percent_to_meralion2_3b():
    """Counted on the meta device from MERaLiON-2-3B's text shapes (hidden 2304, 26 layers, vocab 256000)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    from modeling_medusa import MedusaHeads

    text = Gemma2Config(hidden_size=2304, num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4,
                        head_dim=256, intermediate_size=9216, vocab_size=256000)
    with torch.device("meta"):
        decoder = Gemma2ForCausalLM(text)
        heads = MedusaHeads(4, 1, 2304)
    base_params = sum(p.numel() for p in decoder.parameters())
    head_params = sum(p.numel() for p in heads.parameters())
    assert head_params / base_params < 0.01, (head_params, base_params)


@requires_transformers5
def test_auto_draft_falls_back_to_plain_greedy_when_heads_cannot_pay(artifact):
    """With measured accuracy 0 no draft can pay for its verify cost: auto picks plain greedy."""
    from modeling_medusa import MedusaForASR

    model = MedusaForASR.from_pretrained(str(artifact))
    model.config.head_accuracy = {"topk": [[0.0] * 4 for _ in range(4)]}
    model.config.tree = [[0], [1], [0, 0]]
    features = random_features(2, 5)
    got, stats = model.generate(input_features=features, max_new_tokens=10, return_stats=True)
    assert stats["draft"] == "none (plain greedy)" and stats["drafted_tokens"] == 0
    assert torch.equal(got, model.generate(input_features=features, max_new_tokens=10, use_medusa=False))


@requires_transformers5
def test_auto_draft_weighs_tree_sizes_by_measured_cost(artifact):
    """auto considers plain greedy, the chain, the config's tree and trees of other sizes, and picks the
    most expected tokens per second of verify time (costs injected here, timed on the device in use)."""
    from draft_policy import AUTO_TREE_SIZES, SMALLER_DRAFT_MARGIN, TimingKey
    from draft_timing import time_drafts
    from draft_trees import expected_tokens_per_round
    from modeling_medusa import MedusaForASR

    model = MedusaForASR.from_pretrained(str(artifact))
    accuracy = [[0.8, 0.9, 0.95], [0.6, 0.75, 0.85], [0.45, 0.6, 0.7], [0.3, 0.45, 0.55]]
    model.config.head_accuracy = {"topk": accuracy}
    model.config.tree = [[0], [1], [0, 0]]
    policy = model.draft_policy
    candidates = policy.candidates("auto")
    sizes = [tree.num_nodes - 1 for tree in candidates]
    assert sizes[:3] == [0, 4, 3] and set(AUTO_TREE_SIZES) <= set(sizes) and len(set(candidates)) == len(candidates)
    key = TimingKey("cpu", str(model.dtype), 1, False)
    for cost_per_node in (0.0, 1.0):  # free verification: the big trees win; costly: plain greedy
        policy.timings, policy.chosen = {}, {}
        time_drafts(policy, candidates, key, None, lambda tree: lambda: 1.0 + cost_per_node * (tree.num_nodes - 1))
        chosen = policy.choose(candidates, key)

        def rate(t):
            return (expected_tokens_per_round(t, accuracy) if t.num_nodes > 1 else 1.0) / policy.seconds(key, t)

        top = max(rate(t) for t in candidates)  # (the smallest of the candidates within the margin of the best)
        assert chosen == min((t for t in candidates if rate(t) >= top / (1 + SMALLER_DRAFT_MARGIN)),
                             key=lambda t: t.num_nodes)
        assert chosen.num_nodes >= 33 if cost_per_node == 0 else chosen.num_nodes == 1
        [record] = policy.measurements()  # what a benchmark records of auto's choice
        assert [c["nodes"] for c in record["candidates"] if c["chosen"]] == [chosen.num_nodes - 1]
        assert len(record["candidates"]) == len(candidates)


def test_a_base_that_needs_the_hub_without_a_network_says_how_to_skip_it(monkeypatch):
    """Offline, the Hub's client retries each file with back-off before the error: the error names the switch that
    skips the Hub, where the Hub could not be reached and the switch is not set already."""
    from modeling_medusa import BaseModelNotFound

    unreachable = "We couldn't connect to 'https://huggingface.co' to load the files"
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert "HF_HUB_OFFLINE=1 skips the Hub" in str(BaseModelNotFound("org/base", unreachable))
    assert "HF_HUB_OFFLINE" not in str(BaseModelNotFound("org/base", "404 Client Error: Repository Not Found"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "HF_HUB_OFFLINE" not in str(BaseModelNotFound("org/base", unreachable))


@requires_transformers5
def test_auto_draft_timings_are_kept_for_a_later_process(artifact, tmp_path, monkeypatch):
    """A model made later (as a new process makes it) with the same timings file recalls what auto timed: its first
    call times no verify pass and decodes the same ids with the same draft. What keys the timings names the machine and
    changes with the drafting settings; with a stand-in drafter nothing is kept."""
    from draft_policy import processor_name
    from modeling_medusa import MedusaForASR

    import draft_policy

    monkeypatch.setenv("MEDUSA_ASR_DRAFT_TIMINGS", str(tmp_path / "timings.json"))
    for bound in ("MAX_TIMING_SPREAD", "ORDER_SLACK"):  # (about recall: a busy machine's timings are kept all the same)
        monkeypatch.setattr(draft_policy, bound, float("inf"))
    accuracy = [[0.8, 0.9, 0.95], [0.6, 0.75, 0.85], [0.45, 0.6, 0.7], [0.3, 0.45, 0.55]]
    features = random_features(1, 5)

    def fresh_model():
        model = MedusaForASR.from_pretrained(str(artifact))
        model.config.head_accuracy = {"topk": accuracy}
        return model

    def counting_timers(model) -> list:
        import modeling_medusa

        timed, own_timer = [], modeling_medusa.verify_pass_timer
        monkeypatch.setattr(modeling_medusa, "verify_pass_timer", lambda *args: timed.append(args) or own_timer(*args))
        return timed

    first = fresh_model()
    first_timed = counting_timers(first)
    expected, first_stats = first.generate(input_features=features, max_new_tokens=10, return_stats=True)
    assert len(first_timed) >= 4 and (tmp_path / "timings.json").is_file()  # (plain greedy, the chain, trees)
    later = fresh_model()
    later_timed = counting_timers(later)
    got, stats = later.generate(input_features=features, max_new_tokens=10, return_stats=True)
    assert not later_timed and stats["draft"] == first_stats["draft"] and torch.equal(got, expected)

    context = later.timing_context()
    assert processor_name() in context and f"{torch.get_num_threads()} threads" in context
    later.set_options(int8_cpu_drafting=not later.options.int8_cpu_drafting)
    assert later.timing_context() != context
    later.drafter = lambda hidden: torch.zeros(*hidden.shape[:-1], 4, later.config.vocab_size)
    assert later.timing_context() is None


@requires_transformers5
def test_a_later_process_recalls_the_cpu_product_forms_instead_of_timing_them(artifact, tmp_path, monkeypatch):
    """The few-row product forms a process timed on this CPU are kept beside the draft timings: a model made later
    (as a new process makes it, the forms' choices forgotten) times none of them and decodes the same ids."""
    import cpu_kernels
    from modeling_medusa import MedusaForASR

    monkeypatch.setenv("MEDUSA_ASR_DRAFT_TIMINGS", str(tmp_path / "timings.json"))

    def forget_forms():  # (what a new process starts from)
        for forms in cpu_kernels.TIMED_FORMS.values():
            for state in ("chosen", "kept", "new", "_timings"):
                monkeypatch.setattr(forms, state, {})
        monkeypatch.setattr(cpu_kernels, "_RECALLED_CONTEXTS", set())

    features = random_features(1, 6)
    forget_forms()
    expected = MedusaForASR.from_pretrained(str(artifact)).generate(input_features=features, max_new_tokens=12,
                                                                    draft="chain")
    few_rows = cpu_kernels.FEW_ROWS_PRODUCT
    chosen = dict(few_rows.chosen)
    assert chosen and not few_rows.new  # timed in use, chosen, kept
    forget_forms()
    timed, own = [], few_rows._timed_in_use
    monkeypatch.setattr(few_rows, "_timed_in_use", lambda key, *rest: timed.append(key) or own(key, *rest))
    got = MedusaForASR.from_pretrained(str(artifact)).generate(input_features=features, max_new_tokens=12,
                                                               draft="chain")
    assert not set(timed) & set(chosen)  # (a product the first call had not finished timing is timed on)
    assert {key: few_rows.chosen[key] for key in chosen} == chosen and torch.equal(got, expected)
