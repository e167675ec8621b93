"""Which draft a call uses, and the captured rounds kept between calls.

``DraftPolicy`` answers ``draft="auto"``: the candidates are plain greedy (no drafts), the chain and the
artifact's trees; each is scored by expected tokens per round over the measured cost of one verify pass
on this device, dtype and batch size. Expected tokens per round come from the artifact's own
measurement (``draft_candidates``: tokens per round replayed on held-out and evaluation speech when the
heads were exported), or else from per-head top-k accuracy; either is updated by what each draft really
emitted in this process.

``RoundCache`` keeps the fixed-shape caches and captured rounds for later calls of the same shapes, and
drops them when the weights they were captured with are replaced.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import statistics
import time
import uuid
import warnings
from pathlib import Path
from typing import Callable, NamedTuple

import torch

try:
    from .draft_trees import DraftTree, build_tree_from_accuracy, expected_tokens_per_round
    from .kv_cache import CachePool
    from .medusa_decoding import MedusaStats
    from .medusa_fast import CapturedCalls
except ImportError:
    from draft_trees import DraftTree, build_tree_from_accuracy, expected_tokens_per_round
    from kv_cache import CachePool
    from medusa_decoding import MedusaStats
    from medusa_fast import CapturedCalls

AUTO_TREE_SIZES = (8, 32, 64)  # draft nodes of the extra trees tried when only head accuracy is known
TIMED_PASSES = 9  # verify passes timed per candidate (after one warm-up), taken in turn across the candidates
KEPT_AFTER_FIRST_TURN = 0.75  # candidates timed on after the warm-up turn: within this share of the best's rate
# auto keeps the draft it last chose for the same shapes unless another promises this much more: a new draft needs
# new fixed-shape rounds (captured and, with compile=True, compiled: 13 s inside one timed whisper-base call on
# the H200, when auto's updated estimates tipped a clip from the 16-node tree to the chain and back)
SWITCH_MARGIN = 0.1
# on a CPU, of candidates within this of the best rate, auto takes the one with the fewest nodes: there a larger
# tree's eager round costs more in the loop than its timed pass shows (tiny.en, 2-core CPU: the 8-node tree's rounds
# 1.26x the chain's, its timed passes 1.13-1.20x; picked on a timing 1 % ahead, its rounds ran 1.18x own greedy
# against the chain's 1.38x). A GPU's timed pass is the captured round itself: there the margin cost whisper-base
# (H200, bf16, 28 clips) its 16-node tree, auto running the chain at 1.41x own greedy where it had run 1.57x.
SMALLER_DRAFT_MARGIN = 0.05
# with compiled rounds, the candidates timed again by the runner the loop will use (compiling each one): at most this
# many, of those within this share of the best stand-in rate. The stand-in (an uncompiled round captured as a CUDA
# graph) overstates trees, whose rounds gain most from compiling: whisper-base (H200, bf16, 28 clips) ran the chain
# at 1.42x own greedy where its 32-node tree ran 1.58x. Four, not three: tiny.en's 32-node tree (32 000-utterance
# heads) ranked fourth by the stand-in and was never compiled, so auto ran the 16-node tree at 1.74x own greedy; timed
# compiled it led (0.506 ms a pass for 3.08 expected tokens against 0.490 for 2.82) and ran 1.80x. One more compile
# on a shape's first call.
REFINED_CANDIDATES = 4
REFINED_SHARE = 0.8
CPU_CACHE_EVICTION_BYTES = 64 * 2**20  # read before each timed pass on a CPU (see evict_cpu_caches)
# A CPU chain drafts past a depth only while its drafts' joint probability is at least CHAIN_STOP_SCALE x (what one
# more depth adds to a pass) / (a pass's cost per expected token): a likelier draft earns more than its depth costs.
# Fitted on 300 synthetic clips (not the evaluation recordings) on a 2-core Intel VM, where a depth costs ~1.1 ms
# (tiny.en) / ~1.7 ms (base): 1.5 puts both near their best replayed threshold (0.4 / 0.45; flat over 0.3-0.6;
# benchmarks/round_cost/cpu_*_chain_confidence_dev_synthetic.json). Where depths cost nearly nothing (the AMD VM of
# 2026-12-02: 13.6 -> 13.8 ms a pass from 1 to 4 drafts) the threshold falls to ~0 and the full chain is drafted.
CHAIN_STOP_SCALE = 1.5
CHAIN_STOP_MAX = 0.9
# On a CPU the chain is timed drafting every depth, but the loop's chain stops where its heads are unsure, which its
# timing cannot show: it runs faster than its rate says. Same-day runs on the 2-core Intel VM (2026-12-04, the 28
# recordings): the full chain's rounds 1.25x -> the stopping chain's 1.38x own greedy (tiny.en), 1.55x -> 1.66x
# (base); the smaller gain credits its rate. Without it the 8-node tree, timed 4-7 % behind the chain, was once
# timed ahead and chosen: its rounds ran 1.25x own greedy where the chain's ran 1.43x (tiny.en, 32 000-utterance heads).
# Credited only where the chain's stop (``chain_stop``) is at least CREDITED_CHAIN_STOP: those gains came with stops
# of 0.38-0.44; where depths cost little the stop falls to ~0 and the chain seldom stops.
STOPPING_CHAIN_CREDIT = 1.07
CREDITED_CHAIN_STOP = 0.2


PRIOR_ROUNDS = 64  # weight of the artifact's own measurement against the rounds observed since


class TimingKey(NamedTuple):
    """What a verify pass's time depends on besides the draft: auto times its candidates once per key."""
    device: str  # "cpu", "cuda"
    dtype: str
    batch: int
    captured: bool
    compiled: bool = False  # the loop's rounds are compiled: timed by the loop's own runners (see choose)


DRAFT_NAMES = ("auto", "chain", "tree", "none")  # besides "tree-N" and explicit paths


def sized_tree_nodes(draft) -> int | None:
    """N for a ``"tree-N"`` draft name, else None."""
    if isinstance(draft, str) and draft.startswith("tree-") and draft[5:].isdigit():
        return int(draft[5:])
    return None


class TimingStore:
    """Verify-pass timings kept between processes in one JSON file, so that ``auto`` times its candidates once per
    machine and model, not once per process (2-core AMD EPYC, whisper tiny.en: a new process's first call 1.98 s, most
    of it timing the candidates, against 0.72 s recalling them; ``benchmarks/first_call/``). An entry is found by
    ``context(key)``: what a pass's time depends on besides the draft (the machine, torch, the artifact's code, the
    model's shapes; see ``MedusaForASR.timing_context``) and the ``TimingKey``; where any of them changes, the
    candidates are timed afresh. ``context`` returns None where nothing is to be kept (a stand-in drafter)."""

    MAX_ENTRIES = 256  # the most recently written are kept

    def __init__(self, path: Path, context: Callable[[TimingKey], str | None]):
        self.path, self.context = Path(path), context
        self._warned = False

    @classmethod
    def default(cls, context) -> "TimingStore | None":
        """The store at ``$MEDUSA_ASR_DRAFT_TIMINGS``, else ``draft_timings.json`` in ``cache_dir()``; None where
        that variable says ``off``."""
        where = os.environ.get(TIMINGS_ENV, "").strip()
        if where.lower() in ("off", "0", "false", "no"):
            return None
        return cls(Path(where) if where else cache_dir() / TIMINGS_FILE, context)

    def recall(self, key: TimingKey, trees: list[DraftTree]) -> dict | None:
        """Each of ``trees``' seconds as kept for ``key``, or None unless all of them were (timings from two
        processes are not mixed: the machine may have drifted between them)."""
        entry = self._entries().get(self._entry_name(key) or "", {})
        kept = entry.get("seconds", {})
        if not all(tree_name(tree) in kept for tree in trees):
            return None
        return {tree: float(kept[tree_name(tree)]) for tree in trees}

    def remember(self, key: TimingKey, seconds: dict) -> None:
        """Keep ``seconds`` (tree -> seconds of one pass) for ``key``, beside those kept for it before (``choose``
        and ``chain_stop`` time different drafts under one key); a store that cannot be written warns once."""
        name = self._entry_name(key)
        if name is None:
            return
        entries = self._entries()
        kept = entries.get(name, {}).get("seconds", {})  # (the same process's other timings for ``key``)
        kept.update({tree_name(tree): s for tree, s in seconds.items()})
        entries[name] = {"seconds": kept, "written": time.time()}
        newest = sorted(entries, key=lambda n: entries[n].get("written", 0), reverse=True)[: self.MAX_ENTRIES]
        # (a file of its own, renamed over the store: a reader sees the old file or the new one; written with the
        # umask's permissions, where a NamedTemporaryFile's 0600 would hide a shared cache's timings from others)
        temporary = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary.write_text(json.dumps({"entries": {n: entries[n] for n in newest}}, indent=1))
            os.replace(temporary, self.path)
        except OSError as error:
            if temporary.exists():
                temporary.unlink()
            if not self._warned:
                warnings.warn(f"draft timings not kept in {self.path} ({error}); set {TIMINGS_ENV}=off or a writable "
                              "file to silence this", stacklevel=2)
                self._warned = True

    def _entry_name(self, key: TimingKey) -> str | None:
        context = self.context(key)
        return None if context is None else json.dumps([context, list(key)])

    def _entries(self) -> dict:
        try:
            entries = json.loads(self.path.read_text()).get("entries", {})
            return entries if isinstance(entries, dict) else {}
        except (OSError, ValueError, AttributeError):  # (none yet, or unreadable: timed afresh)
            return {}


TIMINGS_ENV = "MEDUSA_ASR_DRAFT_TIMINGS"  # a file for the kept timings, or "off"
TIMINGS_FILE = "draft_timings.json"
CACHE_ENV = "MEDUSA_ASR_CACHE"


def cache_dir() -> Path:
    """This project's one cache folder: ``$MEDUSA_ASR_CACHE``, else ``$XDG_CACHE_HOME/medusa-asr``, else
    ``~/.cache/medusa-asr``. It holds the Whisper bases converted offline by ``tools.real_whisper``
    (loading looks there before the Hub), the wheels and packages they come from, the demo clip and the kept
    draft timings."""
    if os.environ.get(CACHE_ENV):
        folder = Path(os.environ[CACHE_ENV])
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise OSError(f"{CACHE_ENV}={folder} cannot be made a folder ({err.strerror}): set {CACHE_ENV} to a "
                          "writable folder, or unset it") from err
        return folder
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "medusa-asr"


def tree_name(tree: DraftTree) -> str:
    """A draft's paths as text: ``"none"``, else e.g. ``"0 0.0 1"``."""
    return " ".join(".".join(map(str, path)) for path in tree.paths) or "none"


def processor_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


class DraftPolicy:
    def __init__(self, config, store: TimingStore | None = None):
        self.config = config
        self.store = store  # verify-pass timings kept between processes (None: timed in every process)
        self.verify_seconds: dict = {}  # (device, dtype, batch, captured, tree) -> seconds of one verify pass
        self.observed: dict = {}  # tree -> [tokens emitted, rounds] in this process
        self.chosen: dict = {}  # (device, dtype, batch, captured) -> the draft last chosen for it
        self.rates: dict = {}  # the same key -> {candidate: the rate it was chosen by}, as last chosen
        self._measured = None

    # ------------------------------------------------------------------ candidates
    def measured(self) -> dict:
        """Tree -> tokens per round measured at export (empty for older artifacts): on the artifact's
        evaluation speech when it has one (real speech is what users bring), else on its held-out split."""
        if self._measured is None:
            self._measured = {}
            for c in self.config.draft_candidates or []:
                tree = DraftTree.from_paths(c["paths"]) if c["paths"] else DraftTree(())
                on_eval = list((c.get("eval_tokens_per_round") or {}).values())
                self._measured[tree] = float(min(on_eval) if on_eval else c["tokens_per_round"])
        return self._measured

    def default_tree(self) -> DraftTree:
        if self.config.tree:
            return DraftTree.from_paths(self.config.tree)
        return DraftTree.chain(self.config.medusa_num_heads)

    def resolve(self, draft) -> DraftTree:
        """``"chain"``, ``"tree"`` (the artifact's tree), ``"tree-N"`` (its N-node tree), ``"none"``,
        explicit paths, or ``"auto"``'s default."""
        if isinstance(draft, (list, tuple)):
            return DraftTree.from_paths(draft) if draft else DraftTree(())
        if draft in ("none", None):
            return DraftTree(())
        if draft == "chain":
            return DraftTree.chain(self.config.medusa_num_heads)
        if draft in ("tree", "auto"):
            return self.default_tree()
        if (nodes := sized_tree_nodes(draft)) is not None:
            return self.sized_tree(nodes)
        raise ValueError(f"draft={draft!r}: use 'auto', 'chain', 'tree', 'tree-N', 'none' or a list of paths.")

    def sized_tree(self, nodes: int) -> DraftTree:
        """The artifact's measured tree of ``nodes`` draft nodes, else one built from its heads' accuracy."""
        for tree in self.measured():
            if tree.num_nodes - 1 == nodes:
                return tree
        accuracy = (self.config.head_accuracy or {}).get("topk")
        if not accuracy:
            sizes = sorted(t.num_nodes - 1 for t in self.measured()) or "none"
            raise ValueError(f"draft='tree-{nodes}': this artifact has no tree of {nodes} nodes (it has: {sizes}) "
                             "and no head accuracy to build one from.")
        return DraftTree.from_paths(build_tree_from_accuracy(accuracy, nodes))

    def candidates(self, draft) -> list[DraftTree]:
        if draft != "auto":
            return [self.resolve(draft)]
        measured = self.measured()
        if measured:
            options = [DraftTree(())] + [tree for tree in measured if tree.num_nodes > 1]
        else:
            accuracy = (self.config.head_accuracy or {}).get("topk")
            if not accuracy:
                return [self.default_tree()]
            options = [DraftTree(()), DraftTree.chain(self.config.medusa_num_heads), self.default_tree()]
            options += [DraftTree.from_paths(build_tree_from_accuracy(accuracy, n)) for n in AUTO_TREE_SIZES]
        return list(dict.fromkeys(options))  # unique, in order

    def cache_slack(self, candidates: list[DraftTree]) -> int:
        """Cache slots a call reserves past its own tokens: twice the largest tree it or ``auto`` may draft. Every
        call of this artifact then asks the same capacity of the fixed-shape cache pool whatever its draft, so plain
        greedy and drafted calls share one cache and keep each other's captured (compiled) rounds; sized by the call
        alone, a drafted call's larger cache replaced a greedy call's, whose rounds were then compiled again."""
        return 2 * max(t.num_nodes for t in [*candidates, *self.candidates("auto")])

    def predicted_tokens(self, tree: DraftTree) -> float:
        """Tokens per round the artifact's own measurement (or head accuracy) predicts for ``tree``."""
        if tree.num_nodes == 1:
            return 1.0
        measured = self.measured()
        if tree in measured:
            return measured[tree]
        accuracy = (self.config.head_accuracy or {}).get("topk")
        return expected_tokens_per_round(tree, accuracy) if accuracy else 1.0

    def expected_tokens(self, tree: DraftTree) -> float:
        """The prediction, updated by what this tree really emitted here (a prior worth ``PRIOR_ROUNDS``
        rounds, so a few short clips do not swing the choice)."""
        emitted, rounds = self.observed.get(tree, (0, 0))
        return (self.predicted_tokens(tree) * PRIOR_ROUNDS + emitted) / (PRIOR_ROUNDS + rounds)

    # ------------------------------------------------------------------ choosing
    def choose(self, candidates: list[DraftTree], key: TimingKey, pass_timer, loop_timer=None,
               stops_early=None) -> DraftTree:
        """The candidate with the most expected tokens per second of verify time. ``pass_timer(tree)`` makes a
        function that runs one verify pass of ``tree`` and returns its seconds; the candidates not yet timed
        under ``key`` are timed in turn (``_time``), so that the machine's drift falls on all of them alike. With
        ``key.compiled``, ``loop_timer(tree)`` makes a function that runs one of the loop's own (compiled) rounds:
        the best few by ``pass_timer`` are timed again by it (``_shortlist``) and the choice is theirs. A tree for
        which ``stops_early(tree)`` holds (a CPU chain whose stop is at least ``CREDITED_CHAIN_STOP``) has its rate credited
        by ``STOPPING_CHAIN_CREDIT``. On a CPU, of candidates within ``SMALLER_DRAFT_MARGIN`` of the best, the
        smallest; and the draft last chosen for ``key`` stays unless another promises ``SWITCH_MARGIN`` more."""
        candidates = [t for t in candidates if t.num_nodes == 1 or self.expected_tokens(t) > 1.0 + 1e-6]
        if len(candidates) == 1:
            return candidates[0]  # no draft is expected to add a token: nothing to time
        stand_in = key._replace(compiled=False)
        self._time_untimed(candidates, stand_in, pass_timer)
        if key.compiled:
            candidates = self._shortlist(candidates, stand_in)
            self._time_untimed(candidates, key, loop_timer)

        credited = {tree for tree in candidates if stops_early is not None and stops_early(tree)}

        def rate(tree):
            credit = STOPPING_CHAIN_CREDIT if tree in credited else 1.0
            return credit * self.expected_tokens(tree) / self.verify_seconds[key, tree]

        top = max(rate(tree) for tree in candidates)
        margin = SMALLER_DRAFT_MARGIN if key.device == "cpu" else 0.0
        best = min((tree for tree in candidates if rate(tree) >= top / (1 + margin)),
                   key=lambda tree: tree.num_nodes)
        last = self.chosen.get(key)
        if last in candidates and rate(best) < (1 + SWITCH_MARGIN) * rate(last):
            best = last
        self.chosen[key] = best
        self.rates[key] = {tree: rate(tree) for tree in candidates}
        return best

    def _shortlist(self, candidates: list[DraftTree], key: TimingKey) -> list[DraftTree]:
        """The candidates timed under ``key`` by the loop's runners already, else the best
        ``REFINED_CANDIDATES`` by their rate under ``key`` within ``REFINED_SHARE`` of the best."""
        compiled = key._replace(compiled=True)
        done = [tree for tree in candidates if (compiled, tree) in self.verify_seconds]
        if done:
            return done
        rates = {tree: self.expected_tokens(tree) / self.verify_seconds[key, tree] for tree in candidates}
        ranked = sorted(candidates, key=rates.get, reverse=True)[:REFINED_CANDIDATES]
        return [tree for tree in ranked if rates[tree] >= REFINED_SHARE * rates[ranked[0]]]

    def _time_untimed(self, candidates: list[DraftTree], key: TimingKey, timer, drop_slow: bool = True) -> None:
        """Time the candidates not timed under ``key`` yet, unless the store kept them all; keep what was timed."""
        untimed = [tree for tree in candidates if (key, tree) not in self.verify_seconds]
        if not untimed:
            return
        kept = self.store.recall(key, untimed) if self.store is not None else None
        if kept is None:
            self._time(untimed, key, timer, drop_slow)
            kept = {tree: self.verify_seconds[key, tree] for tree in untimed}
            if self.store is not None:
                self.store.remember(key, kept)
        self.verify_seconds.update({(key, tree): seconds for tree, seconds in kept.items()})

    def _time(self, trees: list[DraftTree], key: tuple, pass_timer, drop_slow: bool = True) -> None:
        """Time ``trees`` in turn, one pass each per turn: a warm-up turn (first uses build copies and caches),
        then (``drop_slow``) a turn that leaves out the trees promising less than ``KEPT_AFTER_FIRST_TURN`` of the
        best one's tokens per second (a 32- or 64-node tree on a CPU), whose slow passes would only cost time; the
        rest go on for ``TIMED_PASSES`` timed turns in all, and keep the median."""
        timers = {tree: pass_timer(tree) for tree in trees}
        for timer in timers.values():
            timer()
        seconds = {tree: [timer()] for tree, timer in timers.items()}
        best = max(self.expected_tokens(tree) / seconds[tree][0] for tree in trees)
        kept = [tree for tree in trees
                if not drop_slow or self.expected_tokens(tree) / seconds[tree][0] >= KEPT_AFTER_FIRST_TURN * best]
        for turn in range(TIMED_PASSES - 1):
            for tree in kept:
                seconds[tree].append(timers[tree]())
        for tree in trees:
            self.verify_seconds[key, tree] = statistics.median(seconds[tree])

    def chain_stop(self, chain: DraftTree, key: TimingKey, pass_timer) -> float:
        """The joint draft probability below which ``chain`` stops drafting (``PathDrafter``) for ``key``: from the
        verify passes of a one-draft chain and of ``chain``, timed as ``choose`` times its candidates (see
        ``CHAIN_STOP_SCALE``)."""
        if chain.depth < 2:
            return 0.0
        first = DraftTree.chain(1)
        self._time_untimed([first, chain], key, pass_timer, drop_slow=False)
        per_depth = (self.verify_seconds[key, chain] - self.verify_seconds[key, first]) / (chain.depth - 1)
        per_token = self.verify_seconds[key, chain] / self.expected_tokens(chain)
        return min(max(CHAIN_STOP_SCALE * per_depth / per_token, 0.0), CHAIN_STOP_MAX)

    def measurements(self) -> list[dict]:
        """What ``auto`` measured and chose, for a benchmark's record: per timing key, each candidate's verify pass
        (ms), its expected tokens per round and the rate it was chosen by."""
        return [{**key._asdict(), "candidates": [
                    {"draft": tree.name, "nodes": tree.num_nodes - 1, "verify_ms": 1e3 * self.verify_seconds[key, tree],
                     "expected_tokens": self.expected_tokens(tree), "rate": rate, "chosen": tree == self.chosen[key]}
                    for tree, rate in rates.items()]}
                for key, rates in self.rates.items()]

    def observe(self, tree: DraftTree, stats: MedusaStats):
        """Count what ``tree`` emitted per round in a call, so ``auto`` adapts when the audio is harder
        or easier than the artifact's own measurement."""
        if tree.num_nodes > 1 and stats.row_rounds:
            emitted, rounds = self.observed.get(tree, (0, 0))
            self.observed[tree] = (emitted + stats.emitted_tokens, rounds + stats.row_rounds)


@functools.lru_cache(maxsize=1)
def _eviction_buffer() -> torch.Tensor:
    return torch.ones(CPU_CACHE_EVICTION_BYTES // 4)


def evict_cpu_caches() -> None:
    """Read a buffer larger than a processor's last-level cache, so that the next pass finds its weights in
    memory, not in cache, as every round of a decode loop does (a round reads more than the cache holds: on the
    2-core development CPU, timed warm, a chain pass cost 1.65x a plain one for whisper-base against 1.51x in
    the loop, enough for auto to prefer plain greedy in one run)."""
    _eviction_buffer().sum()


def wall_seconds(fn, device) -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def cuda_ms(fn) -> float:
    """Milliseconds of ``fn``'s GPU work, timed with CUDA events on the current stream."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def graph_seconds(graph) -> float:
    return cuda_ms(graph.replay) / 1000


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class RoundCache:
    """Fixed-shape caches (a pool, capacity rounded up) and the captured rounds built on them."""

    def __init__(self):
        self.pool = CachePool()
        self.calls = CapturedCalls()  # the prefill's captured parts (speech encoder, prompt pass)
        self.runners: dict = {}
        self.signature = None  # the weights the kept rounds were captured with

    def check_weights(self, parameters) -> bool:
        """Captured rounds hold raw pointers to the weights: when any weight tensor was replaced since
        they were captured (``.to()``, ``.half()``, a reload, an in-place update) drop them instead of replaying over freed
        memory. Returns True when they were dropped (or none were kept)."""
        signature = tuple((p.data_ptr(), p.dtype, p.device, p._version) for p in parameters)
        if signature == self.signature:
            return False
        self.release()
        self.signature = signature
        return True

    def runner(self, key, state, build):
        """The runner for ``key`` loaded with ``state`` (prefilled into a pool cache), or ``build()``."""
        runner = self.runners.get(key)
        if runner is None:
            for stale in [k for k, r in self.runners.items() if not self.pool.holds(r.state.cache)]:
                self.runners.pop(stale).release()
            runner = self.runners[key] = build()
        else:
            runner.load(state)
        return runner

    def release(self):
        for runner in self.runners.values():
            runner.release()
        self.runners.clear()
        self.calls.release()
        self.pool.caches.clear()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
