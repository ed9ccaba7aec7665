"""Lab 12, beyond one server: a router that finds the cache, a slower tier for evicted blocks, prefill and decode apart."""
