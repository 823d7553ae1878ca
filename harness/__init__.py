"""SPMD regression harness for torch_xla.

The pytest plugin lives in `harness.plugin`; case bodies run in child processes started by
`harness.isolation.child_process`; nothing in this package imports torch or torch_xla at import time except
`harness.xla`, which only child processes import.
"""
