"""The cache's write and path compaction as compiled rounds run them (index_put_ into the whole cache) equal the
eager scatters."""

import torch

from kv_cache import StaticKVCache


def test_compiled_cache_write_equals_the_eager_write():
    torch.manual_seed(0)
    eager, compiled = (StaticKVCache(3, 2, 4, 16, 8, torch.float32, "cpu") for _ in range(2))
    for cache in (eager, compiled):
        cache.keys.normal_(), cache.values.zero_()
    compiled.keys.copy_(eager.keys)
    write = torch.compile(lambda layer, slots, k, v: compiled.write(layer, slots, k, v), dynamic=False)
    for layer, slots in ((1, [[3, 4, 9], [0, 1, 2]]), (2, [[15, 0, 7], [6, 8, 10]])):
        slots = torch.tensor(slots)
        keys, values = torch.randn(2, 4, 3, 8), torch.randn(2, 4, 3, 8)
        eager.write(layer, slots, keys, values)
        write(layer, slots, keys, values)
    assert torch.equal(eager.keys, compiled.keys) and torch.equal(eager.values, compiled.values)
    assert eager.values[1].abs().sum() > 0 and eager.values[0].abs().sum() == 0


def test_compiled_path_compaction_equals_the_eager_move():
    """Accepted tree paths (node indices rising, sources overlapping destinations) compacted in every layer."""
    torch.manual_seed(0)
    eager, compiled = (StaticKVCache(3, 2, 2, 40, 4, torch.float32, "cpu") for _ in range(2))
    eager.keys.normal_()
    eager.values.normal_()
    compiled.keys.copy_(eager.keys)
    compiled.values.copy_(eager.values)
    lengths = torch.tensor([5, 11])
    nodes = torch.tensor([[0, 2, 5, 9], [0, 1, 3, 4]])
    src, dst = lengths[:, None] + nodes, lengths[:, None] + torch.arange(4)[None, :]
    before = eager.keys.clone()
    eager.move(src, dst)
    torch.compile(lambda s, d: compiled.move(s, d), dynamic=False, fullgraph=True)(src, dst)
    assert torch.equal(eager.keys, compiled.keys) and torch.equal(eager.values, compiled.values)
    assert torch.equal(eager.keys[:, 0, :, 5 + 2], before[:, 0, :, 5 + 5])  # (row 0: node 5 now at offset 2)
