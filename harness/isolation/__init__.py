"""The isolation wing: everything that starts, talks to and contains case-body child processes.

The parent side: `case` (SpmdRunner, one case's run), `pool` (warm children), `child_process`
(ChildProcess, the parent's handle on one child), `forkclient`/`runservers` (fork servers of a
run), `backend` (the interface of the backend they start children for). The child side:
`forkserver` (`python -m harness.isolation.server.forkserver`), `child` (`python -m
harness.isolation.child.main`), `context` (what a body gets). Shared by both: `protocol` (the wire
format between parent and child), `forkwire` (between a fork server and its clients), `processes`
(starting, ending, describing processes), `logtail` (the end of a log, bounded), `evidence` (what
a crash left behind). Nothing here imports torch at import time.
"""
