"""Oracles that need no baseline: a sharded program must compute what the same program computes
eagerly on the CPU (differential), whatever sharding it was given.

    program.py    the program description (plain JSON data), its checks and its shape rules
    generate.py   hypothesis strategies that draw meshes, partition specs and programs
    interpret.py  child side: run a program eagerly on the CPU and with mark_sharding on XLA
    compare.py    child side: the stated tolerance, a verdict per program
    runner.py     parent side: many programs per child; a crash is charged to its program
    repro.py      a finding as a standalone Python script
    faults.py     child side: faults injected into torch_xla to show the oracle can fail

The parent (pytest) imports program/generate/runner/repro only; interpret, compare and faults
import torch and run in case children.
"""
