"""draft="auto": measured candidates, their verify cost, and what each draft emits here."""

import pytest

from configuration_medusa import MedusaConfig
from draft_policy import PRIOR_ROUNDS, DraftPolicy, TimingKey, TimingStore
from draft_timing import time_drafts
from draft_trees import DraftTree
from medusa_decoding import MedusaStats

CHAIN = [[0], [0, 0]]
TREE = [[0], [1], [0, 0]]


def policy() -> DraftPolicy:
    return DraftPolicy(MedusaConfig(base_family="whisper", medusa_num_heads=2, draft_candidates=[
        {"paths": CHAIN, "nodes": 2, "tokens_per_round": 2.0},
        {"paths": TREE, "nodes": 3, "tokens_per_round": 2.6, "eval_tokens_per_round": {"real": 2.4}}]))


def choose(p: DraftPolicy, key: TimingKey, timer, loop_timer=None, credited=(), context=None) -> DraftTree:
    """What the model does with auto's candidates: time what the policy asks for (with compiled rounds, its shortlist
    again by the loop's runners), then take its choice."""
    contenders, stand_in = p.contenders(p.candidates("auto")), key._replace(compiled=False)
    time_drafts(p, contenders, stand_in, context, timer)
    if key.compiled:
        time_drafts(p, p.shortlist(contenders, stand_in), key, context, loop_timer)
    return p.choose(contenders, key, set(credited))


def chain_stop(p: DraftPolicy, chain: DraftTree, key: TimingKey, timer, context=None) -> float:
    time_drafts(p, DraftPolicy.chain_stop_drafts(chain), key, context, timer, drop_slow=False)
    return p.chain_stop(chain, key)


def fixed(costs: dict):
    return lambda tree: lambda: costs[tree.num_nodes]


def test_candidates_are_plain_greedy_and_every_measured_tree_predicted_from_real_speech_first():
    p = policy()
    assert [t.num_nodes for t in p.candidates("auto")] == [1, 3, 4]
    assert p.expected_tokens(DraftTree.from_paths(CHAIN)) == 2.0
    assert p.expected_tokens(DraftTree.from_paths(TREE)) == 2.4  # the evaluation speech, not the held-out split


def test_the_cheaper_per_token_draft_wins():
    p = policy()
    costs = {1: 1.0, 3: 1.5, 4: 2.2}
    chosen = choose(p, TimingKey("cpu", "f32", 1, False), fixed(costs))
    assert chosen == DraftTree.from_paths(CHAIN)  # 2.0 / 1.5 beats 2.4 / 2.2 and 1 / 1


def test_candidates_are_timed_in_turn_and_keep_the_median_of_their_timed_passes():
    """A warm-up turn, then a turn that times every candidate once and leaves out those far behind the best (here
    plain greedy); the rest are timed pass by pass in turn, so a slow moment during one turn moves no median."""
    from draft_timing import TIMED_PASSES

    p, order, clock, costs = policy(), [], iter(range(10_000)), {1: 1.0, 3: 1.5, 4: 1.6}

    def timer(tree):
        def one_pass():
            order.append(tree.num_nodes)
            return 100.0 if next(clock) == 8 else costs[tree.num_nodes]  # (a hiccup while the chain is timed)
        return one_pass

    key = TimingKey("cpu", "f32", 1, False)
    chosen = choose(p, key, timer)
    assert order == [1, 3, 4] * 2 + [3, 4] * (TIMED_PASSES - 1)  # plain greedy (1 token/s against 1.5) timed once
    assert {tree.num_nodes: p.seconds(key, tree) for tree in p.candidates("auto")} == costs
    assert chosen == DraftTree.from_paths(TREE)  # 2.4 / 1.6 beats 2.0 / 1.5 and 1 / 1


def test_observed_rounds_move_the_prediction_smoothly_and_other_trees_keep_theirs():
    p = policy()
    tree = DraftTree.from_paths(TREE)
    p.update(tree, MedusaStats(emitted_tokens=12, row_rounds=10))  # a short, hard clip: 1.2 per round
    assert 2.2 < p.expected_tokens(tree) < 2.4  # one clip does not swing it
    for _ in range(50):
        p.update(tree, MedusaStats(emitted_tokens=12, row_rounds=10))
    assert abs(p.expected_tokens(tree) - (2.4 * PRIOR_ROUNDS + 612) / (PRIOR_ROUNDS + 510)) < 1e-9
    assert p.expected_tokens(DraftTree.from_paths(CHAIN)) == 2.0
    p.update(DraftTree(()), MedusaStats(emitted_tokens=5, row_rounds=5))  # plain greedy teaches nothing
    assert p.expected_tokens(DraftTree(())) == 1.0


def test_tree_n_is_the_artifacts_tree_of_n_nodes_or_one_built_from_head_accuracy():
    p = policy()
    assert p.resolve("tree-3") == DraftTree.from_paths(TREE)
    assert p.resolve("tree-2") == DraftTree.from_paths(CHAIN)
    p.config.head_accuracy = {"topk": [[0.6, 0.7], [0.3, 0.4]]}
    assert p.resolve("tree-4").num_nodes == 5  # not measured: built from the heads' top-k accuracy
    p.config.head_accuracy = None
    with pytest.raises(ValueError, match="no tree of 4 nodes"):
        p.resolve("tree-4")


def test_every_draft_reserves_the_same_cache_slack():
    """Plain greedy, a chain and auto ask the fixed-shape cache pool for the same capacity (twice the largest tree
    auto may pick), so their captured rounds share one cache instead of a drafted call's replacing a greedy one's;
    a larger explicit tree reserves more."""
    p = policy()
    slacks = {draft: p.cache_slack(p.candidates(draft)) for draft in ("none", "chain", "auto", "tree")}
    assert set(slacks.values()) == {2 * 4}
    assert p.cache_slack([DraftTree.from_paths([[0], [1], [2], [3], [4], [0, 0]])]) == 2 * 7


def test_auto_keeps_its_last_draft_unless_another_promises_clearly_more():
    """A new draft needs new fixed-shape rounds (compiled, seconds): estimates that drift by a few per cent do
    not flip the choice back and forth; a clear gain does."""
    from draft_policy import SWITCH_MARGIN

    p, key = policy(), TimingKey("cuda", "bf16", 1, True)
    costs = {1: 1.0, 3: 1.5, 4: 1.6}
    chain, tree = DraftTree.from_paths(CHAIN), DraftTree.from_paths(TREE)
    assert choose(p, key, fixed(costs)) == tree  # 1.5 against 1.33
    p.update(tree, MedusaStats(emitted_tokens=int(1.6 * PRIOR_ROUNDS), row_rounds=PRIOR_ROUNDS))  # 2.4 -> 2.0
    assert p.expected_tokens(chain) / 1.5 > p.expected_tokens(tree) / 1.6  # the chain is now ahead, by little
    assert choose(p, key, None) == tree
    p.update(tree, MedusaStats(emitted_tokens=10 * PRIOR_ROUNDS, row_rounds=10 * PRIOR_ROUNDS))  # 1 per round
    assert p.expected_tokens(chain) / 1.5 > (1 + SWITCH_MARGIN) * p.expected_tokens(tree) / 1.6
    assert choose(p, key, None) == chain


def test_of_nearly_equal_drafts_auto_takes_the_smaller_on_a_cpu():
    from draft_policy import SMALLER_DRAFT_MARGIN

    p, key = policy(), TimingKey("cpu", "f32", 1, False)
    # the tree 2 % ahead of the chain by its timing: within the margin, so the chain (fewer nodes)
    costs = {1: 0.9, 3: 1.0, 4: 2.4 / 2.0 * 1.0 / 1.02}
    assert SMALLER_DRAFT_MARGIN > 0.02
    assert choose(p, key, fixed(costs)) == DraftTree.from_paths(CHAIN)
    # a GPU's timed pass is the captured round itself: there the best rate wins, however close
    gpu = TimingKey("cuda", "bf16", 1, True)
    assert choose(p, gpu, fixed(costs)) == DraftTree.from_paths(TREE)


def test_a_chain_that_stops_early_is_credited_and_what_auto_measured_is_reported():
    """On a CPU the loop's chain stops where its heads are unsure, which its timed (full) pass cannot show: its
    rate is credited by STOPPING_CHAIN_CREDIT, so a tree timed a little ahead of it no longer wins."""
    from draft_policy import SMALLER_DRAFT_MARGIN, STOPPING_CHAIN_CREDIT

    chain, tree, key = DraftTree.from_paths(CHAIN), DraftTree.from_paths(TREE), TimingKey("cpu", "f32", 1, False)
    ahead = 1 + (SMALLER_DRAFT_MARGIN + STOPPING_CHAIN_CREDIT - 1) / 2  # past the margin, short of margin + credit
    costs = {1: 0.9, 3: 1.0, 4: 2.4 / 2.0 / ahead}
    p = policy()
    assert choose(p, key, fixed(costs)) == tree
    p = policy()
    assert choose(p, key, fixed(costs), credited={chain}) == chain
    [record] = p.measurements()
    assert record["device"] == "cpu" and record["batch"] == 1
    by_draft = {c["draft"]: c for c in record["candidates"]}
    assert by_draft["chain of 2"]["chosen"] and not by_draft["tree of 3 nodes"]["chosen"]
    assert by_draft["chain of 2"]["rate"] == pytest.approx(STOPPING_CHAIN_CREDIT * 2.0 / 1.0)
    assert by_draft["tree of 3 nodes"]["verify_ms"] == pytest.approx(1e3 * costs[4])


def test_with_compiled_rounds_the_best_few_are_timed_again_by_the_loops_own_runners():
    """The stand-in pass (an uncompiled graph) overstates trees; with compiled rounds the candidates near the best
    stand-in rate are timed again by the runner the loop will use (one compile each), and those times decide.
    Candidates far behind are never compiled."""
    from draft_policy import REFINED_CANDIDATES

    p, key = policy(), TimingKey("cuda", "bf16", 1, True, compiled=True)
    stand_in = {1: 1.0, 3: 1.5, 4: 2.0}  # rates 1.0, 1.33, 1.2: the chain leads
    loop = {1: 1.0, 3: 1.4, 4: 1.5}  # compiled, the tree's round is far cheaper: 1.43 against 1.6
    compiled = []

    def loop_timer(tree):
        compiled.append(tree.num_nodes)
        return lambda: loop[tree.num_nodes]

    chosen = choose(p, key, fixed(stand_in), loop_timer)
    assert chosen == DraftTree.from_paths(TREE)
    assert sorted(compiled) == [3, 4] and len(compiled) <= REFINED_CANDIDATES  # plain greedy (0.75 of the best) not
    assert choose(p, key, None, None) == chosen  # timed once per key: nothing is rebuilt
    uncompiled = key._replace(compiled=False)  # the same machine without compile: the stand-in decides
    assert choose(p, uncompiled, None) == DraftTree.from_paths(CHAIN)


def test_a_cpu_chain_stops_where_one_more_depth_costs_more_than_the_tokens_it_likely_adds():
    """The stop threshold is CHAIN_STOP_SCALE x (a depth's cost) / (a pass's cost per expected token), from the
    timed passes of a one-draft chain and of the chain itself (each the median of its timed passes); where a
    depth costs nearly nothing the full chain is drafted."""
    from draft_policy import CHAIN_STOP_MAX, CHAIN_STOP_SCALE
    from draft_timing import TIMED_PASSES

    chain, key = DraftTree.from_paths(CHAIN), TimingKey("cpu", "f32", 1, False)  # 2 drafts, 2.0 tokens per round
    passes = []

    def timer(costs):
        return lambda tree: lambda: passes.append(tree.depth) or costs[tree.depth]

    stop = chain_stop(policy(), chain, key, timer({1: 10.0, 2: 12.0}))
    assert stop == pytest.approx(CHAIN_STOP_SCALE * 2.0 / (12.0 / 2.0))
    assert passes.count(1) == passes.count(2) == TIMED_PASSES + 1  # both timed fully (after a warm-up pass)
    assert chain_stop(policy(), chain, key, timer({1: 10.0, 2: 10.01})) < 0.01
    assert chain_stop(policy(), chain, key, timer({1: 1.0, 2: 12.0})) == CHAIN_STOP_MAX
    assert chain_stop(policy(), DraftTree.chain(1), key, timer({1: 10.0})) == 0.0  # nothing to stop before


# --------------------------------------------------------------------------- timings kept between processes


def counting_timer(costs: dict, calls: list):
    def timer(tree):
        def one_pass():
            calls.append(tree.num_nodes)
            return costs[tree.num_nodes]
        return one_pass
    return timer


def stored_policy(path) -> DraftPolicy:
    p = policy()
    p.store = TimingStore(path)
    return p


def test_a_later_process_recalls_the_kept_timings_instead_of_timing_again(tmp_path):
    key, costs = TimingKey("cpu", "f32", 1, False), {1: 1.0, 3: 1.5, 4: 2.2}
    first_calls, later_calls = [], []
    first = stored_policy(tmp_path / "timings.json")
    chosen = choose(first, key, counting_timer(costs, first_calls), context="machine A")
    later = stored_policy(tmp_path / "timings.json")  # a new process: a new model, the same file
    assert choose(later, key, counting_timer(costs, later_calls), context="machine A") == chosen
    assert first_calls and not later_calls
    assert {t: later.timings[key, t] for t in later.candidates("auto")} == \
        {t: first.timings[key, t] for t in first.candidates("auto")}
    # the chain's stop times a one-draft chain too, under the same key: kept beside the candidates, recalled too
    chain = DraftTree.from_paths(CHAIN)
    costs[2] = 1.2
    stop = chain_stop(first, chain, key, counting_timer(costs, first_calls), context="machine A")
    again = stored_policy(tmp_path / "timings.json")
    assert chain_stop(again, chain, key, counting_timer(costs, later_calls), context="machine A") == stop
    assert choose(again, key, counting_timer(costs, later_calls), context="machine A") == chosen
    assert not later_calls


def test_kept_timings_are_recalled_only_for_the_same_machine_and_key_and_never_mixed(tmp_path):
    key, costs = TimingKey("cpu", "f32", 1, False), {1: 1.0, 3: 1.5, 4: 2.2}
    first = stored_policy(tmp_path / "t.json")
    choose(first, key, counting_timer(costs, []), context="machine A")
    for context, other_key in (("machine B", key), ("machine A", key._replace(batch=4))):
        calls = []
        choose(stored_policy(tmp_path / "t.json"), other_key, counting_timer(costs, calls), context=context)
        assert sorted(set(calls)) == [1, 3, 4]  # timed afresh
    # a candidate the file does not hold: every untimed candidate is timed again, none recalled beside them
    p, calls = stored_policy(tmp_path / "t.json"), []
    p.config.draft_candidates.append({"paths": [[0], [1], [2]], "nodes": 3, "tokens_per_round": 2.5})
    p._measured = None
    choose(p, key, counting_timer({**costs, 4: 2.2}, calls), context="machine A")
    assert sorted(set(calls)) == [1, 3, 4]


def test_nothing_is_kept_without_a_context_and_an_unwritable_store_warns_once(tmp_path):
    key, costs = TimingKey("cpu", "f32", 1, False), {1: 1.0, 3: 1.5, 4: 2.2}
    choose(stored_policy(tmp_path / "t.json"), key, counting_timer(costs, []), context=None)  # (a stand-in drafter)
    assert not (tmp_path / "t.json").exists()
    (tmp_path / "file").write_text("")
    p = stored_policy(tmp_path / "file" / "t.json")  # its folder is a file
    with pytest.warns(UserWarning, match="draft timings not kept") as caught:
        choose(p, key, counting_timer(costs, []), context="machine A")
        chain_stop(p, DraftTree.from_paths(CHAIN), key, counting_timer({**costs, 2: 1.2}, []), context="machine A")
    assert len(caught) == 1
    assert p.chosen[key] == DraftTree.from_paths(CHAIN)  # chosen all the same


def test_the_store_is_where_the_option_says_or_in_the_cache_folder_or_off(tmp_path, monkeypatch):
    from medusa_options import TIMINGS_ENV, MedusaOptions

    monkeypatch.setenv("MEDUSA_ASR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(TIMINGS_ENV, "")
    assert TimingStore.at(MedusaOptions().draft_timings).path == tmp_path / "cache" / "draft_timings.json"
    monkeypatch.setenv(TIMINGS_ENV, str(tmp_path / "mine.json"))
    assert TimingStore.at(MedusaOptions().draft_timings).path == tmp_path / "mine.json"
    assert TimingStore.at(MedusaOptions(draft_timings="off").draft_timings) is None
    monkeypatch.setenv(TIMINGS_ENV, "off")
    assert TimingStore.at(MedusaOptions().draft_timings) is None


def test_with_compiled_rounds_a_later_process_compiles_no_candidate_to_time_it(tmp_path):
    """The stand-in passes and the compiled runners' timings are both kept: a later process recalls the same
    shortlist and choice without capturing or compiling any candidate (the loop then compiles the draft it runs)."""
    key = TimingKey("cuda", "bf16", 1, True, compiled=True)
    stand_in, loop = {1: 1.0, 3: 1.5, 4: 2.0}, {1: 1.0, 3: 1.4, 4: 1.5}
    built = []

    def timers(costs):
        return lambda tree: built.append(tree.num_nodes) or (lambda: costs[tree.num_nodes])

    first = stored_policy(tmp_path / "t.json")
    chosen = choose(first, key, timers(stand_in), timers(loop), context="GPU A")
    assert chosen == DraftTree.from_paths(TREE) and built
    built.clear()
    later = stored_policy(tmp_path / "t.json")
    assert choose(later, key, timers(stand_in), timers(loop), context="GPU A") == chosen
    assert not built


# --------------------------------------------------------------------------- implausible and stale timings


def test_noisy_timings_are_timed_again_and_never_kept(tmp_path):
    """Passes whose spread says the machine was busy are refused: timed again, and where they stay noisy used by
    this process only (auto runs the artifact's default draft), never written for later processes."""
    from draft_policy import MAX_TIMING_SPREAD

    key = TimingKey("cpu", "f32", 1, False)
    calm, built = {1: 1.0, 3: 1.5, 4: 1.6}, []
    turns = iter(range(10_000))

    def noisy_once(tree):  # the first timing's passes swing by half; the second's are steady
        built.append(tree)
        noisy = len(built) <= 3
        return lambda: calm[tree.num_nodes] * (1.5 if noisy and next(turns) % 2 else 1.0)

    p = stored_policy(tmp_path / "t.json")
    assert choose(p, key, noisy_once, context="machine A") == DraftTree.from_paths(TREE)
    assert len(built) == 6 and all(p.timings[key, t].spread <= MAX_TIMING_SPREAD for t in p.candidates("auto"))
    assert TimingStore(tmp_path / "t.json").recall("machine A", key, p.candidates("auto")) is not None

    def always_noisy(tree):
        return lambda: calm[tree.num_nodes] * (1.5 if next(turns) % 2 else 1.0)

    p = stored_policy(tmp_path / "u.json")
    assert choose(p, key, always_noisy, context="machine A") == p.default_tree()
    assert not (tmp_path / "u.json").exists() and not p.measurements()[0]["plausible"]
    assert choose(p, key, None, context="machine A") == p.default_tree()  # not timed on every call


def test_a_draft_timed_slower_than_one_verifying_more_is_rejected(tmp_path):
    """The timings of issue 53: plain greedy at 0.546 s a pass and a tree at 0.332 s cannot both be true (a tree
    verifies plain greedy's token and more): refused, timed again, and a steady machine's timings kept instead."""
    key, built = TimingKey("cpu", "f32", 1, False), []
    busy, quiet = {1: 0.546, 3: 0.30, 4: 0.332}, {1: 0.10, 3: 0.13, 4: 0.15}

    def timer(tree):  # the first timing's passes as on the busy machine, the second's as on a steady one
        built.append(tree)
        seconds = (busy if len(built) <= 3 else quiet)[tree.num_nodes]
        return lambda: seconds

    p = stored_policy(tmp_path / "t.json")
    choose(p, key, timer, context="machine A")
    kept = TimingStore(tmp_path / "t.json").recall("machine A", key, p.candidates("auto"))
    assert {t.num_nodes: timing.seconds for t, timing in kept.items()} == quiet
    p = stored_policy(tmp_path / "u.json")
    assert choose(p, key, fixed(busy), context="machine A") == p.default_tree()  # stays impossible: not trusted
    assert not (tmp_path / "u.json").exists()


def test_a_recalled_choice_the_loop_disagrees_with_is_timed_again(tmp_path):
    """Timings kept while the machine was busy: a later process recalls them, its loop's rounds run far faster than
    they say, and its next call times the candidates afresh and replaces the kept entry (once a process). Its first
    call's rounds, cold, are not compared: a second call timing everything again cost more than the first call."""
    from draft_policy import RECHECK_FACTOR

    key, busy, quiet = TimingKey("cpu", "f32", 1, False), {1: 1.0, 3: 1.5, 4: 1.6}, {1: 0.1, 3: 0.12, 4: 0.5}
    choose(stored_policy(tmp_path / "t.json"), key, fixed(busy), context="machine A")
    later, calls = stored_policy(tmp_path / "t.json"), []
    tree = choose(later, key, counting_timer(quiet, calls), context="machine A")
    assert tree == DraftTree.from_paths(TREE) and not calls  # recalled
    rounds = MedusaStats(rounds=10, row_rounds=10, emitted_tokens=24)
    later.update(tree, rounds, key, rounds_seconds=10 * 1.6 * 3)  # the process's first rounds, cold: not compared
    assert choose(later, key, counting_timer(quiet, calls), context="machine A") == tree and not calls
    later.update(tree, rounds, key, rounds_seconds=10 * 1.6)  # as timed: nothing to re-check
    assert choose(later, key, counting_timer(quiet, calls), context="machine A") == tree and not calls
    assert RECHECK_FACTOR < 5
    later.update(tree, rounds, key, rounds_seconds=10 * 1.6 / 5)  # the loop's rounds 5x faster than kept
    assert choose(later, key, counting_timer(quiet, calls), context="machine A") == DraftTree.from_paths(CHAIN)
    assert sorted(set(calls)) == [1, 3, 4]  # timed afresh
    kept = TimingStore(tmp_path / "t.json").recall("machine A", key, later.candidates("auto"))
    assert {t.num_nodes: timing.seconds for t, timing in kept.items()} == quiet
    calls.clear()
    later.update(DraftTree.from_paths(CHAIN), rounds, key, rounds_seconds=100.0)  # timed here: not re-checked
    assert choose(later, key, counting_timer(quiet, calls), context="machine A") == DraftTree.from_paths(CHAIN)
    assert not calls


def test_auto_scores_again_only_when_a_timing_changed_or_enough_rounds_were_seen():
    """Between scorings a call takes the kept choice: scoring is host work a small Whisper's GPU call cannot hide."""
    from draft_policy import RESCORE_ROUNDS

    p, key = policy(), TimingKey("cuda", "bf16", 1, True)
    tree = DraftTree.from_paths(TREE)
    contenders = p.contenders(p.candidates("auto"))
    assert p.settled(contenders, key) is None  # never chosen
    assert choose(p, key, fixed({1: 1.0, 3: 1.5, 4: 1.6})) == tree
    assert p.settled(contenders, key) == tree
    assert p.settled(contenders[:2], key) is None  # other candidates
    assert p.settled(contenders, key._replace(batch=4)) is None  # another key
    p.update(tree, MedusaStats(emitted_tokens=RESCORE_ROUNDS, row_rounds=RESCORE_ROUNDS - 1))
    assert p.settled(contenders, key) == tree
    p.update(tree, MedusaStats(emitted_tokens=1, row_rounds=1))
    assert p.settled(contenders, key) is None  # enough rounds seen: scored again
    assert choose(p, key, None) == tree and p.settled(contenders, key) == tree
    p.report(key._replace(batch=2), {tree: [1.0]})  # any timing changes: scored again
    assert p.settled(contenders, key) is None
