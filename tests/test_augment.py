"""Augmentation of synthetic clips: deterministic per clip, SNR and speed as asked, reverb and gain sane."""

import numpy as np
import pytest

from tools import augment as aug

SR = 16000
ALL = aug.AugmentConfig(speed_fraction=1, reverb_fraction=1, noise_fraction=1, gain_fraction=1)


def tone(seconds: float = 2.0) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    return (0.3 * np.sin(2 * np.pi * 220 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)


def test_plan_is_deterministic_per_clip_and_seed():
    config = aug.PRESETS["default"]
    assert aug.plan_augmentation("syn0000001", 0, config) == aug.plan_augmentation("syn0000001", 0, config)
    plans = [aug.plan_augmentation(f"syn{i:07d}", 0, config) for i in range(2000)]
    assert plans != [aug.plan_augmentation(f"syn{i:07d}", 1, config) for i in range(2000)]
    for key, fraction in (("speed", 0.5), ("reverb", 0.2), ("noise", 0.4), ("gain_db", 0.5)):
        share = sum(key in p for p in plans) / len(plans)
        assert abs(share - fraction) < 0.05, key
    noisy = [p["noise"] for p in plans if "noise" in p]
    assert {n["colour"] for n in noisy} == set(aug.NOISE_COLOURS)
    assert all(5 <= n["snr_db"] <= 30 for n in noisy)
    assert all(0.9 <= p["speed"] <= 1.1 for p in plans if "speed" in p)


def test_no_augmentation_is_an_empty_plan_and_a_no_op():
    assert aug.plan_augmentation("syn0000001", 0, aug.PRESETS["none"]) == {}
    audio = tone()
    assert aug.apply_augmentation(audio, SR, {}) is audio


def test_one_fraction_does_not_move_the_others():
    noise_only = aug.AugmentConfig(noise_fraction=0.5)
    both = aug.AugmentConfig(noise_fraction=0.5, speed_fraction=0.5)
    for i in range(200):
        a, b = aug.plan_augmentation(f"c{i}", 0, noise_only), aug.plan_augmentation(f"c{i}", 0, both)
        assert a.get("noise") == b.get("noise")


def test_apply_is_deterministic():
    params = aug.plan_augmentation("syn0000007", 3, ALL)
    assert np.array_equal(aug.apply_augmentation(tone(), SR, params), aug.apply_augmentation(tone(), SR, params))


@pytest.mark.parametrize("colour", aug.NOISE_COLOURS)
@pytest.mark.parametrize("snr_db", [5.0, 17.5, 30.0])
def test_noise_has_the_snr_asked_for(colour, snr_db):
    clean = tone()
    noisy = aug.add_noise(clean, snr_db, colour, np.random.default_rng(1))
    noise = noisy.astype(np.float64) - clean
    measured = 10 * np.log10(np.mean(clean.astype(np.float64) ** 2) / np.mean(noise ** 2))
    assert abs(measured - snr_db) < 0.5


def test_noise_colours_have_their_spectral_slope():
    def slope_db_per_octave(colour):
        noise = aug.coloured_noise(1 << 17, colour, np.random.default_rng(0)).astype(np.float64)
        power = np.abs(np.fft.rfft(noise)) ** 2
        f = np.fft.rfftfreq(len(noise), 1 / SR)
        band = lambda lo: power[(f >= lo) & (f < 2 * lo)].mean()  # noqa: E731
        return 10 * np.log10(band(2000) / band(1000))

    assert abs(slope_db_per_octave("white")) < 0.5
    assert abs(slope_db_per_octave("pink") + 3.0) < 0.7
    assert abs(slope_db_per_octave("brown") + 6.0) < 0.7


@pytest.mark.parametrize("factor", [0.9, 1.0, 1.1])
def test_speed_factor_changes_duration(factor):
    pytest.importorskip("soxr")
    audio = tone(3.0)
    out = aug.apply_augmentation(audio, SR, {"speed": factor, "seed": 0})
    assert abs(len(out) - len(audio) / factor) <= 2


def test_reverb_keeps_length_and_level_and_adds_a_tail():
    click = np.zeros(SR, dtype=np.float32)
    click[1000] = 1.0
    wet = aug.reverberate(click, SR, rt60=0.4, direct_db=3.0, rng=np.random.default_rng(0))
    assert len(wet) == len(click)
    assert np.isclose(np.sqrt(np.mean(wet ** 2)), np.sqrt(np.mean(click ** 2)), rtol=1e-3)
    tail = wet[1000 + int(0.01 * SR):1000 + int(0.1 * SR)]
    assert np.sum(tail ** 2) > 0.1 * np.sum(wet ** 2)  # energy arrives after the direct sound
    assert np.sum(wet[:1000] ** 2) < 1e-12  # and none before it


def test_gain_and_peak_limit():
    audio = tone()
    assert np.isclose(np.max(np.abs(aug.apply_gain(audio, -6.0))), np.max(np.abs(audio)) * 10 ** (-6 / 20))
    loud = aug.apply_augmentation(audio * 3, SR, {"gain_db": 6.0, "seed": 0})
    assert np.isclose(np.max(np.abs(loud)), aug.PEAK)


def test_make_config_overrides_and_rejects_bad_values():
    config = aug.make_config("default", noise_fraction=1.0, speed_fraction=None)
    assert config.noise_fraction == 1.0 and config.speed_fraction == aug.PRESETS["default"].speed_fraction
    assert not aug.make_config("none").active() and config.active()
    with pytest.raises(ValueError, match="within 0-1"):
        aug.make_config("default", gain_fraction=2.0)
    with pytest.raises(ValueError, match="unknown --augment"):
        aug.make_config("heavy")
