"""Tests of the training pipeline (collect -> train -> export).

Most tests use a tiny fake MedusaForASR (a random output projection over a 40-token vocabulary and
a Markov-chain "transcriber"), so they run in seconds and do not depend on the model code. The end
to end tests run the real commands on a tiny random Whisper (and a MERaLiON-2 stand-in) when
``modeling_medusa.py`` provides the interface.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
torch.set_num_threads(1)

from conftest import has_table_row, requires_transformers5  # noqa: E402
from configuration_medusa import MedusaConfig  # noqa: E402
from modeling_medusa import MedusaForASR  # noqa: E402
from pipeline import collect, export, train, update_card  # noqa: E402
from pipeline.model_card import render_model_card  # noqa: E402
from tools import audio_io  # noqa: E402

V, H, EOS = 40, 32, 39
try:
    import soxr  # noqa: F401

    HAVE_SOXR = True
except ImportError:  # the transformers-4.51 venv has no soxr; clips are then written at 16 kHz
    HAVE_SOXR = False


# --------------------------------------------------------------------------- fake model
class FakeBackbone:
    """The part of a backbone the heads use: the output projection and the token embeddings."""

    def __init__(self, proj_out, embed):
        self.output_projection, self._embed = proj_out, embed

    def embed(self, tokens):
        return self._embed[tokens]


class FakeMedusa(MedusaForASR):
    """MedusaForASR (its real heads, drafters and saving) on a fake base: hiddens are noisy embeddings of
    the produced token, the 'transcript' follows t -> 3t+1 mod 39 with probability 0.85, so heads can
    learn something."""

    def __init__(self, heads: int = 4, layers: int = 1, head_kind: str = "medusa"):
        super().__init__(MedusaConfig(base_model_name_or_path="fake/base", base_family="whisper",
                                      medusa_num_heads=heads, medusa_num_layers=layers, head_kind=head_kind,
                                      hidden_size=H, vocab_size=V))
        g = torch.Generator().manual_seed(1234)
        self.embed = F.normalize(torch.randn(V, H, generator=g), dim=-1)
        self.proj_out = nn.Linear(H, V, bias=False)
        self.proj_out.weight.data.copy_(self.embed * 4.0)
        self.backbone = FakeBackbone(self.proj_out, self.embed)

    def prepare_audio_inputs(self, arrays, **prompt_options):
        self.prompt_options = prompt_options
        return {"audio_seed": torch.tensor([int(np.abs(a).sum() * 1000) % 2**31 for a in arrays])}

    def collect_hidden_states(self, audio_seed, max_new_tokens=128):
        rows = []
        for s in audio_seed.tolist():
            g = torch.Generator().manual_seed(s)
            n = min(max_new_tokens, 3 + s % 14)
            toks = [int(torch.randint(EOS, (1,), generator=g))]
            for _ in range(n - 2):
                det = float(torch.rand((), generator=g)) < 0.85
                toks.append((3 * toks[-1] + 1) % EOS if det else int(torch.randint(EOS, (1,), generator=g)))
            toks.append(EOS)
            tokens = torch.tensor(toks)
            hiddens = self.embed[tokens] * 3 + 0.05 * torch.randn(len(toks), H, generator=g)
            assert torch.equal(self.proj_out(hiddens).argmax(-1), tokens)
            rows.append((tokens, hiddens))
        return rows

    def save_pretrained(self, folder):
        from safetensors.torch import save_file

        os.makedirs(folder, exist_ok=True)
        self.config.save_pretrained(folder)
        save_file({k: v.contiguous() for k, v in self.medusa_heads.state_dict().items()},
                  os.path.join(folder, "medusa_heads.safetensors"))


class BatchSensitiveMedusa(FakeMedusa):
    """As a real base on a CPU: a row's hidden states depend, in their last bits, on the other rows of its batch."""

    def collect_hidden_states(self, audio_seed, max_new_tokens=128):
        shift = 0.01 * (int(audio_seed.sum()) % 7)
        return [(tokens, hiddens + shift) for tokens, hiddens in super().collect_hidden_states(audio_seed,
                                                                                               max_new_tokens)]


def killed_child(command, kill_at: int, argv: list[str], model) -> None:
    """``command(argv, model)`` in a forked process that kills itself (SIGKILL) in the middle of its
    ``kill_at``-th atomic write: the temporary file written, not yet renamed over its target."""
    from tools import files

    def run():
        real, calls = files.write_atomic_with, []

        def write_atomic_with(path, write):
            calls.append(path)
            if len(calls) != kill_at:
                return real(path, write)

            def write_then_die(temp_name):
                write(temp_name)
                os.kill(os.getpid(), signal.SIGKILL)

            return real(path, write_then_die)

        files.write_atomic_with = write_atomic_with
        command(argv, model=model)

    process = multiprocessing.get_context("fork").Process(target=run)
    process.start()
    process.join(300)
    assert process.exitcode == -signal.SIGKILL


def bit_identical(a, b) -> bool:
    """Nested dicts / lists / tensors equal to the bit."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(bit_identical(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(bit_identical(x, y) for x, y in zip(a, b))
    return a == b


def temporaries(folder) -> list[str]:
    return [name for name in os.listdir(folder) if ".tmp-" in name]


def write_clips(folder, n, seed=0):
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    rows = []
    for i in range(n):
        sr = 22050 if i % 3 == 0 and HAVE_SOXR else 16000  # exercises resampling
        audio = (0.1 * rng.standard_normal(int(sr * (0.2 + 0.05 * (i % 5))))).astype(np.float32)
        name = f"clip_{i:03d}.wav"
        sf.write(os.path.join(folder, name), audio, sr)
        rows.append({"id": f"utt{i:03d}", "audio": name, "voice": f"voice{i % 2}", "licence": "CC0-1.0",
                     "duration": len(audio) / sr})
    with open(os.path.join(folder, "manifest.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return folder


def utterance_table(folder):
    out = {}
    for path in collect.list_shards(folder):
        h, t, off, meta = collect.load_shard(path)
        for u, uid in enumerate(meta["utterance_ids"]):
            out[uid] = (t[off[u]:off[u + 1]], h[off[u]:off[u + 1]])
    return out


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    return write_clips(str(tmp_path_factory.mktemp("clips")), 48)


@pytest.fixture(scope="module")
def shards(clips, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("collect"))
    collect.main(["--base", "fake/base", "--audio", clips, "--out", out, "--batch-size", "8",
                  "--shard-size", "16"], model=FakeMedusa())
    return out


TRAIN_ARGS = ["--base", "fake/base", "--epochs", "3", "--batch-size", "4", "--val-fraction", "0.2",
              "--lr", "3e-2", "--save-every", "5", "--device", "cpu", "--seed", "0"]


# --------------------------------------------------------------------------- collect
def test_collect_shards_resume_and_info(clips, shards, tmp_path):
    full = utterance_table(shards)
    assert len(full) == 48 and len(collect.list_shards(shards)) == 3
    h, t, off, meta = collect.load_shard(collect.list_shards(shards)[0])
    assert h.dtype == torch.bfloat16 and t.dtype == torch.int64 and off.dtype == torch.int64
    assert off[0] == 0 and off[-1] == t.numel() == h.shape[0] and len(off) == 17
    assert meta["base"] == "fake/base" and meta["family"] == "whisper"

    out = str(tmp_path / "resumed")
    collect.main(["--base", "fake/base", "--audio", clips, "--out", out, "--limit", "10",
                  "--shard-size", "4", "--batch-size", "3"], model=FakeMedusa())
    assert [len(collect.read_shard_metadata(p)["utterance_ids"]) for p in collect.list_shards(out)] == [6, 4]
    # (a shard holds whole batches: the first batch end at or past --shard-size rows)
    info = collect.main(["--base", "fake/base", "--audio", clips, "--out", out, "--shard-size", "16"],
                        model=FakeMedusa())
    resumed = utterance_table(out)
    assert sorted(resumed) == sorted(full)  # nothing collected twice, nothing missing
    for uid, (tok, hid) in full.items():
        assert torch.equal(resumed[uid][0], tok) and torch.equal(resumed[uid][1], hid)
    assert info["n_utterances"] == 48 and info["n_tokens"] == sum(v[0].numel() for v in full.values())
    assert len(info["runs"]) == 2 and info["runs"][-1]["clips"] == 38
    assert info["throughput"]["clips_per_s"] > 0 and info["throughput"]["tokens_per_s"] > 0
    assert info["audio_source"]["voices"] == ["voice0", "voice1"]
    assert info["audio_source"]["licence"] == ["CC0-1.0"]
    on_disk = json.load(open(os.path.join(out, "collect_info.json")))
    assert on_disk["n_tokens"] == info["n_tokens"]
    durations = [json.loads(line)["duration"] for line in open(os.path.join(clips, "manifest.jsonl"))]
    assert info["audio_seconds"] == pytest.approx(sum(durations), abs=0.01)  # over both runs' clips
    assert info["runs"][-1]["audio_seconds"] == pytest.approx(sum(durations[10:]), abs=0.01)
    # a third run has nothing to do and loads no model
    info = collect.main(["--base", "fake/base", "--audio", clips, "--out", out])
    assert info["runs"][-1]["clips"] == 0
    with pytest.raises(SystemExit):  # another base into the same folder is refused
        collect.main(["--base", "other/base", "--audio", clips, "--out", out])


def test_collect_language_and_task_reach_the_model_and_resume_must_match(clips, tmp_path):
    out = str(tmp_path / "collect")
    model = FakeMedusa()
    common = ["--base", "fake/base", "--audio", clips, "--out", out, "--batch-size", "8", "--limit", "8"]
    info = collect.main([*common, "--language", "en", "--task", "transcribe"], model=model)
    assert model.prompt_options == {"language": "en", "task": "transcribe"}
    assert info["language"] == "en" and info["task"] == "transcribe"
    meta = collect.read_shard_metadata(collect.list_shards(out)[0])
    assert (meta["language"], meta["task"]) == ("en", "transcribe")
    with pytest.raises(SystemExit, match="--language 'en', not 'fr'"):
        collect.main([*common, "--language", "fr", "--task", "transcribe"], model=FakeMedusa())
    with pytest.raises(SystemExit, match="--task 'transcribe', not None"):
        collect.main([*common, "--language", "en"], model=FakeMedusa())


class TimestampedMedusa(FakeMedusa):
    """FakeMedusa that records whether a collect call asked for the base's timestamps."""

    def collect_hidden_states(self, audio_seed, max_new_tokens=128, return_timestamps=False):
        self.timestamps = return_timestamps
        return super().collect_hidden_states(audio_seed, max_new_tokens)


def test_collect_timestamps_reach_the_model_and_resume_must_match(clips, tmp_path):
    out = str(tmp_path / "collect")
    model = TimestampedMedusa()
    common = ["--base", "fake/base", "--audio", clips, "--out", out, "--batch-size", "8", "--limit", "8"]
    info = collect.main([*common, "--timestamps"], model=model)
    assert model.timestamps is True and info["timestamps"] is True
    assert collect.read_shard_metadata(collect.list_shards(out)[0])["timestamps"] == "true"
    with pytest.raises(SystemExit, match="collected with --timestamps"):
        collect.main([*common, "--limit", "16"], model=TimestampedMedusa())


class TwoWindowMedusa(FakeMedusa):
    """As the base's generate with timestamps: the clip whose seed is ``long_seed`` is decoded in two windows."""

    long_seed = None

    def collect_hidden_states(self, audio_seed, max_new_tokens=128, return_timestamps=False):
        rows = super().collect_hidden_states(audio_seed, max_new_tokens)
        return rows + [rows[i] for i, s in enumerate(audio_seed.tolist()) if s == self.long_seed]


def test_collect_leaves_out_a_clip_decoded_in_several_windows(clips, tmp_path):
    model = TwoWindowMedusa()
    model.long_seed = int(model.prepare_audio_inputs([collect.resolve_audio_source(clips)[0][3].load()])
                          ["audio_seed"][0])
    out = str(tmp_path / "collect")
    info = collect.main(["--base", "fake/base", "--audio", clips, "--out", out, "--batch-size", "4", "--limit", "8",
                         "--timestamps"], model=model)
    ids = collect.read_shard_metadata(collect.list_shards(out)[0])["utterance_ids"]
    whole = utterance_table(out)
    assert info["n_utterances"] == 7 and len(ids) == 7 and info["runs"][-1]["clips"] == 7
    assert [f["error"] for f in info["failed"]] == \
        ["decoded in 2 windows of the base's generate; one utterance is one window"]
    reference = str(tmp_path / "reference")
    collect.main(["--base", "fake/base", "--audio", clips, "--out", reference, "--batch-size", "4", "--limit", "8"],
                 model=FakeMedusa())
    for uid, (tokens, hiddens) in whole.items():  # the other clips' rows are theirs
        assert torch.equal(utterance_table(reference)[uid][0], tokens)


def test_train_from_trained_heads_keeps_their_weights_start_and_draft_vocabulary(shards, tmp_path):
    first = str(tmp_path / "first")
    train.main(["--data", shards, "--out", first, "--draft-vocab", "20"] + TRAIN_ARGS, model=FakeMedusa())
    trained = load_file(os.path.join(first, "best.safetensors"))
    model = FakeMedusa()
    metrics = train.main(["--data", shards, "--out", str(tmp_path / "tuned"), "--init-heads",
                          os.path.join(first, "best.safetensors"), "--max-steps", "1"] + TRAIN_ARGS, model=model)
    assert torch.equal(model.draft_vocab, trained["draft_vocab"])  # not rebuilt from the new data
    grown = FakeMedusa()
    train.main(["--data", shards, "--out", str(tmp_path / "grown"), "--init-heads", os.path.join(first, "best.safetensors"),
                "--draft-vocab", "30", "--max-steps", "1"] + TRAIN_ARGS, model=grown)
    assert set(trained["draft_vocab"].tolist()) < set(grown.draft_vocab.tolist())  # the heads' own and the new data's
    assert metrics["train_args"]["init_heads"].endswith("best.safetensors")
    training = export.build_training_data(metrics, [])["training"]
    assert training["init_heads"] == "first/best.safetensors"  # the heads' folder and file, not this machine's path
    fresh = FakeMedusa()
    train.main(["--data", shards, "--out", str(tmp_path / "fresh"), "--max-steps", "1"] + TRAIN_ARGS, model=fresh)
    name = next(n for n in trained if n != "draft_vocab")
    tuned_delta = (dict(model.medusa_heads.named_parameters())[name].detach() - trained[name]).abs().max()
    fresh_delta = (dict(fresh.medusa_heads.named_parameters())[name].detach() - trained[name]).abs().max()
    assert tuned_delta < fresh_delta  # one step from the trained heads, not from a fresh start


def test_timestamped_data_put_every_timestamp_in_the_draft_vocabulary(shards, tmp_path):
    """A segment may close at any time: with Whisper's timestamp ids (after <|notimestamps|>) in the data, the
    vocabulary of the most frequent tokens gains all of them; a base without timestamps gains none."""
    from types import SimpleNamespace

    plain = FakeMedusa()
    train.main(["--data", shards, "--out", str(tmp_path / "plain"), "--draft-vocab", "5", "--max-steps", "1"] + TRAIN_ARGS,
               model=plain)
    timestamped = FakeMedusa()
    timestamped.base = SimpleNamespace(generation_config=SimpleNamespace(no_timestamps_token_id=V - 5))
    train.main(["--data", shards, "--out", str(tmp_path / "ts"), "--draft-vocab", "5", "--max-steps", "1"] + TRAIN_ARGS,
               model=timestamped)
    assert len(plain.draft_vocab) == 5
    assert set(timestamped.draft_vocab.tolist()) == set(plain.draft_vocab.tolist()) | set(range(V - 4, V))


def test_trained_heads_grow_by_a_layer_that_starts_as_the_identity(shards, tmp_path):
    first = str(tmp_path / "first")
    train.main(["--data", shards, "--out", first, "--head-kind", "path"] + TRAIN_ARGS, model=FakeMedusa(head_kind="path"))
    trained = load_file(os.path.join(first, "best.safetensors"))
    one, two = FakeMedusa(head_kind="path"), FakeMedusa(layers=2, head_kind="path")
    train.load_heads_state(one, trained)
    train.load_heads_state(two, trained, grow=True)
    hidden, tokens = torch.randn(2, 5, H), torch.randn(2, 5, 4, H)
    assert torch.equal(one.medusa_heads.teacher_forced(hidden, tokens), two.medusa_heads.teacher_forced(hidden, tokens))
    with pytest.raises(SystemExit, match="missing"):
        train.load_heads_state(FakeMedusa(layers=2, head_kind="path"), trained)  # only a fine-tune grows heads
    grown = FakeMedusa(layers=2, head_kind="path")
    metrics = train.main(["--data", shards, "--out", str(tmp_path / "grown"), "--head-kind", "path", "--layers", "2",
                          "--init-heads", os.path.join(first, "best.safetensors"), "--max-steps", "2"] + TRAIN_ARGS,
                         model=grown)
    assert metrics["layers"] == 2
    added = grown.medusa_heads.blocks[0].stack.layers[1].weight
    assert added.abs().max() > 0  # trained from the identity
    with pytest.raises(SystemExit, match="unexpected"):
        train.load_heads_state(FakeMedusa(head_kind="path"), train.heads_state(grown))  # no shrinking


def test_prefix_attention_heads_train_replay_and_are_refused_by_export(shards, tmp_path):
    """--prefix-attention (an experiment): the heads start from a causal attention over the hiddens so far, which
    starts as the identity when grown from trained heads; replay runs it, export refuses it in one line."""
    from pipeline.prefix_attention import PrefixAttention

    first = str(tmp_path / "first")
    train.main(["--data", shards, "--out", first, "--head-kind", "path"] + TRAIN_ARGS, model=FakeMedusa(head_kind="path"))
    ckpt = str(tmp_path / "prefix")
    model = FakeMedusa(head_kind="path")
    metrics = train.main(["--data", shards, "--out", ckpt, "--head-kind", "path", "--prefix-attention",
                          "--init-heads", os.path.join(first, "best.safetensors")] + TRAIN_ARGS, model=model)
    assert metrics["train_args"]["prefix_attention"] and metrics["draft_candidates"][0]["tokens_per_round"] >= 1
    saved = load_file(os.path.join(ckpt, "best.safetensors"))
    assert any(name.startswith("prefix.") for name in saved)
    layer = PrefixAttention(H)
    hidden = torch.randn(2, 6, H)
    assert torch.equal(layer(hidden), hidden)  # the identity until trained
    with torch.no_grad():
        layer.out.weight.normal_()
        early = layer(hidden[:, :3])
    assert torch.allclose(layer(hidden)[:, :3], early, atol=1e-5)  # causal: later tokens change nothing before
    with pytest.raises(SystemExit, match="prefix-attention"):
        export.main(["--base", "fake/base", "--heads", os.path.join(ckpt, "best.safetensors"),
                     "--out", str(tmp_path / "artifact")], model=FakeMedusa(head_kind="path"))


def test_train_on_several_collect_folders_records_each_in_the_artifact(clips, tmp_path):
    english, french = str(tmp_path / "collect_en"), str(tmp_path / "collect_fr")
    common = ["--base", "fake/base", "--audio", clips, "--batch-size", "8"]
    collect.main([*common, "--out", english, "--limit", "24", "--timestamps"], model=TimestampedMedusa())
    collect.main([*common, "--out", french, "--skip", "24", "--language", "fr"], model=FakeMedusa())
    ckpt = str(tmp_path / "ckpt")
    metrics = train.main(["--data", english, "--data", french, "--out", ckpt] + TRAIN_ARGS, model=FakeMedusa())
    assert metrics["data"]["n_utterances"] == 48 and len(metrics["data"]["dir"]) == 2
    assert sum(name.startswith("collect_fr/") for name in metrics["data"]["shards"]) == 1
    art = str(tmp_path / "artifact")
    export.main(["--base", "fake/base", "--heads", os.path.join(ckpt, "best.safetensors"), "--out", art],
                model=FakeMedusa())
    td = json.load(open(os.path.join(art, "config.json")))["training_data"]
    assert td["n_utterances"] == 48 and td["languages"] == ["fr"] and td["timestamps"] is True
    assert [(p.get("language"), p.get("timestamps"), p["n_utterances"]) for p in td["parts"]] == \
        [(None, True, 24), ("fr", None, 24)]


def fails_on_call(call: int, error: BaseException) -> FakeMedusa:
    """A FakeMedusa whose ``call``-th collect_hidden_states raises ``error``."""

    class Failing(FakeMedusa):
        calls = 0

        def collect_hidden_states(self, **kw):
            self.calls += 1
            if self.calls == call:
                raise error
            return super().collect_hidden_states(**kw)

    return Failing()


def test_collect_killed_mid_write_resumes_to_the_same_bits(clips, tmp_path):
    """kill -9 while a shard is written, then a rerun: no temporary file left, and every utterance's tokens and
    hidden states bit-identical to an uninterrupted run's, on a base whose states depend on their batch."""
    common = ["--base", "fake/base", "--audio", clips, "--batch-size", "3", "--shard-size", "4", "--limit", "12"]
    collect.main([*common, "--out", str(tmp_path / "whole")], model=BatchSensitiveMedusa())
    out = tmp_path / "killed"
    killed_child(collect.main, 2, [*common, "--out", str(out)], BatchSensitiveMedusa())
    assert temporaries(out) and len(utterance_table(str(out))) < 12
    collect.main([*common, "--out", str(out)], model=BatchSensitiveMedusa())
    whole, resumed = utterance_table(str(tmp_path / "whole")), utterance_table(str(out))
    assert sorted(resumed) == sorted(whole)
    for uid, (tokens, hiddens) in whole.items():
        assert torch.equal(resumed[uid][0], tokens) and torch.equal(resumed[uid][1], hiddens), uid
    assert not temporaries(out)


def test_collect_crash_keeps_finished_shards(clips, shards, tmp_path):
    out = str(tmp_path / "crash")
    crashing = fails_on_call(4, RuntimeError("out of memory (simulated)"))
    with pytest.raises(RuntimeError, match="simulated"):
        collect.main(["--base", "fake/base", "--audio", clips, "--out", out, "--batch-size", "2",
                      "--shard-size", "4", "--limit", "12"], model=crashing)
    # the 6 clips decoded before the crash are kept (a full shard of 4 + the 2 pending)
    assert len(utterance_table(out)) == 6 and not [n for n in os.listdir(out) if n.endswith(".tmp")]
    collect.main(["--base", "fake/base", "--audio", clips, "--out", out, "--batch-size", "2",
                  "--shard-size", "4", "--limit", "12"], model=FakeMedusa())
    table, full = utterance_table(out), utterance_table(shards)
    assert sorted(table) == [f"utt{i:03d}" for i in range(12)]
    assert all(torch.equal(table[u][1], full[u][1]) for u in table)


def test_corrupt_shard_or_checkpoint_is_one_line_naming_the_file(clips, shards, tmp_path, capsys):
    """A truncated shard (collect, train) or last.pt (train): one 'error:' line naming the file and the fix,
    exit status 2, no traceback."""
    import shutil

    broken = tmp_path / "collect"
    shutil.copytree(shards, broken)
    shard = collect.list_shards(str(broken))[1]
    data = open(shard, "rb").read()
    open(shard, "wb").write(data[: len(data) // 2])
    capsys.readouterr()
    code = collect.run_cli(lambda argv: collect.main(["--base", "fake/base", "--audio", clips, "--out", str(broken)],
                                                     model=FakeMedusa()))
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"error: {shard} is truncated or corrupt")
    assert "rerun pipeline.collect" in err
    code = train.run_cli(lambda argv: train.main(["--data", str(broken), "--out", str(tmp_path / "ckpt")] + TRAIN_ARGS,
                                                 model=FakeMedusa()))
    assert code == 2 and f"error: {shard} is truncated or corrupt" in capsys.readouterr().err

    ckpt = tmp_path / "ckpt2"
    train.main(["--data", shards, "--out", str(ckpt), "--max-steps", "2"] + TRAIN_ARGS, model=FakeMedusa())
    last = ckpt / "last.pt"
    last.write_bytes(last.read_bytes()[:100])
    capsys.readouterr()
    code = train.run_cli(lambda argv: train.main(["--data", shards, "--out", str(ckpt)] + TRAIN_ARGS,
                                                 model=FakeMedusa()))
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"{last} is truncated or corrupt" in err and "--no-resume" in err


def test_a_missing_evaluation_set_stops_training_before_its_first_step(shards, tmp_path, capsys):
    """The real recordings' replay runs after the last epoch: a wrong --eval-data is named at once, not then."""
    ckpt = tmp_path / "ckpt"
    code = train.run_cli(lambda argv: train.main(["--data", shards, "--out", str(ckpt), "--eval-data",
                                                  str(tmp_path / "no_such_collect")] + TRAIN_ARGS, model=FakeMedusa()))
    err = capsys.readouterr().err
    assert code == 2 and "no_such_collect" in err and "pipeline.collect" in err
    assert not (ckpt / "best.safetensors").exists() and not (ckpt / "last.pt").exists()


def test_ctrl_c_during_collect_is_one_line_and_keeps_only_whole_shards(clips, tmp_path, capsys):
    out = tmp_path / "collect"
    code = collect.run_cli(lambda argv: collect.main(["--base", "fake/base", "--audio", clips, "--out", str(out),
                                                      "--batch-size", "2", "--shard-size", "3", "--limit", "10"],
                                                     model=fails_on_call(3, KeyboardInterrupt())))
    err = capsys.readouterr().err
    assert code == 130 and "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith("interrupted")]
    assert sorted(utterance_table(str(out))) == [f"utt{i:03d}" for i in range(4)]  # both decoded batches, whole
    assert not [name for name in os.listdir(out) if name.startswith(".")]


def test_collect_folder_without_manifest_and_missing_datasets(tmp_path):
    folder = tmp_path / "plain"
    folder.mkdir()
    sf.write(folder / "a.wav", np.zeros(8000, np.float32), 8000)
    sf.write(folder / "b.wav", np.zeros(4000, np.float32), 16000)
    utts, info = collect.resolve_audio_source(str(folder))
    assert [u.id for u in utts] == ["a", "b"] and info["kind"] == "folder"
    assert utts[1].load().shape == (4000,)
    if HAVE_SOXR:
        assert utts[0].load().shape == (16000,)
    try:
        import datasets  # noqa: F401
    except ImportError:
        with pytest.raises(SystemExit, match="datasets"):
            collect.resolve_audio_source("some-org/some-dataset")


# --------------------------------------------------------------------------- train
def test_batch_inputs_and_targets():
    class D:
        tokens = torch.arange(100, 110)
        starts = torch.tensor([0, 4])
        lengths = torch.tensor([4, 6])
        hiddens = torch.arange(10.0)[:, None].expand(10, 3)
        speech = None

    index = torch.arange(120)
    batch = train.make_batch(D, [0, 1], num_heads=2, vocab_index=index, device="cpu", with_targets_hidden=True)
    assert batch.targets[0, :, 0].tolist() == [101, 102, 103, -100, -100, -100]
    assert batch.targets[0, :, 1].tolist() == [102, 103, -100, -100, -100, -100]
    assert batch.targets[1, :, 0].tolist() == [105, 106, 107, 108, 109, -100]
    assert batch.targets[1, :, 1].tolist() == [106, 107, 108, 109, -100, -100]
    assert batch.inputs[1, :5, 0].tolist() == [104, 105, 106, 107, 108]  # each head's path ends after tokens[t+k]
    assert batch.inputs[1, :4, 1].tolist() == [105, 106, 107, 108]
    assert batch.hiddens[0, :, 0].tolist() == [0, 1, 2, 3, 0, 0]  # padding is zero
    assert batch.target_hiddens[1, 0, :, 0].tolist() == [5, 6]  # hiddens[t+k+1]: the base's distribution there
    outside = torch.full((120,), -100)
    outside[[101, 106]] = torch.tensor([0, 1])  # a draft vocabulary of two tokens
    small = train.make_batch(D, [0, 1], num_heads=1, vocab_index=outside, device="cpu", with_targets_hidden=False)
    assert small.targets[0, :, 0].tolist() == [0, -100, -100, -100, -100, -100]
    assert small.targets[1, :, 0].tolist() == [-100, 1, -100, -100, -100, -100]


def test_train_resume_equals_uninterrupted(shards, tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    full = train.main(["--data", shards, "--out", a] + TRAIN_ARGS, model=FakeMedusa())
    assert full["finished"]
    stopped = train.main(["--data", shards, "--out", b, "--max-steps", "7"] + TRAIN_ARGS, model=FakeMedusa())
    assert not stopped["finished"]
    assert torch.load(os.path.join(b, "last.pt"), weights_only=True)["step"] == 7
    resumed = train.main(["--data", shards, "--out", b] + TRAIN_ARGS, model=FakeMedusa())
    assert resumed["finished"]
    for name in ("best.safetensors",):
        x, y = load_file(os.path.join(a, name)), load_file(os.path.join(b, name))
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
    la = torch.load(os.path.join(a, "last.pt"), weights_only=True)
    lb = torch.load(os.path.join(b, "last.pt"), weights_only=True)
    assert all(torch.equal(la["heads"][k], lb["heads"][k]) for k in la["heads"])
    ma, mb = (json.load(open(os.path.join(d, "metrics.json"))) for d in (a, b))
    for key in ("step", "val_loss", "head_accuracy", "history"):
        assert ma[key] == mb[key]
    assert [h["step"] for h in ma["history"]] == [full["steps_per_epoch"] * e for e in (1, 2, 3)]
    # training helped: the first head beats chance by far and the loss went down
    assert ma["head_accuracy"]["top1"][0] > 0.5
    # changing the trajectory settings is refused on resume
    with pytest.raises(SystemExit, match="different settings"):
        train.main(["--data", shards, "--out", b, "--lr", "1e-3"] + TRAIN_ARGS[:8] + ["--device", "cpu"],
                   model=FakeMedusa())


def test_train_killed_mid_checkpoint_resumes_to_the_same_bits(shards, tmp_path):
    """kill -9 while last.pt is written (after best.safetensors and metrics.json of that step), then a rerun: no
    temporary file left; heads, optimiser, best checkpoint and metrics bit-identical to an uninterrupted run's."""
    whole, out = tmp_path / "whole", tmp_path / "killed"
    train.main(["--data", shards, "--out", str(whole)] + TRAIN_ARGS, model=FakeMedusa())
    # writes: last.pt (step 5); best.safetensors, metrics.json, last.pt (step 10)
    killed_child(train.main, 4, ["--data", shards, "--out", str(out)] + TRAIN_ARGS, FakeMedusa())
    assert temporaries(out) and torch.load(out / "last.pt", weights_only=True)["step"] == 5
    train.main(["--data", shards, "--out", str(out)] + TRAIN_ARGS, model=FakeMedusa())
    assert not temporaries(out)
    x, y = load_file(whole / "best.safetensors"), load_file(out / "best.safetensors")
    assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
    la, lb = (torch.load(folder / "last.pt", weights_only=True) for folder in (whole, out))
    assert bit_identical(la, lb)  # heads, optimiser, scheduler, step, history
    ma, mb = (json.loads((folder / "metrics.json").read_text()) for folder in (whole, out))
    assert {k: v for k, v in ma.items() if k != "data"} == {k: v for k, v in mb.items() if k != "data"}


def test_best_checkpoint_selection(shards, tmp_path, monkeypatch):
    losses, snapshots = iter([3.0, 1.0, 2.0]), []
    real_evaluate = train.evaluate

    def fake_evaluate(model, *a, **k):
        result = real_evaluate(model, *a, **k)
        snapshots.append(train.heads_state(model))
        return {**result, "val_loss": next(losses)}

    monkeypatch.setattr(train, "evaluate", fake_evaluate)
    out = str(tmp_path / "ckpt")
    metrics = train.main(["--data", shards, "--out", out] + TRAIN_ARGS, model=FakeMedusa())
    assert len(snapshots) == 3
    best = load_file(os.path.join(out, "best.safetensors"))
    assert all(torch.equal(best[k], snapshots[1][k]) for k in best)
    assert not all(torch.equal(best[k], snapshots[2][k]) for k in best)
    saved = json.load(open(os.path.join(out, "metrics.json")))
    assert saved["val_loss"] == 1.0 and saved["step"] == 2 * metrics["steps_per_epoch"]
    assert [h["val_loss"] for h in saved["history"]] == [3.0, 1.0, 2.0] and saved["finished"]


def test_train_bf16_autocast(shards, tmp_path):
    args = [a if a != "3" else "2" for a in TRAIN_ARGS]  # 2 epochs
    m = train.main(["--data", shards, "--out", str(tmp_path / "amp"), "--amp", "bf16"] + args, model=FakeMedusa())
    assert m["finished"] and m["head_accuracy"]["top1"][0] > 0.3  # chance: 1/40
    assert load_file(str(tmp_path / "amp" / "best.safetensors"))["blocks.0.layers.0.weight"].dtype == torch.float32


def test_accuracy_report_matches_brute_force(shards, tmp_path):
    out = str(tmp_path / "ckpt")
    train.main(["--data", shards, "--out", out] + TRAIN_ARGS, model=FakeMedusa())
    m = json.load(open(os.path.join(out, "metrics.json")))
    acc = m["head_accuracy"]
    assert len(acc["top1"]) == len(acc["top5"]) == len(acc["topk"]) == 4
    for k in range(4):
        row = acc["topk"][k]
        assert len(row) == 10 and all(0 <= x <= 1 for x in row)
        assert all(row[j] <= row[j + 1] for j in range(9))
        assert row[0] == acc["top1"][k] and row[4] == acc["top5"][k]

    # brute force: utterance by utterance, position by position, with the best heads
    model = FakeMedusa()
    train.load_heads_state(model, load_file(os.path.join(out, "best.safetensors")))
    data = train.Collected(shards)
    _, val = train.split_utterances(data.ids, data.lengths, 0.2, 0, 2)
    assert m["data"]["n_val_utterances"] == len(val) == round(0.2 * 48)
    hits, counts, ce = np.zeros((4, 10)), np.zeros(4), np.zeros(4)
    with torch.no_grad():
        for u in val:
            s, n = int(data.starts[u]), int(data.lengths[u])
            toks, hid = data.tokens[s:s + n], data.hiddens[s:s + n].float()
            for t in range(n):
                logits = model.head_logits(hid[t])
                for k in range(4):
                    if t + k + 1 < n:
                        target = int(toks[t + k + 1])
                        rank = int((logits[k] > logits[k, target]).sum())
                        hits[k, rank:] += 1 if rank < 10 else 0
                        counts[k] += 1
                        ce[k] += float(F.cross_entropy(logits[k][None], torch.tensor([target])))
    assert acc["n_positions"] == counts.astype(int).tolist()
    np.testing.assert_allclose(np.array(acc["topk"]), hits / counts[:, None], atol=1e-5)
    np.testing.assert_allclose(m["val_loss"], (ce / counts).sum(), rtol=1e-4)
    # the split is by utterance and deterministic
    tr, va = train.split_utterances(data.ids, data.lengths, 0.2, 0, 2)
    assert not set(tr) & set(va) and va == val
    assert train.split_utterances(data.ids, data.lengths, 0.2, 1, 2)[1] != val


# --------------------------------------------------------------------------- export + model card
def test_export_artifact_and_model_card(shards, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    train.main(["--data", shards, "--out", ckpt] + TRAIN_ARGS, model=FakeMedusa())
    bench = tmp_path / "bench.json"  # a committed tools.benchmark run (the command that made it inside)
    bench.write_text((Path(ROOT) / "benchmarks" / "real_speech" / "cpu_tiny.en_auto" / "results.json").read_text())
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps({"description": "synthetic test clips"}))
    art = str(tmp_path / "artifact")
    args = ["--base", "fake/base", "--heads", os.path.join(ckpt, "best.safetensors"), "--out", art,
            "--benchmark", str(bench), "--data-info", str(extra), "--license", "mit", "--tree-nodes", "6"]
    export.main(args, model=FakeMedusa())
    import importlib.util

    plotted = importlib.util.find_spec("matplotlib") is not None  # (not in the MERaLiON-2 environment)
    assert sorted(os.listdir(art)) == ["README.md", "config.json", "medusa_heads.safetensors", "results.json",
                                       *(["speedup.png"] if plotted else [])]
    cfg = json.load(open(os.path.join(art, "config.json")))
    td = cfg["training_data"]
    assert td["n_utterances"] == 48 and td["voices"] == ["voice0", "voice1"] and td["licence"] == ["CC0-1.0"]
    assert td["description"] == "synthetic test clips" and td["kind"] == "manifest"
    assert td["n_val_utterances"] + td["n_train_utterances"] == 48
    assert not any(str(v).startswith("/") for v in td.values())  # no local paths leak
    metrics = json.load(open(os.path.join(ckpt, "metrics.json")))
    assert cfg["head_accuracy"]["topk"] == metrics["head_accuracy"]["topk"]
    assert not cfg.get("benchmark")  # (the rows live in results.json)
    results = json.load(open(os.path.join(art, "results.json")))
    summary = json.loads(bench.read_text())["summary"]
    assert results["command"].startswith("python -m pipeline.export --base fake/base")
    [row] = results["rows"]
    assert row["mean_accepted_per_round"] == summary["mean_accepted_per_round"]
    assert row["command"] == json.loads(bench.read_text())["settings"]["command"]
    assert isinstance(cfg["tree"], list) and len(cfg["tree"]) == 6
    best = load_file(os.path.join(ckpt, "best.safetensors"))
    shipped = load_file(os.path.join(art, "medusa_heads.safetensors"))
    assert all(torch.equal(best[k], shipped[k]) for k in best)

    import yaml
    from huggingface_hub import ModelCard

    card = open(os.path.join(art, "README.md")).read()
    front = yaml.safe_load(card.split("---\n")[1])
    assert front["base_model"] == "fake/base" and front["library_name"] == "transformers"
    assert front["pipeline_tag"] == "automatic-speech-recognition" and front["license"] == "mit"
    assert {"medusa", "speculative-decoding"} <= set(front["tags"])
    assert ModelCard(card).data.to_dict() == front  # the Hub reads the same metadata
    assert "trust_remote_code=True" in card and "model.generate" in card and ("](speedup.png)" in card) == plotted
    speedup = f"{summary['speedup_sum_latency']:.2f}×"
    assert has_table_row(card, "whisper-tiny.en", "CPU (AMD EPYC)", "float32", summary["draft_ran"],
                         f"{summary['mean_accepted_per_round']:.2f}", speedup)
    assert "Held-out top-1 accuracy per head" in card

    # re-export as a chain replaces the folder atomically; stray temp folders are gone
    export.main(args + ["--tree", "chain"], model=FakeMedusa())
    assert json.load(open(os.path.join(art, "config.json")))["tree"] is None
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]
    # exporting into a folder holding other files (e.g. a git checkout) updates only our files
    (tmp_path / "artifact" / "NOTES.txt").write_text("keep me")
    export.main(args, model=FakeMedusa())
    assert (tmp_path / "artifact" / "NOTES.txt").read_text() == "keep me"
    assert isinstance(json.load(open(os.path.join(art, "config.json")))["tree"], list)

    # a new run of the same measurement replaces its row and the card is rendered again; the heads stay
    rerun = json.loads(bench.read_text())
    rerun["summary"].update(mean_accepted_per_round=2.75, speedup_sum_latency=1.9)
    bench.write_text(json.dumps(rerun))
    before = load_file(os.path.join(art, "medusa_heads.safetensors"))
    [row] = update_card.update_card(Path(art), [bench])
    assert row["mean_accepted_per_round"] == 2.75
    assert json.load(open(os.path.join(art, "results.json")))["rows"] == [row]
    assert has_table_row(open(os.path.join(art, "README.md")).read(), "whisper-tiny.en", "CPU (AMD EPYC)",
                         "float32", summary["draft_ran"], "2.75", "1.90×")
    after = load_file(os.path.join(art, "medusa_heads.safetensors"))
    assert all(torch.equal(before[k], after[k]) for k in before)


def modes(folder) -> dict:
    """Permission bits of a folder and everything in it, by path relative to the folder."""
    paths = [Path(folder), *sorted(p for p in Path(folder).rglob("*") if not p.is_symlink())]
    return {os.path.relpath(p, folder): oct(p.stat().st_mode & 0o777) for p in paths}


def test_pipeline_outputs_are_world_readable_like_any_download(clips, tmp_path):
    """Under umask 022 every file collect, train and export write is 0644 and every folder 0755 (mkstemp and
    mkdtemp made them 0600/0700)."""
    previous = os.umask(0o022)
    try:
        col, ckpt, art = (str(tmp_path / d) for d in ("collect", "ckpt", "artifact"))
        collect.main(["--base", "fake/base", "--audio", clips, "--out", col, "--limit", "6", "--shard-size", "4"],
                     model=FakeMedusa())
        train.main(["--data", col, "--out", ckpt] + TRAIN_ARGS[:2] + ["--epochs", "1", "--device", "cpu"],
                   model=FakeMedusa())
        export.main(["--base", "fake/base", "--heads", os.path.join(ckpt, "best.safetensors"), "--out", art],
                    model=FakeMedusa())
    finally:
        os.umask(previous)
    for folder in (col, ckpt, art):
        found = modes(folder)
        assert {m for p, m in found.items() if os.path.isdir(os.path.join(folder, p))} == {"0o755"}, found
        assert {m for p, m in found.items() if os.path.isfile(os.path.join(folder, p))} == {"0o644"}, found


def test_model_card_uses_the_family_default_max_new_tokens():
    """One default per family (its backbone's ``default_max_new_tokens``): the card's snippet asks the model for
    it, as the transcription command does."""
    import types

    from modeling_medusa import BACKBONES, MedusaForASR

    card = render_model_card(MedusaConfig(base_model_name_or_path="org/base", base_family="whisper",
                                          hidden_size=8, vocab_size=10))
    assert "model.generate(**inputs, max_new_tokens=model.default_max_new_tokens" in card
    declared = {family: MedusaForASR.default_max_new_tokens.fget(types.SimpleNamespace(family=family))
                for family in BACKBONES}
    assert declared == {"whisper": 224, "meralion2": 1536}


def test_export_never_replaces_a_foreign_or_committed_folder_unless_forced(shards, tmp_path, capsys):
    """An existing --out must be empty or a previous export that git does not track (a shipped artifact);
    --force overrides."""
    import shutil
    import subprocess

    ckpt = str(tmp_path / "ckpt")
    train.main(["--data", shards, "--out", ckpt] + TRAIN_ARGS, model=FakeMedusa())
    export_to = lambda out, *extra: export.run_cli(lambda argv: export.main(  # noqa: E731
        ["--base", "fake/base", "--heads", os.path.join(ckpt, "best.safetensors"), "--out", str(out), *extra],
        model=FakeMedusa()))
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "NOTES.txt").write_text("mine")
    capsys.readouterr()
    assert export_to(foreign) == 2 and "not a previous export" in capsys.readouterr().err
    assert os.listdir(foreign) == ["NOTES.txt"]
    assert export_to(foreign, "--force") == 0 and (foreign / "medusa_heads.safetensors").is_file()
    assert (foreign / "NOTES.txt").read_text() == "mine"

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    shipped = tmp_path / "repo" / "heads" / "x"
    assert export_to(shipped) == 0 and export_to(shipped) == 0  # a previous export is replaced
    git = ["git", "-C", str(tmp_path / "repo"), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git[:3], "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "ship"], check=True)
    before = (shipped / "medusa_heads.safetensors").read_bytes()
    capsys.readouterr()
    assert export_to(shipped) == 2 and "committed to git" in capsys.readouterr().err
    assert (shipped / "medusa_heads.safetensors").read_bytes() == before
    assert export_to(shipped, "--force") == 0


def _train_heads_calls(tmp_path, runs) -> list[list[str]]:
    """pipeline/train_heads.sh run once per ``(arguments, environment)`` with a stand-in python that records each
    command it is given; those commands, split into words."""
    import subprocess

    fake_python = tmp_path / "python"
    fake_python.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "calls"}\n')
    fake_python.chmod(0o755)
    script = os.path.join(ROOT, "pipeline", "train_heads.sh")
    for arguments, env in runs:
        subprocess.run(["bash", script, *arguments], cwd=tmp_path, check=True,
                       env={**os.environ, "PYTHON": str(fake_python), **env})
    return [line.split() for line in (tmp_path / "calls").read_text().splitlines()]


def test_train_heads_sh_exports_to_a_work_folder_by_default(tmp_path):
    """pipeline/train_heads.sh BASE wrote into heads/<base name>, replacing the shipped artifact; its default
    is now WORK_DIR/artifacts/<base name>, and FORCE=1 passes --force."""
    calls = _train_heads_calls(tmp_path, [(["/models/whisper-tiny.en"], env) for env in ({}, {"FORCE": "1"})])
    exports = [call for call in calls if "pipeline.export" in call]
    assert [call[call.index("--out") + 1] for call in exports] == ["work_data/artifacts/whisper-tiny.en"] * 2
    assert ["--force" in call for call in exports] == [False, True]


def test_train_heads_sh_runs_the_shipped_recipe_by_default(tmp_path):
    """Path heads attending to the speech (collected with --speech) unless HEADS names another recipe."""
    calls = _train_heads_calls(tmp_path, [(["/models/whisper-tiny.en"], {"HEADS": heads} if heads else {})
                                          for heads in ("", "medusa")])
    collects = [c for c in calls if "pipeline.collect" in c]
    trains = [c for c in calls if "pipeline.train" in c]
    assert ["--speech" in c for c in collects] == [True, False]
    assert [("--speech-attention" in c, "path" in c) for c in trains] == [(True, True), (False, False)]


def test_train_heads_sh_replays_on_every_eval_folder_named(tmp_path):
    """EVAL_DATA=A,B (e.g. real speech collected plain and with timestamps): one --eval-data each."""
    calls = _train_heads_calls(tmp_path, [(["/models/whisper-base"], {"EVAL_DATA": eval_data})
                                          for eval_data in ("real,real_ts", "")])
    trains = [c for c in calls if "pipeline.train" in c]
    assert [[c[i + 1] for i, word in enumerate(c) if word == "--eval-data"] for c in trains] == [["real", "real_ts"], []]


def test_train_heads_sh_passes_layers_and_soft_labels(tmp_path):
    """LAYERS and SOFT_LABELS reach the training step (defaults: one layer, half the base's own distribution)."""
    calls = _train_heads_calls(tmp_path, [(["/models/whisper-base"], env)
                                          for env in ({}, {"LAYERS": "2", "SOFT_LABELS": "1.0"})])
    trains = [c for c in calls if "pipeline.train" in c]
    assert [(c[c.index("--layers") + 1], c[c.index("--soft-labels") + 1]) for c in trains] == [("1", "0.5"), ("2", "1.0")]


def test_train_heads_sh_collects_your_own_audio_and_logs_each_step(tmp_path):
    """AUDIO=folder collects from it without synthesising speech (and claims no synthetic manifest);
    MAX_NEW_TOKENS reaches the collect; STEP_LOG gets one JSON line per step, in order, naming its output."""
    calls = _train_heads_calls(tmp_path, [(["/models/MERaLiON-2-3B", "work"], {
        "AUDIO": "/data/my_calls", "HEADS": "path", "MAX_NEW_TOKENS": "96", "STEP_LOG": str(tmp_path / "steps.jsonl")})])
    assert not [c for c in calls if "pipeline.synth_speech" in c]
    collect_call = next(c for c in calls if "pipeline.collect" in c)
    assert collect_call[collect_call.index("--audio") + 1] == "/data/my_calls"
    assert collect_call[collect_call.index("--max-new-tokens") + 1] == "96"
    assert "--data-info" not in next(c for c in calls if "pipeline.export" in c)
    steps = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [(s["step"], s["out"]) for s in steps] == [
        ("collect", "work/collect"), ("train", "work/ckpt"), ("export", "work/artifacts/MERaLiON-2-3B")]
    assert all(s["start"] <= s["end"] for s in steps)


def test_model_card_minimal_config():
    """A card with nothing measured yet names no local path as a Hub link and no licence it cannot know."""
    card = render_model_card(MedusaConfig(base_model_name_or_path="/local/base", base_family="whisper",
                                          hidden_size=8, vocab_size=10))
    assert card.startswith("---\n") and "license: other" in card and "No benchmark rows" in card
    assert "huggingface.co//local" not in card


def test_collect_from_hf_dataset(tmp_path, monkeypatch):
    """The HF-dataset branch, with a stand-in ``datasets`` module (the real one is optional)."""
    import types

    rng = np.random.default_rng(1)
    rows = [{"id": f"hf{i}", "audio": {"array": rng.standard_normal(3200 + 160 * i) * 0.1,
                                        "sampling_rate": 16000}} for i in range(6)]

    class FakeDataset:
        column_names = ["id", "audio"]
        info = types.SimpleNamespace(license="cc-by-4.0")

        def __len__(self):
            return len(rows)

        def __getitem__(self, key):
            return [r[key] for r in rows] if isinstance(key, str) else rows[key]

    calls = []
    fake = types.ModuleType("datasets")
    fake.load_dataset = lambda name, config, split: calls.append((name, config, split)) or FakeDataset()
    monkeypatch.setitem(sys.modules, "datasets", fake)
    out = str(tmp_path / "hf")
    info = collect.main(["--base", "fake/base", "--audio", "org/speech:clean", "--split", "test",
                         "--skip", "1", "--out", out], model=FakeMedusa())
    assert calls == [("org/speech", "clean", "test")]
    assert sorted(utterance_table(out)) == [f"hf{i}" for i in range(1, 6)]
    assert info["audio_source"]["licence"] == ["cc-by-4.0"] and info["audio_source"]["skip"] == 1
    td = export.build_training_data({}, [{"collect": info}])
    assert td["hf_dataset"] == "org/speech" and td["source"] == "org/speech:clean (test)"


def test_cli_entry_points():
    import subprocess

    out = subprocess.run([sys.executable, "-m", "pipeline.train", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--max-steps" in out.stdout, out.stderr
    for module in (collect, export):  # same entry-point shape, checked in-process
        with pytest.raises(SystemExit) as exit_info:
            module.main(["--help"])
        assert exit_info.value.code == 0


# --------------------------------------------------------------------------- real models, end to end
def _modeling_ready() -> bool:
    path = os.path.join(ROOT, "modeling_medusa.py")
    return os.path.exists(path) and "def collect_hidden_states" in open(path).read()


def _transformers_version() -> tuple[int, int]:
    import transformers

    return tuple(int(x) for x in transformers.__version__.split(".")[:2])


def _run_pipeline_end_to_end(base: str, tmp_path, n_clips: int, max_new_tokens: int, trust: tuple = ()):
    """collect -> train -> export with the real model class (``trust``: ``--trust-base-code`` for a base that runs
    its own code); checks the artifact is lossless."""
    from modeling_medusa import MedusaForASR

    audio = write_clips(str(tmp_path / "audio"), n_clips, seed=3)
    col, ckpt, art = (str(tmp_path / d) for d in ("collect", "ckpt", "artifact"))
    info = collect.main(["--base", base, *trust, "--audio", audio, "--out", col, "--batch-size", "3",
                         "--shard-size", "4", "--max-new-tokens", str(max_new_tokens), "--device", "cpu"])
    assert info["n_utterances"] == n_clips and len(collect.list_shards(col)) == math.ceil(n_clips / 4)
    metrics = train.main(["--base", base, *trust, "--data", col, "--out", ckpt, "--epochs", "2", "--batch-size", "2",
                          "--val-fraction", "0.25", "--device", "cpu"])
    assert metrics["finished"] and len(metrics["head_accuracy"]["topk"]) == 4
    export.main(["--base", base, *trust, "--base-id", base, "--heads", os.path.join(ckpt, "best.safetensors"),
                 "--out", art, "--tree-nodes", "6"])
    assert {"config.json", "medusa_heads.safetensors", "README.md", "modeling_medusa.py"} <= set(os.listdir(art))

    model = MedusaForASR.from_pretrained(art)
    cfg = model.config
    assert cfg.training_data["n_utterances"] == n_clips and cfg.training_data["voices"] == ["voice0", "voice1"]
    assert cfg.head_accuracy["top1"] == metrics["head_accuracy"]["top1"] and cfg.tree
    # the shards hold (hidden, token) pairs of the base itself: its projection maps one to the other
    table = utterance_table(col)
    with torch.no_grad():
        agree = [bool((model.backbone.logits(h.float()).argmax(-1) == t).float().mean() >= 0.9)
                 for t, h in table.values()]
    assert all(agree)
    # the recorded tokens are the base's own greedy transcript (its generate, not our decode loop)
    clips = [audio_io.load_audio(os.path.join(audio, f"clip_{i:03d}.wav")) for i in range(2)]
    inputs = model.prepare_audio_inputs(clips)
    plain = model.generate(**inputs, max_new_tokens=max_new_tokens, use_medusa=False)
    for i, row in enumerate(plain.tolist()):
        recorded = table[f"utt{i:03d}"][0].tolist()
        recorded = recorded[:-1] if recorded[-1] in model.backbone.eos_token_ids else recorded
        assert _contains(row, recorded), f"clip {i}: collected {recorded} is not in base greedy {row}"
    # lossless: Medusa decoding with the exported heads = the base's greedy output
    fast, stats = model.generate(**inputs, max_new_tokens=max_new_tokens, return_stats=True, draft="tree")
    assert torch.equal(plain, fast) and stats["drafted_tokens"] > 0
    return cfg


def _contains(row: list, part: list) -> bool:
    return any(row[i:i + len(part)] == part for i in range(len(row) - len(part) + 1))


@pytest.mark.skipif(not _modeling_ready(), reason="modeling_medusa.py has no collect_hidden_states yet")
def test_end_to_end_tiny_whisper(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from tiny_models import build_tiny_whisper

    base = str(build_tiny_whisper(tmp_path / "base", seed=0))
    from transformers import AutoProcessor

    try:
        AutoProcessor.from_pretrained(base)
    except OSError:  # transformers 4.x: AutoProcessor needs a tokenizer, the fixture only has features
        pytest.skip("this transformers' AutoProcessor cannot load the tokenizer-less tiny Whisper fixture")
    cfg = _run_pipeline_end_to_end(base, tmp_path, n_clips=8, max_new_tokens=20)
    assert cfg.base_family == "whisper"


@pytest.mark.skipif(not _modeling_ready(), reason="modeling_medusa.py has no collect_hidden_states yet")
@pytest.mark.skipif(not os.path.exists(os.path.join(ROOT, "tests", "standin.py")), reason="no MERaLiON-2 stand-in")
@pytest.mark.skipif(_transformers_version() >= (4, 52), reason="MERaLiON-2 code runs on transformers ~4.51 only")
def test_end_to_end_meralion2_standin(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from standin import build_meralion2_standin

    base = str(build_meralion2_standin(tmp_path / "base", seed=0))
    with pytest.raises(SystemExit, match="--trust-base-code"):
        collect.main(["--base", base, "--audio", write_clips(str(tmp_path / "one"), 1, seed=3),
                      "--out", str(tmp_path / "refused")])
    cfg = _run_pipeline_end_to_end(base, tmp_path, n_clips=8, max_new_tokens=12, trust=("--trust-base-code",))
    assert cfg.base_family == "meralion2"


def test_base_folder_resolves_known_whisper_ids_offline(tmp_path, monkeypatch):
    """``--base openai/whisper-tiny.en`` loads the offline copy (as benchmark.py does); folders and other
    names pass through unchanged."""
    from tools import real_whisper

    calls = []
    monkeypatch.setattr(real_whisper, "resolve_whisper", lambda name: calls.append(name) or str(tmp_path / "converted"))
    assert collect.base_folder("openai/whisper-tiny.en") == str(tmp_path / "converted")
    assert collect.base_folder("tiny.en") == str(tmp_path / "converted")  # alias
    assert collect.base_folder(str(tmp_path)) == str(tmp_path)
    assert collect.base_folder("MERaLiON/MERaLiON-2-3B") == "MERaLiON/MERaLiON-2-3B"
    assert calls == ["openai/whisper-tiny.en", "tiny.en"]


@requires_transformers5  # (Whisper's processor: the tiny Whisper's tokenizer is transformers 5's)
def test_hub_folder_holds_real_files_of_each_shipped_artifact(tmp_path):
    """What ``huggingface-cli upload`` would publish for heads/*: the artifact's own files, real copies of the
    remote code and the transcription command (no links, none of the tools), importable on their own, and the
    base's processor files (here a tiny Whisper's processor stands in for the real bases')."""
    import subprocess

    from tiny_models import build_tiny_whisper

    from modeling_medusa import CODE_FILES
    from pipeline import hub_folder

    processor = MedusaForASR.from_base(str(build_tiny_whisper(tmp_path / "tiny", seed=1)), family="whisper").processor
    processor.save_pretrained(tmp_path / "processor")
    processor_files = {p.name for p in (tmp_path / "processor").iterdir()}
    root = Path(ROOT)
    for name in ("whisper-tiny.en", "whisper-base"):
        artifact, out = root / "heads" / name, tmp_path / name
        names = hub_folder.write_hub_folder(artifact, out, processor=processor)
        assert set(names) == {"config.json", "medusa_heads.safetensors", "README.md", "training_metrics.json",
                              "collect_info.json", "results.json", "speedup.png", *CODE_FILES, "example_inference.py",
                              *processor_files}  # (the card's plot ships with it)
        assert sorted(p.name for p in out.iterdir()) == names
        for file in processor_files:
            assert (out / file).read_bytes() == (tmp_path / "processor" / file).read_bytes(), file
        names = [n for n in names if n not in processor_files]
        assert not any(p.is_symlink() or not p.is_file() for p in out.iterdir())
        for file in names:
            source = root / file if file.endswith(".py") else artifact / file
            assert (out / file).read_bytes() == source.read_bytes(), file
    env = {**os.environ, "PYTHONPATH": ""}
    subprocess.run([sys.executable, "-c", "import modeling_medusa, example_inference, asr_pipeline"],
                   cwd=tmp_path / "whisper-tiny.en", env=env, check=True)


@requires_transformers5
def test_hub_folder_takes_the_processor_the_artifact_ships_else_says_how_to_get_the_bases(tmp_path):
    """``base_processor``: a Whisper artifact's own processor files first, else its base's; a base it cannot load
    offline is one line saying how to convert it; a MERaLiON-2 artifact has none to publish (no ASR pipeline)."""
    from tiny_models import build_tiny_whisper

    from pipeline import hub_folder

    artifact = tmp_path / "artifact"
    artifact.mkdir()
    config = {"base_family": "whisper", "base_model_name_or_path": "nobody/no-such-whisper"}
    (artifact / "config.json").write_text(json.dumps(config))
    with pytest.raises(SystemExit, match="cannot load the processor of its base nobody/no-such-whisper offline.*"
                                         "python -m tools.real_whisper nobody/no-such-whisper"):
        hub_folder.base_processor(artifact)
    tiny = MedusaForASR.from_base(str(build_tiny_whisper(tmp_path / "tiny", seed=1)), family="whisper")
    tiny.processor.save_pretrained(artifact)
    assert hub_folder.base_processor(artifact).tokenizer.get_vocab() == tiny.processor.tokenizer.get_vocab()
    (artifact / "config.json").write_text(json.dumps({**config, "base_family": "meralion2"}))
    assert hub_folder.base_processor(artifact) is None


@requires_transformers5
def test_hub_folder_converts_a_known_base_it_finds_no_copy_of(tmp_path, monkeypatch):
    """A fresh clone has no converted whisper-base: ``make upload-check`` converts it (tools.real_whisper)
    rather than stopping; where the conversion fails, one line gives the command to run."""
    import modeling_medusa
    from tiny_models import build_tiny_whisper

    from pipeline import hub_folder
    from tools import real_whisper

    artifact = tmp_path / "artifact"
    artifact.mkdir()
    (artifact / "config.json").write_text(json.dumps({"base_family": "whisper",
                                                      "base_model_name_or_path": "openai/whisper-base"}))
    monkeypatch.setattr(modeling_medusa, "resolve_base", lambda name: str(tmp_path / "no-copy"))
    converted = []

    def convert(hub_id):
        converted.append(hub_id)
        return build_tiny_whisper(tmp_path / "converted", seed=1)

    monkeypatch.setattr(real_whisper, "ensure_converted", convert)
    assert hub_folder.base_processor(artifact) is not None and converted == ["openai/whisper-base"]

    def fail(hub_id):
        raise real_whisper.ConversionError("no network")

    monkeypatch.setattr(real_whisper, "ensure_converted", fail)
    with pytest.raises(SystemExit, match="cannot convert openai/whisper-base: no network; run python -m "
                                         "tools.real_whisper openai/whisper-base"):
        hub_folder.base_processor(artifact)


def test_quantise_says_where_llm_compressor_lives_and_keeps_a_finished_folder(tmp_path, capsys):
    """pipeline.quantise: without llm-compressor (it pins another transformers) one line says how to get it;
    a folder it finished (its quantise_info.json) is kept as it is, with nothing to redo."""
    import importlib.util

    from pipeline import quantise

    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text('{"audio": "a.wav", "text": "hello"}\n')
    out = tmp_path / "w4a16"
    if importlib.util.find_spec("llmcompressor") is None:
        with pytest.raises(SystemExit, match="make quantise-env"):
            quantise.main(["openai/whisper-tiny.en", str(out), "--calibration", str(manifest)])
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / quantise.INFO_NAME).write_text("{}")
    assert quantise.main(["openai/whisper-tiny.en", str(out), "--calibration", str(manifest)]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert quantise.calibration_clips(manifest, 4)[0]["audio"] == str((tmp_path / "a.wav").resolve())


def test_compare_heads_table_gives_the_chain_the_32_node_tree_and_the_best_tree():
    from pipeline import compare_heads

    row = {"variant": "v", "top1": [0.5], "top5": [0.9], "real": {"chain of 4": 1.5},
           "held_out": {"chain of 4": 2.0, "tree of 32 nodes": 3.0, "tree of 64 nodes": 3.1}}
    cells = compare_heads.render([row], ["real"]).splitlines()[2].split("|")
    assert [c.strip() for c in cells[5:7]] == ["2.000 / 3.000 / 3.100 (tree of 64 nodes)", "1.500 / n/a / 1.500 (chain of 4)"]


def test_every_compare_heads_variant_is_a_valid_training_recipe():
    from pipeline import compare_heads

    args = compare_heads.build_parser().parse_args(["--base", "B", "--data", "D", "--eval-data", "E", "--out", "O"])
    parsed = {name: train.build_parser().parse_args(compare_heads.train_args(args, name))
              for name in compare_heads.VARIANTS}
    for name, recipe in parsed.items():
        assert (recipe.base, recipe.data, recipe.out, recipe.eval_data) == ("B", ["D"], os.path.join("O", name), ["E"])
        if name.startswith("path-speech"):
            assert recipe.head_kind == "path" and recipe.speech_attention
    assert [parsed[name].layers for name in ("path-speech", "path-speech-2l", "path-speech-3l")] == [1, 2, 3]
    assert parsed["path-speech-prefix"].prefix_attention and parsed["path-speech-teacher"].soft_labels == 1.0
    tuned = compare_heads.build_parser().parse_args(["--base", "B", "--data", "D", "--init-heads", "H.safetensors",
                                                     "--draft-vocab", "1024"])
    recipe = train.build_parser().parse_args(compare_heads.train_args(tuned, "path-speech-2l"))
    assert (recipe.init_heads, recipe.draft_vocab, recipe.layers) == ("H.safetensors", 1024, 2)


def test_compare_heads_tabulates_runs_trained_elsewhere_from_their_metrics(tmp_path):
    from pipeline import compare_heads

    def metrics(top1: float, real: float) -> dict:
        return {"head_accuracy": {"top1": [top1], "top5": [0.9]}, "layers": 1, "train_args": {"lr": 5e-4},
                "draft_candidates": [{"name": "chain of 4", "tokens_per_round": 2.0}],
                "eval_replay": {"collect_real": [{"name": "tree of 32 nodes", "tokens_per_round": real}]}}

    runs = []
    for name, top1, real in (("path-speech", 0.8, 2.9), ("path-speech-2l", 0.81, 3.0)):
        (tmp_path / f"{name}.json").write_text(json.dumps(metrics(top1, real)))
        runs.append(f"{name}={tmp_path / name}.json")
    out = compare_heads.main(["--runs", *runs, "--out", str(tmp_path / "cmp")])
    assert [(r["variant"], r["collect_real"], r["train_args"]) for r in out["rows"]] == [
        ("path-speech", {"tree of 32 nodes": 2.9}, {"lr": 5e-4}), ("path-speech-2l", {"tree of 32 nodes": 3.0}, {"lr": 5e-4})]
    written = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
    assert written["command"].startswith("python -m pipeline.compare_heads --runs") and len(written["rows"]) == 2
    assert "collect_real" in (tmp_path / "cmp" / "comparison.md").read_text()
    (tmp_path / "low.json").write_text(json.dumps({**metrics(0.7, 3.1), "train_args": {
        "lr": 1e-4, "epochs": 6, "layers": 2, "init_heads": "shipped.safetensors"}}))
    compare_heads.main(["--runs", runs[0], f"path-speech={tmp_path}/low.json", "--out", str(tmp_path / "cmp")])
    table = [[c.strip() for c in line.split("|")[1:3]]
             for line in (tmp_path / "cmp" / "comparison.md").read_text().splitlines()[2:]]
    assert table == [["path-speech", "lr 0.0005"], ["path-speech", "lr 0.0001, 6 epochs, 2 layers, from given heads"]]
    with pytest.raises(SystemExit, match="VARIANT=METRICS_JSON"):
        compare_heads.main(["--runs", f"unknown={tmp_path}/x.json"])
    with pytest.raises(SystemExit, match="--base and --data are required"):
        compare_heads.main(["--out", str(tmp_path / "none")])


def test_replay_difference_counts_each_recordings_tokens_and_rounds(shards):
    from pipeline.acceptance import tokens_per_round
    from pipeline.replay_difference import replayed_counts
    model = FakeMedusa()
    counts = replayed_counts(model, "chain", shards)
    data = train.Collected([shards])
    tree = model.draft_policy.resolve("chain")
    replay = tokens_per_round(model.make_drafter(tree, "cpu"), tree, data.recordings(range(len(data.ids))))
    assert counts.shape == (2, 48) and (counts[0].sum(), counts[1].sum()) == (replay["tokens"], replay["rounds"])
    assert counts[0].sum() == int((data.lengths - 1).sum()) and (counts[1] <= counts[0]).all()


def test_replay_difference_tables_put_data_down_and_heads_across_for_each_first_heads():
    from pipeline.replay_difference import difference_tables

    def row(first, second, data, value):
        return {"first": first, "second": second, "data": data, "clips": 20, "tokens_per_pass_first": 3.0,
                "tokens_per_pass_second": value, "difference_percent": 100 * (value / 3.0 - 1),
                "interval_percent": [-1.0, 2.0]}
    text = difference_tables([row("A", "B", "en", 3.03), row("A", "C", "en", 2.7), row("A", "B", "de", 2.1),
                              row("T", "U", "en", 3.3)])
    first, second = text.split("\n\n")
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in first.splitlines()]
    assert cells[0] == ["data", "clips", "`A`", "`B`", "`C`"]
    assert cells[2] == ["en", "20", "3.00", "3.03 (+1.0 % [-1.0, +2.0])", "2.70 (-10.0 % [-1.0, +2.0])"]
    assert cells[3] == ["de", "20", "3.00", "2.10 (-30.0 % [-1.0, +2.0])", ""]
    assert "`T`" in second and "`U`" in second and "3.30 (+10.0 %" in second and text.endswith("\n")
