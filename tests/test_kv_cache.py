"""The cache's write as compiled rounds run it (one index_put_ into the whole cache) equals the eager scatter."""

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
