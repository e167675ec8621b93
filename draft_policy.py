"""Which draft a call uses: ``DraftPolicy``, in the shape of transformers' candidate generators.

``DraftPolicy`` answers ``draft="auto"``: the candidates are plain greedy (no drafts), the chain and the
artifact's trees; each is scored by expected tokens per round over the measured cost of one verify pass
on this device, dtype and batch size. Expected tokens per round come from the artifact's own
measurement (``draft_candidates``: tokens per round replayed on held-out and evaluation speech when the
heads were exported), or else from per-head top-k accuracy; either is updated by what each draft really
emitted in this process.

The model asks and reports; the policy never runs anything: ``to_time`` names the trees the model must time
under a ``TimingKey`` (none where this process or the ``TimingStore`` already has them), ``report`` hands it the
timed passes (kept with their spread, refused when noisy or impossible), ``choose`` and ``chain_stop`` answer from
what was kept, and ``update`` after each call takes what the rounds emitted and how long they took (a kept choice
the loop's own rate disagrees with is timed again).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
import uuid
import warnings
from pathlib import Path
from typing import NamedTuple

try:
    from .draft_trees import DraftTree, build_tree_from_accuracy, expected_tokens_per_round
    from .medusa_decoding import MedusaStats
    from .medusa_options import TIMINGS_ENV, cache_dir
except ImportError:
    from draft_trees import DraftTree, build_tree_from_accuracy, expected_tokens_per_round
    from medusa_decoding import MedusaStats
    from medusa_options import TIMINGS_ENV, cache_dir

AUTO_TREE_SIZES = (8, 32, 64)  # draft nodes of the extra trees tried when only head accuracy is known
# auto keeps the draft it last chose for the same shapes unless another promises this much more: a new draft needs
# new fixed-shape rounds (captured and, with compile=True, compiled: seconds inside a call)
SWITCH_MARGIN = 0.1
# on a CPU, of candidates within this of the best rate, auto takes the one with the fewest nodes: there a larger
# tree's eager round costs more in the loop than its timed pass shows. A GPU's timed pass is the captured round
# itself: there the best rate wins, however close.
SMALLER_DRAFT_MARGIN = 0.05
# with compiled rounds, the candidates timed again by the runner the loop will use (compiling each one): at most this
# many, of those within this share of the best stand-in rate. The stand-in (an uncompiled round captured as a CUDA
# graph) overstates trees, whose rounds gain most from compiling, so more than the stand-in's best are compiled.
REFINED_CANDIDATES = 4
REFINED_SHARE = 0.8
# A CPU chain drafts past a depth only while its drafts' joint probability is at least CHAIN_STOP_SCALE x (what one
# more depth adds to a pass) / (a pass's cost per expected token): a likelier draft earns more than its depth costs.
# Fitted on synthetic clips, never the evaluation recordings (benchmarks/round_cost/); where depths cost nearly
# nothing the threshold falls to ~0 and the full chain is drafted.
CHAIN_STOP_SCALE = 1.5
CHAIN_STOP_MAX = 0.9
# On a CPU the chain is timed drafting every depth, but the loop's chain stops where its heads are unsure, which its
# timing cannot show: it runs faster than its rate says, by about this much where it stops at all (a stop of at least
# CREDITED_CHAIN_STOP; where depths cost little the stop falls to ~0 and the chain seldom stops).
STOPPING_CHAIN_CREDIT = 1.07
CREDITED_CHAIN_STOP = 0.2
PRIOR_ROUNDS = 64  # weight of the artifact's own measurement against the rounds observed since
# A tree's timed passes are refused (timed again, else used by this process only while auto falls back to the
# artifact's default draft) when their interquartile range exceeds this share of their median: timings taken while
# the machine was busy with other work would otherwise fix auto's choice for every later process.
MAX_TIMING_SPREAD = 0.25
# ... or when a draft whose nodes are a subset of another's is timed this much slower than it: verifying more nodes
# cannot cost less (the slack is for kernels that differ by shape).
ORDER_SLACK = 0.25
# A kept (recalled) choice is timed afresh once when the loop's own seconds per round differ from the kept pass's by
# more than this factor either way: the machine is not the one (or not as busy as) when they were timed.
RECHECK_FACTOR = 2.0
# auto scores its candidates again only after this many rounds were observed since it last chose (or when a timing
# changed): scoring is host work, and a GPU call of a small Whisper is bound by its host work (auto's setup against a
# fixed draft's: benchmarks/real_speech/h100_base_drafts_bfloat16*); a few rounds barely move a tree's expected
# tokens (a prior of PRIOR_ROUNDS rounds).
RESCORE_ROUNDS = 32


class TimingKey(NamedTuple):
    """What a verify pass's time depends on besides the draft and the model: auto times its candidates once per key."""
    device: str  # "cpu", "cuda"
    dtype: str
    batch: int
    captured: bool
    compiled: bool = False  # the loop's rounds are compiled: timed by the loop's own runners (see choose)


class Timing(NamedTuple):
    """A tree's verify pass under one key: the median of its timed passes and their interquartile range over it."""
    seconds: float
    spread: float = 0.0


def judged(passes: list[float]) -> Timing:
    """The timing of a tree's timed passes (fewer than four: no spread to judge)."""
    median = statistics.median(passes)
    if len(passes) < 4 or median <= 0:
        return Timing(median)
    quartiles = statistics.quantiles(passes, n=4)
    return Timing(median, (quartiles[2] - quartiles[0]) / median)


def implausible(timings: dict) -> str | None:
    """Why these timings (tree -> Timing, one key) cannot be trusted, or None: a noisy tree, or a draft timed clearly
    slower than one that verifies a superset of its nodes."""
    for tree, timing in timings.items():
        if timing.spread > MAX_TIMING_SPREAD:
            return f"{tree.name}: passes spread {timing.spread:.0%} about their median"
    for small, small_timing in timings.items():
        for large, large_timing in timings.items():
            if set(small.paths) < set(large.paths) and small_timing.seconds > (1 + ORDER_SLACK) * large_timing.seconds:
                return f"{small.name} timed slower than {large.name}, which verifies more"
    return None


DRAFT_NAMES = ("auto", "chain", "tree", "none")  # besides "tree-N" and explicit paths


def sized_tree_nodes(draft) -> int | None:
    """N for a ``"tree-N"`` draft name, else None."""
    if isinstance(draft, str) and draft.startswith("tree-") and draft[5:].isdigit():
        return int(draft[5:])
    return None


class TimingStore:
    """Verify-pass timings kept between processes in one JSON file, so that ``auto`` times its candidates once per
    machine and model, not once per process (a new process's first call then skips most of its set-up). An entry is
    found by a context (what a pass's time depends on besides the draft: the machine, torch, the artifact's code, the
    model's shapes; see ``MedusaForASR.timing_context``) and the ``TimingKey``; where either changes, the candidates
    are timed afresh. Each timing is kept with its spread; only timings ``implausible`` lets pass are written. The
    CPU product forms chosen by timing (``cpu_kernels.TIMED_FORMS``) are kept under the context too."""

    MAX_ENTRIES = 256  # the most recently written are kept

    def __init__(self, path: Path):
        self.path = Path(path)
        self._warned = False

    @classmethod
    def at(cls, where: str | None) -> "TimingStore | None":
        """The store in the file ``where``, else ``draft_timings.json`` in ``cache_dir()``; None for ``off``."""
        where = (where or "").strip()
        if where.lower() in ("off", "0", "false", "no"):
            return None
        return cls(Path(where) if where else cache_dir() / TIMINGS_FILE)

    def recall(self, context: str, key: TimingKey, trees: list[DraftTree]) -> dict | None:
        """Each of ``trees``' timing as kept for ``key``, or None unless all of them were (timings from two processes
        are not mixed: the machine may have drifted between them)."""
        entry = self._entries().get(self._entry_name(context, key), {})
        seconds, spread = entry.get("seconds", {}), entry.get("spread", {})
        names = [tree_name(tree) for tree in trees]
        if not all(name in seconds and name in spread for name in names):
            return None
        return {tree: Timing(float(seconds[name]), float(spread[name])) for tree, name in zip(trees, names)}

    def remember(self, context: str, key: TimingKey, timings: dict) -> None:
        """Keep ``timings`` (tree -> Timing) for ``key``, beside those kept for it before (``choose`` and ``chain_stop``
        time different drafts under one key); a store that cannot be written warns once."""
        name = self._entry_name(context, key)
        entries = self._entries()
        entry = entries.get(name, {})
        seconds, spread = entry.get("seconds", {}), entry.get("spread", {})
        seconds.update({tree_name(tree): timing.seconds for tree, timing in timings.items()})
        spread.update({tree_name(tree): timing.spread for tree, timing in timings.items()})
        entries[name] = {"seconds": seconds, "spread": spread, "written": time.time()}
        self._write(entries)

    def recall_forms(self, context: str) -> dict:
        """The CPU product forms kept under ``context``: {product: {key text: form}} (``cpu_kernels.recall_forms``)."""
        return self._forms(self._entries(), context)

    def remember_forms(self, context: str, forms: dict) -> None:
        """Keep the CPU product forms a process chose (``cpu_kernels.keep_new_forms``) beside those kept before."""
        name, entries = self._forms_name(context), self._entries()
        kept = self._forms(entries, context)
        for product, choices in forms.items():
            kept[product] = {**kept.get(product, {}), **choices}
        entries[name] = {"forms": kept, "written": time.time()}
        self._write(entries)

    def _write(self, entries: dict) -> None:
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
                              "file to silence this", stacklevel=3)
                self._warned = True

    @staticmethod
    def _entry_name(context: str, key: TimingKey) -> str:
        return json.dumps([context, list(key)])

    @staticmethod
    def _forms_name(context: str) -> str:
        return json.dumps([context, "product forms"])

    @classmethod
    def _forms(cls, entries: dict, context: str) -> dict:
        entry = entries.get(cls._forms_name(context))
        forms = entry.get("forms") if isinstance(entry, dict) else None
        return forms if isinstance(forms, dict) else {}

    def _entries(self) -> dict:
        try:
            entries = json.loads(self.path.read_text()).get("entries", {})
            return entries if isinstance(entries, dict) else {}
        except (OSError, ValueError, AttributeError):  # (none yet, or unreadable: timed afresh)
            return {}


TIMINGS_FILE = "draft_timings.json"


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
    """``draft="auto"``'s choice for one artifact: the candidates, the timings they were judged by, and what each
    draft really emitted in this process."""

    def __init__(self, config, store: TimingStore | None = None):
        self.config = config
        self.store = store  # verify-pass timings kept between processes (None: timed in every process)
        self.timings: dict = {}  # (TimingKey, tree) -> Timing of one verify pass
        self.untrusted: set = set()  # keys whose timings stayed implausible: used here, never kept, auto falls back
        self.recalled: set = set()  # keys whose timings came from the store (re-checked once by ``update``)
        self.not_recalled: set = set()  # keys whose kept timings the loop disagreed with: timed afresh, then replaced
        self.warm: set = set()  # keys whose rounds have run in this process (a process's first rounds run cold)
        self.observed: dict = {}  # tree -> [tokens emitted, rounds] in this process
        self.chosen: dict = {}  # key -> the draft last chosen for it
        self.rates: dict = {}  # key -> {candidate: the rate it was chosen by}, as last chosen
        self._chosen_at: dict = {}  # key -> (candidates, timings version, rounds observed) when it was last chosen
        self._timings_version = 0
        self._measured = None
        self._auto = None
        self._default = None

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
        spec = (self.config.tree, self.config.medusa_num_heads)
        if self._default is None or self._default[0] != spec:  # (kept: auto asks on every call)
            tree = DraftTree.from_paths(spec[0]) if spec[0] else DraftTree.chain(spec[1])
            self._default = (spec, tree)
        return self._default[1]

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
        spec = (self.config.tree, self.config.medusa_num_heads)
        if self._auto is None or self._auto[0] != spec:  # (kept: every call asks, twice)
            self._auto = (spec, self._auto_candidates())
        return self._auto[1]

    def _auto_candidates(self) -> list[DraftTree]:
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

    def contenders(self, candidates: list[DraftTree]) -> list[DraftTree]:
        """The candidates worth timing: plain greedy and every draft expected to add a token."""
        return [t for t in candidates if t.num_nodes == 1 or self.expected_tokens(t) > 1.0 + 1e-6]

    def cache_slack(self, candidates: list[DraftTree]) -> int:
        """Cache slots a call reserves past its own tokens: twice the largest tree it or ``auto`` may draft. Every
        call of this artifact then asks the same capacity of the fixed-shape cache pool whatever its draft, so plain
        greedy and drafted calls share one cache and keep each other's captured (compiled) rounds."""
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

    # ------------------------------------------------------------------ timings: asked for, reported
    def to_time(self, trees: list[DraftTree], key: TimingKey, context: str | None = None) -> list[DraftTree]:
        """Those of ``trees`` the caller must time under ``key`` (and ``report``): the ones this process has not timed,
        unless the store kept them all for ``context`` (None: nothing is kept, a stand-in drafter)."""
        untimed = [tree for tree in trees if (key, tree) not in self.timings]
        if not untimed or context is None or self.store is None or key in self.not_recalled:
            return untimed
        kept = self.store.recall(context, key, untimed)
        if kept is None or implausible({**self._kept(key), **kept}):
            return untimed
        self.timings.update({(key, tree): timing for tree, timing in kept.items()})
        self.recalled.add(key)
        self._timings_version += 1
        return []

    def report(self, key: TimingKey, passes: dict, context: str | None = None, last_try: bool = True) -> bool:
        """Take the timed passes (tree -> seconds of each pass) under ``key``. Plausible ones are kept, here and in
        the store; implausible ones (``implausible``) are dropped so that the caller times them again, or on its
        ``last_try`` are used by this process only and make ``auto`` fall back to the default draft for ``key``.
        Returns whether they were plausible."""
        timings = {tree: judged(seconds) for tree, seconds in passes.items()}
        if implausible({**self._kept(key), **timings}):
            if not last_try:
                return False
            self.untrusted.add(key)
        self.timings.update({(key, tree): timing for tree, timing in timings.items()})
        self._timings_version += 1
        if key not in self.untrusted and context is not None and self.store is not None:
            self.store.remember(context, key, timings)
        return key not in self.untrusted

    def _kept(self, key: TimingKey) -> dict:
        return {tree: timing for (k, tree), timing in self.timings.items() if k == key}

    def seconds(self, key: TimingKey, tree: DraftTree) -> float:
        return self.timings[key, tree].seconds

    # ------------------------------------------------------------------ choosing
    def choose(self, candidates: list[DraftTree], key: TimingKey, credited=frozenset()) -> DraftTree:
        """The candidate with the most expected tokens per second of verify time under ``key`` (each timed first:
        ``to_time``). With ``key.compiled`` the choice is among the ``shortlist`` of the stand-in (uncompiled) timings,
        timed again by the loop's own compiled rounds. A tree in ``credited`` (a CPU chain whose stop is at least
        ``CREDITED_CHAIN_STOP``) has its rate credited by ``STOPPING_CHAIN_CREDIT``. On a CPU, of candidates within
        ``SMALLER_DRAFT_MARGIN`` of the best, the smallest; and the draft last chosen for ``key`` stays unless another
        promises ``SWITCH_MARGIN`` more. Timings that stayed implausible: the artifact's default draft."""
        asked, candidates = tuple(candidates), self.contenders(candidates)
        if len(candidates) == 1:
            return candidates[0]  # no draft is expected to add a token: nothing to time
        stand_in = key._replace(compiled=False)
        if key.compiled:
            candidates = self.shortlist(candidates, stand_in)

        def rate(tree):
            credit = STOPPING_CHAIN_CREDIT if tree in credited else 1.0
            return credit * self.expected_tokens(tree) / self.seconds(key, tree)

        rates = self.rates[key] = {tree: rate(tree) for tree in candidates}
        top = max(rates.values())
        margin = SMALLER_DRAFT_MARGIN if key.device == "cpu" else 0.0
        best = min((tree for tree in candidates if rates[tree] >= top / (1 + margin)), key=lambda tree: tree.num_nodes)
        last = self.chosen.get(key)
        if last in candidates and rates[best] < (1 + SWITCH_MARGIN) * rates[last]:
            best = last
        self.chosen[key] = self.default_tree() if {key, stand_in} & self.untrusted else best
        self._chosen_at[key] = (asked, self._timings_version, self._rounds_observed())
        return self.chosen[key]

    def settled(self, candidates: list[DraftTree], key: TimingKey) -> DraftTree | None:
        """The draft last chosen for ``key`` from these candidates while nothing it was chosen by changed: no timing,
        and fewer than ``RESCORE_ROUNDS`` rounds observed since; else None (``choose`` scores them again)."""
        at = self._chosen_at.get(key)
        if at is None or at[1] != self._timings_version or self._rounds_observed() - at[2] >= RESCORE_ROUNDS:
            return None
        return self.chosen[key] if at[0] == tuple(candidates) else None

    def _rounds_observed(self) -> int:
        return sum(rounds for _, rounds in self.observed.values())

    def shortlist(self, candidates: list[DraftTree], key: TimingKey) -> list[DraftTree]:
        """The candidates timed by the loop's compiled runners already, else the best ``REFINED_CANDIDATES`` by their
        rate under ``key`` (the stand-in) within ``REFINED_SHARE`` of the best."""
        compiled = key._replace(compiled=True)
        done = [tree for tree in candidates if (compiled, tree) in self.timings]
        if done:
            return done
        rates = {tree: self.expected_tokens(tree) / self.seconds(key, tree) for tree in candidates}
        ranked = sorted(candidates, key=rates.get, reverse=True)[:REFINED_CANDIDATES]
        return [tree for tree in ranked if rates[tree] >= REFINED_SHARE * rates[ranked[0]]]

    def chain_stop(self, chain: DraftTree, key: TimingKey) -> float:
        """The joint draft probability below which ``chain`` stops drafting (``PathDrafter``) for ``key``, from the
        timed passes of ``chain_stop_drafts(chain)`` (see ``CHAIN_STOP_SCALE``); 0 (the full chain) where there is
        nothing to stop before or the timings stayed implausible."""
        if chain.depth < 2 or key in self.untrusted:
            return 0.0
        first = DraftTree.chain(1)
        per_depth = (self.seconds(key, chain) - self.seconds(key, first)) / (chain.depth - 1)
        per_token = self.seconds(key, chain) / self.expected_tokens(chain)
        return min(max(CHAIN_STOP_SCALE * per_depth / per_token, 0.0), CHAIN_STOP_MAX)

    @staticmethod
    def chain_stop_drafts(chain: DraftTree) -> list[DraftTree]:
        """The drafts ``chain_stop`` needs timed (every pass, none left out as slow)."""
        return [DraftTree.chain(1), chain] if chain.depth >= 2 else []

    def measurements(self) -> list[dict]:
        """What ``auto`` measured and chose, for a benchmark's record: per timing key, each candidate's verify pass
        (ms) and the spread of its timed passes, its expected tokens per round and the rate it was chosen by, and
        whether the timings were plausible (where not, the default draft ran)."""
        return [{**key._asdict(), "candidates": [
                    {"draft": tree.name, "nodes": tree.num_nodes - 1, "verify_ms": 1e3 * self.seconds(key, tree),
                     "spread": self.timings[key, tree].spread, "expected_tokens": self.expected_tokens(tree),
                     "rate": rate, "chosen": tree == self.chosen[key]}
                    for tree, rate in rates.items()], "plausible": not {key, key._replace(compiled=False)} & self.untrusted}
                for key, rates in self.rates.items()]

    # ------------------------------------------------------------------ after each call
    def update(self, tree: DraftTree, stats: MedusaStats, key: TimingKey | None = None,
               rounds_seconds: float | None = None) -> None:
        """What a call's rounds of ``tree`` did: the tokens they emitted (``auto`` adapts when the audio is harder or
        easier than the artifact's own measurement) and, under ``key``, the seconds they took. Where ``tree``'s timing
        came from the store and the loop's seconds per round differ from it by more than ``RECHECK_FACTOR`` either way,
        the key's timings are forgotten: the next call times them afresh and replaces the kept entry (once a
        process). A process's first rounds under a key are not compared: they run cold (first kernels, products
        timed as the loop runs them), often twice as slow as later ones."""
        if tree.num_nodes > 1 and stats.row_rounds:
            emitted, rounds = self.observed.get(tree, (0, 0))
            self.observed[tree] = (emitted + stats.emitted_tokens, rounds + stats.row_rounds)
        if key not in self.recalled or (key, tree) not in self.timings or not stats.rounds or not rounds_seconds:
            return
        if key not in self.warm:
            self.warm.add(key)
            return
        ratio = rounds_seconds / stats.rounds / self.seconds(key, tree)
        if not 1 / RECHECK_FACTOR <= ratio <= RECHECK_FACTOR:
            self.forget(key)

    def forget(self, key: TimingKey) -> None:
        """Drop ``key``'s timings (and its stand-in's): timed afresh by the next call, not recalled from the store."""
        keys = {key, key._replace(compiled=False)}
        self.timings = {(k, tree): t for (k, tree), t in self.timings.items() if k not in keys}
        self.recalled -= keys
        self.not_recalled |= keys
        self._timings_version += 1
