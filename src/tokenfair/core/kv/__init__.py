"""Paged KV memory in three owners, put together by `KVCacheManager` (kv_cache.py):

- `BlockPool` (block_pool.py): the device blocks, who holds each (reference counts, and
  how many distinct blocks each tenant holds), which are free, and the eviction order
  of the idle cached ones;
- `PrefixIndex` (prefix_index.py): the chain hashes of full blocks, which block holds
  which hash, and which hashes a waiting request wants kept;
- `SwapArea` (swap_area.py): the smaller pool in host memory that swapped requests
  wait in.
"""
