"""Clocks: what a verify pass, a compiled round and a call's phases cost on this device.

Plain functions the model uses to time ``draft="auto"``'s candidates for ``DraftPolicy``, which only asks for the
trees to time and judges what comes back; it never runs anything itself.
"""

from __future__ import annotations

import functools
import statistics
import time

import torch

try:
    from .medusa_decoding import verify_round
    from .medusa_fast import capture_cuda_graph
except ImportError:
    from medusa_decoding import verify_round
    from medusa_fast import capture_cuda_graph

TIMED_PASSES = 9  # verify passes timed per candidate (after one warm-up), taken in turn across the candidates
KEPT_AFTER_FIRST_TURN = 0.75  # candidates timed on after the warm-up turn: within this share of the best's rate
TIMING_TRIES = 2  # times a call times its untimed drafts before it takes an implausible measurement as it is
CPU_CACHE_EVICTION_BYTES = 64 * 2**20  # read before each timed pass on a CPU (see evict_cpu_caches)


def time_in_turn(timers: dict, worth: dict, drop_slow: bool = True) -> dict:
    """Each tree's timed passes (seconds), ``timers[tree]()`` timing one pass: a warm-up turn (first uses build copies
    and caches), then (``drop_slow``) a turn that leaves out the trees promising less than ``KEPT_AFTER_FIRST_TURN``
    of the best one's tokens per second (``worth[tree]``: expected tokens per round), whose slow passes would only
    cost time; the rest go on for ``TIMED_PASSES`` turns in all. Taken in turn, a slow moment of the machine falls
    on every tree alike."""
    for timer in timers.values():
        timer()
    seconds = {tree: [timer()] for tree, timer in timers.items()}
    best = max(worth[tree] / seconds[tree][0] for tree in timers)
    kept = [tree for tree in timers if not drop_slow or worth[tree] / seconds[tree][0] >= KEPT_AFTER_FIRST_TURN * best]
    for _ in range(TIMED_PASSES - 1):
        for tree in kept:
            seconds[tree].append(timers[tree]())
    return seconds


def time_drafts(policy, trees: list, key, context: str | None, timer, drop_slow: bool = True) -> None:
    """Time the trees ``policy`` asks for under ``key`` (``timer(tree)``: a function timing one pass) and report their
    passes to it; passes it refuses as implausible are timed again, up to ``TIMING_TRIES`` times in all."""
    for attempt in range(TIMING_TRIES):
        untimed = policy.to_time(trees, key, context)
        if not untimed:
            return
        worth = {tree: policy.expected_tokens(tree) for tree in untimed}
        passes = time_in_turn({tree: timer(tree) for tree in untimed}, worth, drop_slow)
        policy.report(key, passes, context, last_try=attempt + 1 == TIMING_TRIES)


def verify_pass_timer(backbone, drafter, rules, state, tree, captured: bool):
    """A function that runs one round for ``tree`` on the prefilled ``state`` (``verify_round``: drafting, the decoder
    pass, the base's next tokens, acceptance and the accepted path's compaction, as the loop runs it; the loop's own
    bookkeeping, the same for every draft, is left out) and returns its seconds; it writes past the valid cache slots
    only, so the state is unchanged. Captured: a CUDA graph's replay; on a CPU each pass starts from caches emptied
    of its weights, as every round of the loop does."""
    device = state.lengths.device
    tt = tree.tensors(device)
    upto = state.cache.capacity if captured else min(int(state.lengths.max()) + tree.num_nodes, state.cache.capacity)
    num_generated = torch.ones_like(state.lengths)

    def verify_pass():
        verify_round(backbone, drafter, rules, state, tree, tt, num_generated, upto)

    if captured:
        return GraphPassTimer(verify_pass)

    def timed_pass():
        if device.type == "cpu":
            evict_cpu_caches()
        return wall_seconds(verify_pass, device)

    return timed_pass


def loop_round_timer(runner, state):
    """A function that runs one of ``runner``'s (compiled) rounds as the loop will, the host's read of the result
    included, and returns its seconds; the runner's state is put back after each round."""
    restore, active = runner.snapshot(), [True] * state.next_token.shape[0]

    def timed_round():
        seconds = wall_seconds(lambda: runner.step(active), state.lengths.device)
        restore()
        return seconds

    return timed_round


class GraphPassTimer:
    """A verify pass captured as a CUDA graph and timed by its replays, one graph at a time: the first call captures
    it, times the replays (CUDA events: steady enough without interleaving) and frees it, later calls return the same
    median. (Captured side by side, a graph replayed after another one's capture could hit a device-side assert.)"""

    def __init__(self, verify_pass):
        self.verify_pass, self.seconds = verify_pass, None

    def __call__(self) -> float:
        if self.seconds is None:
            graph = capture_cuda_graph(self.verify_pass)
            self.seconds = statistics.median([graph_seconds(graph) for _ in range(TIMED_PASSES + 1)][1:])
            del graph
        return self.seconds


class PhaseTimer:
    """Wall-clock seconds of the phases of one call (device-synchronised), only when asked for: the synchronisation
    would otherwise cost a little on every call."""

    def __init__(self, device, enabled: bool):
        self.device, self.enabled, self.laps = device, enabled, {}
        self._last = self._now() if enabled else None

    def _now(self) -> float:
        synchronize(self.device)
        return time.perf_counter()

    def lap(self, name: str):
        if self.enabled:
            now = self._now()
            self.laps[name] = self.laps.get(name, 0.0) + now - self._last  # summed over a call's windows
            self._last = now


@functools.lru_cache(maxsize=1)
def _eviction_buffer() -> torch.Tensor:
    return torch.ones(CPU_CACHE_EVICTION_BYTES // 4)


def evict_cpu_caches() -> None:
    """Read a buffer larger than a processor's last-level cache, so that the next pass finds its weights in memory,
    not in cache, as every round of a decode loop does (a round reads more than the cache holds; timed warm, a pass
    costs less than in the loop, and more so the larger its draft)."""
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
