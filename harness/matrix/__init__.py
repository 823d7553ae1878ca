"""Release detection matrix: run the SPMD suite against several torch_xla releases (or wheel
builds), each in its own cached virtual environment, and tabulate registry entry x release.

    python -m harness.matrix --releases 2.6.0,2.7.0,2.9.0
    python -m harness.matrix compare --good DIR --bad DIR

Modules, one job each:
    errors    typed errors and the exit code each maps to
    procs     run one command with its output in a log file, a heartbeat and a timeout
    envs      build (or reuse) one venv per column behind a small Installer interface
    columns   what the command line asked for: releases, wheel folders, existing venvs/results
    suite     run `pytest -m spmd` inside one venv and read its CaseRecords
    measure   the plan said up front, the disk check, then build/reuse every env and run each suite
    table     registry x column: observed verdict, registry's prediction, agreement
    render    the table as Markdown and JSON
    compare   which entries changed verdict between a good and a bad column (bisect help)
"""
