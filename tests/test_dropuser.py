"""Issue 51, item 2: the pieces a fork server and a case child use to become the case user
(harness.isolation.system.dropuser), run for real where the tests have root. The end-to-end run as
`--spmd-case-user=nobody` is tests/test_hostile_bodies.py's (it needs a Python other users can read)."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys

import pytest

from harness.isolation.wire.protocol import XLA_DUMP_ROOT_ENV
from tests.conftest import REPO

pytestmark = [
    pytest.mark.selftest,
    pytest.mark.skipif(os.geteuid() != 0, reason="only root can become another user"),
]

DROPS = """
import ctypes, json, os, sys
from harness.isolation.system import dropuser
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


def _run_as_root_script(script: str, user: pwd.struct_passwd, *args: str) -> subprocess.CompletedProcess[str]:
    """`script` in a new Python, given the user's uid and gid (and `args`); it drops to them itself."""
    return subprocess.run(
        [sys.executable, "-c", script, str(user.pw_uid), str(user.pw_gid), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        # Not the dump root of the run this test runs in (`pytest` from the root runs cases/ first,
        # and their run's root is root's, 0700): a real run gives its root to the case user
        # (harness.run.caseuser.give_dump_root); here HOME goes to the system's temporary folder.
        env={k: v for k, v in os.environ.items() if k != XLA_DUMP_ROOT_ENV},
    )


def test_a_dropped_process_is_the_case_user_for_good_not_dumpable_with_a_home_removed_after():
    nobody = pwd.getpwnam("nobody")
    proc = _run_as_root_script(DROPS, nobody)
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


ATTACK = """
import errno, json, os, pwd, signal, sys, tempfile, time
from harness.isolation.server import casens
from harness.isolation.system import dropuser
isolate = sys.argv[3] == "isolate"
uid, gid = int(sys.argv[1]), int(sys.argv[2])
report_read, report_write = os.pipe()
server = os.fork()
if server == 0:  # as a fork server dropped to the case user; each case has a keeper
    dropuser.become(uid, gid)

    def case(body, home):
        if isolate:
            casens.enter()
            init, pid, status_read = casens.start(home, body)
            return pid
        pid = os.fork()
        if pid == 0:
            body()
        return pid

    def victim():
        dropuser.not_dumpable()
        with open(os.path.join(os.environ["HOME"], "secret"), "w") as fh:
            fh.write("victim's secret")
        time.sleep(5)  # the attacker starts after 1 s
        os._exit(0)

    def start_keeper(body, home):
        pid_read, pid_write = os.pipe()
        if os.fork() == 0:  # the keeper
            os.environ["HOME"] = home
            os.write(pid_write, str(case(body, home)).encode())
            os.wait()
            os._exit(0)
        return int(os.read(pid_read, 32))

    victim_home = dropuser.make_home(uid, gid)
    victim_pid = start_keeper(victim, victim_home)
    time.sleep(1)  # the victim wrote its secret

    def attacker():
        reached = {}
        try:
            os.kill(victim_pid, signal.SIGSTOP)
            os.kill(victim_pid, signal.SIGCONT)
            reached["signal"] = "done"
        except OSError as exc:
            reached["signal"] = errno.errorcode[exc.errno]
        try:
            reached["home"] = open(os.path.join(victim_home, "secret")).read()
        except OSError as exc:
            reached["home"] = errno.errorcode[exc.errno]
        reached["processes seen"] = len([name for name in os.listdir("/proc") if name.isdigit()])
        os.write(report_write, json.dumps(reached).encode())
        os._exit(0)

    attacker_home = dropuser.make_home(uid, gid)
    start_keeper(attacker, attacker_home)
    os.close(report_write)
    for _ in range(2):  # the keepers
        os.wait()
    for home in (victim_home, attacker_home):
        dropuser.remove_home(home)
    os._exit(0)
os.close(report_write)
print(os.read(report_read, 4096).decode())
os.waitpid(server, 0)
"""


@pytest.mark.parametrize("isolate", ["isolate", "shared"])
def test_a_case_in_namespaces_of_its_own_cannot_signal_another_nor_read_its_home(isolate):
    """#51 item 2 at the level of the mechanism (harness.isolation.server.casens): two cases of one case
    user, as a dropped fork server's keepers start them. Without namespaces ("shared": the design
    before) the attacker SIGSTOPs the victim and reads its HOME; with them it reaches neither."""
    from harness.run import caseuser

    nobody = pwd.getpwnam("nobody")
    if isolate == "isolate" and caseuser.namespaces_refused(nobody.pw_uid, nobody.pw_gid):
        pytest.skip("the kernel refuses namespaces to the case user")
    proc = _run_as_root_script(ATTACK, nobody, isolate)
    assert proc.returncode == 0, proc.stderr
    reached = json.loads(proc.stdout)
    if isolate == "shared":
        assert reached["signal"] == "done" and reached["home"] == "victim's secret", reached
    else:
        assert reached == {"signal": "ESRCH", "home": "ENOENT", "processes seen": 2}, reached
