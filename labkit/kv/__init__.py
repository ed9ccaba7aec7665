"""KV caches: a contiguous per-sequence cache and the paged block pool."""
