"""The fork server (`python -m harness.isolation.server.forkserver`): imports torch_xla once, forks a
keeper and a child per request; under --spmd-case-user the keeper drops to the case user
(harness.isolation.system.dropuser) and puts the child in namespaces of its own (casens).
"""
