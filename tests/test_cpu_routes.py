"""The CPU's faster routes through the base's own weights give what the plain ones give: the base's next token
through the screened output projection (a bf16 screen, the best candidates scored again in float32, a proof that
no other token wins) and the blockwise argmax, proved or not; the decoder's linear layers for a few rows."""

import pytest
import torch

from cpu_kernels import ScreenedArgmax, blocked_argmax, fast_argmax, linear
from logits_rules import ChainedRules, LogitsRules, SuppressionRules


def full_argmax(hidden, weight, bias, rules):
    return rules(torch.nn.functional.linear(hidden, weight, bias)).argmax(-1)


def test_fast_argmax_is_argmax_with_ties_blocked_rows_and_any_length():
    torch.manual_seed(0)
    for vocab in (3000, 4096, 51865):
        scores = torch.randn(3, 5, vocab)
        scores[0, 0, [7, vocab - 2]] = 100.0  # a tie: the first index wins
        scores[0, 1] = float("-inf")  # every token blocked
        scores[1, 2, vocab - 1] = 50.0  # the best token in the last, partial block
        scores[2, 3, 1500:1600] = scores[2, 3].max()  # ties across a block boundary
        assert torch.equal(fast_argmax(scores), scores.argmax(-1))


def test_blocked_argmax_compiled_is_argmax_with_ties():
    """The form compiled GPU rounds take (torch.compile on the CPU here: the same graph, another code generator)."""
    torch.manual_seed(1)
    scores = torch.randn(4, 51864)
    scores[0, [9, 40000]] = 100.0  # a tie across blocks: the first index wins
    scores[1] = float("-inf")
    scores[2, 51863] = 60.0  # in the last, partial block
    scores[3, 2040:2060] = scores[3].max()  # ties across a block boundary
    compiled = torch.compile(lambda s: blocked_argmax(s, 2048), dynamic=False)
    assert torch.equal(compiled(scores), scores.argmax(-1))
    assert torch.equal(blocked_argmax(scores, 1024), scores.argmax(-1))


class NoRules(LogitsRules):
    masks_only = True


def suppression(vocab, num_generated):
    rules = SuppressionRules(vocab, "cpu", eos_token_ids=[vocab - 1], min_new_tokens=3, always=[0, 5, vocab - 3],
                             at_begin=[1, 2])
    return lambda logits: rules(logits, num_generated)


@pytest.mark.parametrize("form", ["unpacked", "packed"])
@pytest.mark.parametrize("vocab,width,bias", [(100, 8, False), (4099, 64, True), (51865, 384, False)])
def test_screened_argmax_equals_the_full_projection(vocab, width, bias, form, monkeypatch):
    """In either form of the screen's product (the bf16 copy as it is, or in oneDNN's layout), whichever this
    machine times faster."""
    from cpu_kernels import SCREEN_PRODUCT, onednn_packed

    if form == "packed" and onednn_packed(torch.zeros(8, 8, dtype=torch.bfloat16)) is None:
        pytest.skip("this torch build has no oneDNN linear for bf16")
    monkeypatch.setattr(SCREEN_PRODUCT, "chosen", {})
    monkeypatch.setattr(SCREEN_PRODUCT, "forms", {form: SCREEN_PRODUCT.forms[form]})  # as if timed fastest
    torch.manual_seed(vocab)
    weight = torch.randn(vocab, width) * 0.05
    b = torch.randn(vocab) * 0.5 if bias else None
    # near-duplicate rows make near-ties the screen cannot settle (projected in full), besides clear winners
    weight[0] *= 10
    weight[10:20] = weight[0] + 1e-4 * torch.randn(10, width)
    screen = ScreenedArgmax(lambda: weight, lambda: b)
    hidden = torch.randn(4, 6, width) * 8
    hidden[0, :3] = weight[0] * 40 + torch.randn(3, width)  # rows whose best tokens are near-tied
    num_generated = torch.tensor([0, 1, 2, 3, 4, 5]).expand(4, 6)
    for rules in (NoRules(), suppression(vocab, num_generated)):
        rules = (lambda logits: logits) if isinstance(rules, NoRules) else rules
        with torch.no_grad():
            assert torch.equal(screen(hidden, rules), full_argmax(hidden, weight, b, rules))
    assert 0 < screen.projected_in_full < screen.rows  # both paths ran
    assert set(SCREEN_PRODUCT.chosen.values()) == {form}


def test_screened_argmax_when_the_rules_leave_few_tokens_or_none():
    torch.manual_seed(1)
    vocab, width = 2000, 32
    weight, hidden = torch.randn(vocab, width), torch.randn(2, 3, width)
    screen = ScreenedArgmax(lambda: weight, lambda: None)
    keep_three = lambda logits: torch.full_like(logits, float("-inf")).index_copy(  # noqa: E731
        -1, torch.tensor([5, 900, 1999]), logits[..., [5, 900, 1999]])
    block_all = lambda logits: torch.full_like(logits, float("-inf"))  # noqa: E731
    with torch.no_grad():
        for rules in (keep_three, block_all):
            assert torch.equal(screen(hidden, rules), full_argmax(hidden, weight, None, rules))


def test_screened_argmax_under_a_rule_that_lets_the_timestamps_overrule_the_text():
    """Whisper's "a timestamp where the timestamps' total probability beats every text token" after the masks:
    the screen scores the timestamps exactly and decides the rule from them; rows whose decision sits within
    float32 rounding are projected in full. Every row equals the full projection under the same rules."""
    from logits_rules import SuppressionRules

    torch.manual_seed(3)
    vocab, begin, width = 3000, 2000, 48
    weight = torch.randn(vocab, width) * 0.05
    hidden = torch.randn(6, 5, width) * 10
    # rows where the timestamps clearly win, and rows balanced on the rule's edge (its decision undecided here)
    hidden[1] = weight[begin:begin + 20].mean(0) * 300 + torch.randn(5, width)
    masks = SuppressionRules(vocab, "cpu", eos_token_ids=[vocab - 1], always=[0, 7, begin + 3])
    stamp_ids = [i for i in range(begin, vocab) if i != begin + 3]
    def gap(h):  # the rule's two sides: the timestamps' total against the best text token
        return float((h @ weight[stamp_ids].T).logsumexp(-1) - (h @ weight[8:begin].T).amax(-1))

    for row in range(5):  # rows a little to either side of the rule's edge: beyond float32 rounding, within the margin
        text, stamps = weight[100 + row] * 400, hidden[1, row]
        low, high = 0.0, 1.0  # mixing weight of the text row: low -> timestamps win, high -> the text wins
        for _ in range(60):
            middle = (low + high) / 2
            low, high = (middle, high) if gap(middle * text + (1 - middle) * stamps) > 0 else (low, middle)
        step = 1e-7 * (1 if row % 2 else -1)
        while abs(gap((middle + step) * text + (1 - middle - step) * stamps)) < 5e-5:
            step *= 1.5
        hidden[2, row] = (middle + step) * text + (1 - middle - step) * stamps
    num_generated = torch.tensor([0, 1, 2, 3, 4]).expand(6, 5)

    def finish(logits):
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        overruled = logprobs[..., begin:].logsumexp(-1) > logprobs[..., :begin].max(-1).values
        return logits.masked_fill(overruled[..., None] & (torch.arange(vocab) < begin), float("-inf"))

    screen = ScreenedArgmax(lambda: weight, lambda: None)
    with torch.no_grad():
        got = screen(hidden, lambda logits: masks(logits, num_generated), begin, finish)
        expected = finish(masks(hidden @ weight.T, num_generated)).argmax(-1)
    assert torch.equal(got, expected)
    assert (expected[1] >= begin).any() and (expected < begin).any()  # both sides of the rule won somewhere
    assert 0 < screen.projected_in_full < screen.rows  # the undecided rows went the full way


def test_only_rules_that_block_tokens_are_screened():
    weight = torch.randn(50, 4)
    rules = SuppressionRules(50, "cpu", eos_token_ids=[49])
    assert rules.masks_only and ChainedRules(rules, rules).masks_only
    assert not ChainedRules(rules, LogitsRules()).masks_only  # (a rule that may change logits)
    hidden = torch.randn(1, 2, 4)
    with torch.no_grad():
        assert ScreenedArgmax.applies(hidden, weight, rules)
        assert not ScreenedArgmax.applies(hidden, weight.to(torch.bfloat16), rules)
        assert not ScreenedArgmax.applies(hidden, weight, LogitsRules())


@pytest.mark.parametrize("form", ["rows", "columns", "packed"])
def test_linear_for_a_few_rows_equals_the_layer_in_each_form(form, monkeypatch):
    from cpu_kernels import CPU_FEW_ROWS, FEW_ROWS_PRODUCT, packs_float32

    if form == "packed" and not packs_float32():
        pytest.skip("this torch build has no oneDNN linear for float32")
    # every key takes this form, as if it had been timed fastest
    monkeypatch.setattr(FEW_ROWS_PRODUCT, "chosen", {})
    monkeypatch.setattr(FEW_ROWS_PRODUCT, "_timings", {})
    monkeypatch.setattr(FEW_ROWS_PRODUCT, "forms", {form: FEW_ROWS_PRODUCT.forms[form]})
    torch.manual_seed(2)
    for out_features, in_features, bias in ((384, 384, True), (1536, 384, True), (384, 1536, False), (64, 8, False)):
        layer = torch.nn.Linear(in_features, out_features, bias=bias)
        # (batch, chunk): one row, a chain, a batch, a 16-node tree, past the route
        for shape in ((1, 1), (1, 5), (2, 3), (1, CPU_FEW_ROWS), (1, CPU_FEW_ROWS + 1)):
            x = torch.randn(*shape, in_features)
            with torch.no_grad():
                got = linear(layer, x)
            assert got.shape == (*shape, out_features) and got.is_contiguous()
            assert torch.allclose(got, layer(x), rtol=1e-5, atol=1e-5)
    assert set(FEW_ROWS_PRODUCT.chosen.values()) == {form}
    with torch.enable_grad():  # training keeps the layer's own forward (and its gradient)
        assert linear(layer, torch.randn(1, 2, 8)).requires_grad


@pytest.mark.parametrize("form", ["keys_right", "keys_left"])
def test_speech_scores_equal_the_queries_times_the_keys_in_each_form(form, monkeypatch):
    """Whichever form a machine times fastest, the scores of a few float32 queries over the speech's keys are
    ``query @ keys^T`` (same products, float rounding aside); fused q/k/v weights go through the same CPU route."""
    from cpu_kernels import SPEECH_SCORES, speech_scores, weight_product

    monkeypatch.setattr(SPEECH_SCORES, "chosen", {})
    monkeypatch.setattr(SPEECH_SCORES, "_timings", {})
    monkeypatch.setattr(SPEECH_SCORES, "forms", {form: SPEECH_SCORES.forms[form]})
    torch.manual_seed(3)
    for batch, heads, queries, frames in ((1, 6, 1, 1500), (1, 6, 5, 1500), (2, 8, 17, 300)):
        query, keys = torch.randn(batch, heads, queries, 64), torch.randn(batch, heads, frames, 64)
        got = speech_scores(query, keys)
        assert got.shape == (batch, heads, queries, frames)
        assert torch.allclose(got, query @ keys.transpose(-1, -2), rtol=1e-5, atol=1e-4)
    assert set(SPEECH_SCORES.chosen.values()) == {form}
    weight, bias, x = torch.randn(3 * 384, 384), torch.randn(3 * 384), torch.randn(1, 5, 384)
    with torch.no_grad():
        assert torch.allclose(weight_product(x, weight, bias), torch.nn.functional.linear(x, weight, bias),
                              rtol=1e-5, atol=1e-4)


def test_fastest_form_times_each_key_once_and_keeps_the_faster():
    import time

    from cpu_kernels import FastestForm

    calls = {"slow": 0, "fast": 0}

    def form(name, pause):
        def run(x):
            calls[name] += 1
            time.sleep(pause)
            return (name, x)
        return run

    chooser = FastestForm(slow=form("slow", 0.004), fast=form("fast", 0.0))
    assert chooser("key", 1) == ("fast", 1)
    timed = dict(calls)
    assert timed["slow"] >= 3 and timed["fast"] >= 3  # both were timed, in turn
    assert chooser("key", 2) == ("fast", 2) and calls == {"slow": timed["slow"], "fast": timed["fast"] + 1}
    assert chooser.chosen == {"key": "fast"}


def test_fastest_form_in_use_times_the_calls_themselves_in_turn():
    import time

    from cpu_kernels import FORM_TIMING_TURNS, FastestForm

    ran = []

    def form(name, pause):
        def run(x):
            ran.append(name)
            time.sleep(pause)
            return (name, x)
        return run

    chooser = FastestForm(in_use=True, slow=form("slow", 0.004), fast=form("fast", 0.0), gone=form("gone", 0.0))
    outputs = [chooser("key", i, without=("gone",)) for i in range(2 * FORM_TIMING_TURNS)]
    assert outputs == [(name, i) for i, name in enumerate(ran)]  # each call ran one form, and returned its output
    assert ran[:2 * FORM_TIMING_TURNS] == ["slow", "fast"] * FORM_TIMING_TURNS  # in turn; never the form left out
    assert chooser.chosen == {"key": "fast"} and chooser("key", 9) == ("fast", 9)
    assert not chooser.may_choose("key", "slow") and chooser.may_choose("other", "slow")
    one = FastestForm(in_use=True, only=form("only", 0.0), gone=form("gone", 0.0))
    assert one("k", 1, without=("gone",)) == ("only", 1) and one.chosen == {"k": "only"}


def test_packed_copies_follow_their_weights():
    import gc

    from cpu_kernels import PackedCopies, onednn_linear, packs_float32

    if not packs_float32():
        pytest.skip("this torch build has no oneDNN linear for float32")
    copies = PackedCopies()
    weight, x = torch.randn(48, 32), torch.randn(3, 32)
    packed = copies(weight)
    assert copies(weight) is packed and torch.allclose(onednn_linear(x, packed), x @ weight.T, atol=1e-5)
    weight.mul_(2)  # changed in place: packed again
    assert torch.allclose(onednn_linear(x, copies(weight)), x @ weight.T, atol=1e-5)
    del weight, packed
    gc.collect()
    assert len(copies) == 0  # dropped with its weight


def test_transposed_copy_is_the_contiguous_transpose():
    from cpu_kernels import transposed_copy

    for dtype in (torch.float32, torch.bfloat16):
        for rows, columns in ((51968, 5), (1536, 2), (384, 1), (7, 3)):
            matrix = torch.randn(rows, columns).to(dtype)
            for source in (matrix, torch.randn(rows, columns + 1).to(dtype)[:, :columns]):  # (contiguous, strided)
                copy = transposed_copy(source)
                assert copy.is_contiguous() and torch.equal(copy, source.T)


def test_suppression_blocks_the_screens_scores_in_place_as_its_call_blocks_a_copy():
    vocab = 300
    rules = SuppressionRules(vocab, "cpu", eos_token_ids=[vocab - 1], min_new_tokens=3, always=[0, 5, 17],
                             at_begin=[1, 2])
    num_generated = torch.tensor([[0, 1, 2, 3, 4]])
    masks = rules.screen_parts()[0]
    padded = torch.randn(5, vocab + 12).to(torch.bfloat16)  # (the screen's rows: padded, so its logits are strided)
    logits = padded[:, :vocab].view(1, 5, vocab)
    expected = rules(logits, num_generated)
    assert not torch.equal(expected, logits)  # (the call leaves its input as it is)
    assert masks(logits, num_generated) is logits and torch.equal(logits, expected)


def test_a_form_kept_by_an_earlier_process_is_used_untimed_and_new_choices_are_handed_out_once():
    from cpu_kernels import FORM_TIMING_TURNS, FastestForm

    ran = []
    forms = FastestForm(a=lambda x: ran.append("a") or x, b=lambda x: ran.append("b") or x)
    forms.kept = {repr(("k", 1)): "b"}
    assert forms.may_choose(("k", 1), "b") and not forms.may_choose(("k", 1), "a")
    assert forms(("k", 1), 5) == 5 and ran == ["b"] and forms.chosen == {("k", 1): "b"} and not forms.new
    ran.clear()
    forms(("k", 2), 5)  # not kept: timed
    assert sorted(set(ran)) == ["a", "b"] and len(ran) == 2 * FORM_TIMING_TURNS + 1
    assert forms.new == {repr(("k", 2)): forms.chosen[("k", 2)]}
