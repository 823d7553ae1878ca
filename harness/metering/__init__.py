"""The parts of the child-side meter (harness.stepcosts, the public face case bodies use): the
process's native heap and resident set per step (nativememory), where a step's kept native memory
was allocated (nativestacks, memray), where kept XLA tensors were made (creationsites), and the
calls of torch_xla's SPMD API per step (spmdcalls). Like harness.costs they import neither torch nor
torch_xla at module level; the meter imports them in the child."""
