"""The pytest side of each judge of a case, in the order they judge it: the known-bug registry's
(registrycheck), the sharding baseline's (shardingcheck, with its file: baseline), the cost
baseline's (costcheck; its file, harness.costbaseline, is public), and the base build's run
(basecheck, with the comparison itself: basecompare)."""
