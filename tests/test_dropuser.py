"""Issue 51, item 2: the pieces a fork server and a case child use to become the case user
(harness.isolation.dropuser), run for real where the tests have root. The end-to-end run as
`--spmd-case-user=nobody` is tests/test_hostile_bodies.py's (it needs a Python other users can read)."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys

import pytest

from harness.isolation.protocol import XLA_DUMP_ROOT_ENV
from tests.conftest import REPO

pytestmark = [
    pytest.mark.selftest,
    pytest.mark.skipif(os.geteuid() != 0, reason="only root can become another user"),
]

DROPS = """
import ctypes, json, os, sys
from harness.isolation import dropuser
uid, gid = int(sys.argv[1]), int(sys.argv[2])
home = dropuser.make_home(uid, gid)  # as the keeper does: before the child is the user
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    dropuser.become(uid, gid)
    dropuser.not_dumpable()
    dropuser.become(uid, gid)  # a forked child of a dropped server: already that user, no error
    try:
        os.setuid(0)
        regained = True
    except PermissionError:
        regained = False
    seen = {"uid": os.getuid(), "euid": os.geteuid(), "groups": os.getgroups(), "regained": regained,
            "dumpable": ctypes.CDLL(None).prctl(3, 0, 0, 0, 0), "home_writable": os.access(home, os.W_OK),
            "home_owner": os.stat(home).st_uid}
    os.write(write, json.dumps(seen).encode())
    os._exit(0)
os.close(write)
os.waitpid(pid, 0)
seen = json.loads(os.read(read, 4096))
dropuser.remove_home(home)
seen["home_left"] = os.path.exists(home)
print(json.dumps(seen))
"""


def test_a_dropped_process_is_the_case_user_for_good_not_dumpable_with_a_home_removed_after():
    nobody = pwd.getpwnam("nobody")
    proc = subprocess.run(
        [sys.executable, "-c", DROPS, str(nobody.pw_uid), str(nobody.pw_gid)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        # Not the dump root of the run this test runs in (`pytest` from the root runs cases/ first,
        # and their run's root is root's, 0700): a real run gives its root to the case user
        # (harness.run.caseuser.give_dump_root); here HOME goes to the system's temporary folder.
        env={k: v for k, v in os.environ.items() if k != XLA_DUMP_ROOT_ENV},
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen == {
        "uid": nobody.pw_uid,
        "euid": nobody.pw_uid,
        "groups": [],
        "regained": False,
        "dumpable": 0,
        "home_writable": True,
        "home_owner": nobody.pw_uid,
        "home_left": False,
    }, seen
