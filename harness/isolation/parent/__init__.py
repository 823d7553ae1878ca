"""The parent side, in the pytest process: a case run (case.SpmdRunner), the handle on one child
(child_process), the pool of children, the fork servers' clients (forkclient, runservers), what a
verdict's observations must be (observations) and what a dead child's log says (evidence).
"""
