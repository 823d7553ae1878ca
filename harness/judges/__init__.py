"""The pytest side of each judge of a case: the sharding and the cost baselines, the base build's
run (--spmd-compare), and the baselines' file formats they hold a case to (the cost baseline's
format is public: harness.costbaseline)."""
